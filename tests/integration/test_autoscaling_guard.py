"""The KV-path guard of autoscaling and the operator's transfer gauges, on the real control
plane with the real operator process: the test plays the prober pod's sidecar (it answers
the operator's probe request on the pod, as test_transfer_status.py does) and the HPA (it
writes the decode scale target's /scale).

What must hold: pdd_kv_transfer_gbps and pdd_kv_transfer_verified on the operator's metrics
endpoint follow the latest answer and go with the deployment; while the path is degraded
a decode scale-up is held at the count that runs, with ScalingHeld saying why; scaling down
goes through; once a probe verifies the path again the held ask runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.pdd_objects import condition, get_pdd
from helpers.waits import wait_for
from pdd_operator.api.names import instance_id

GROUP, VERSION, PLURAL, SCALERS = "pdd.dev", "v1alpha1", "pddeployments", "pddrolescalers"
REQUEST, RESULT = "pdd.dev/probe-request", "pdd.dev/probe-result"
NAME, PROBER = "guarded", "guarded-prefill-0"
PATH = "VRAM->VRAM"
AUTOSCALING = {
    "decode": {"minReplicas": 0, "maxReplicas": 6},
    "prefill": {"minReplicas": 1, "maxReplicas": 3},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def scale_decode(api: client.ApiClient, ns: str, replicas: int) -> None:
    custom(api).patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, SCALERS, f"{NAME}-decode", {"spec": {"replicas": replicas}}
    )


def running(api: client.ApiClient, ns: str, prefill: int, decode: int) -> dict[str, Any] | None:
    body = get_pdd(api, ns, NAME)
    status = body.get("status", {})
    want = (f"{prefill}/{prefill}", f"{decode}/{decode}")
    if (status.get("prefillReplicas"), status.get("decodeReplicas")) != want:
        return None
    return body if condition(body, "Ready").get("status") == "True" else None


def statefulset_replicas(api: client.ApiClient, ns: str) -> tuple[int, int]:
    apps = client.AppsV1Api(api)
    return tuple(  # type: ignore[return-value]
        apps.read_namespaced_stateful_set(f"{NAME}-{role}", ns).spec.replicas
        for role in ("prefill", "decode")
    )


def answer(core: client.CoreV1Api, ns: str, **result: Any) -> None:
    """What the prober pod's sidecar writes back after a probe: its result, on its own pod."""
    pod = core.read_namespaced_pod(PROBER, ns)
    request_id = (pod.metadata.annotations or {}).get(REQUEST, "")
    doc = {"request_id": request_id, "path": PATH, "bytes": 1 << 30, "blocks": 256,
           "verified": True, "ucx_net_devices": "mlx5_0:1", "expected_gbps": 50.0,
           "started_at": "2026-12-01T03:00:00Z", **result}  # fmt: skip
    core.patch_namespaced_pod(PROBER, ns, {"metadata": {"annotations": {RESULT: json.dumps(doc)}}})


def gauges(operator: OperatorProcess, ns: str) -> dict[str, tuple[dict[str, str], float]]:
    """This deployment's series of the two transfer gauges, by metric name."""
    found = {}
    for name in ("pdd_kv_transfer_gbps", "pdd_kv_transfer_verified"):
        for labels, value in operator.samples(name):
            if labels.get("namespace") == ns and labels.get("deployment") == NAME:
                assert name not in found, f"two series of {name}: one expected per deployment"
                found[name] = (labels, value)
    return found


def test_a_degraded_kv_path_holds_decode_scale_ups_and_the_gauges_say_so(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    body = pdd_body(
        NAME,
        ns,
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 2, "gpusPerInstance": 1},
        router={"enabled": False},
        autoscaling=AUTOSCALING,
        kvTransfer={"verification": {"minFraction": 0.5}},
    )
    custom(api_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    ready = wait_for(lambda: running(api_client, ns, 1, 2), 120, what="1P/2D Ready")
    domain = ready["status"]["placement"]["domain"]
    assert domain, ready["status"]["placement"]
    wait_for(
        lambda: (core.read_namespaced_pod(PROBER, ns).metadata.annotations or {}).get(REQUEST),
        90,
        what="the operator's probe request on the prober pod",
    )
    assert gauges(operator, ns) == {}  # nothing measured yet: no series to trust

    # Verified over RDMA: the gauges carry the figure, the path and the slice's domain.
    answer(core, ns, transport="rdma", gbps=46.2)
    labels = {
        "namespace": ns,
        "deployment": NAME,
        "deployment_id": instance_id(NAME),
        "path": PATH,
        "domain": domain,
    }
    verified = {
        "pdd_kv_transfer_gbps": (labels, 46.2),
        "pdd_kv_transfer_verified": (labels, 1.0),
    }
    wait_for(lambda: gauges(operator, ns) == verified, 30, what="the verified gauges")
    assert condition(get_pdd(api_client, ns, NAME), "ScalingHeld")["status"] == "False"

    # Fallen back to TCP: verified 0, and a decode scale-up is held at what runs.
    answer(core, ns, transport="tcp", gbps=0.5)
    wait_for(
        lambda: (
            condition(get_pdd(api_client, ns, NAME), "KVTransferVerified").get("status") == "False"
        ),
        30,
        what="KVTransferVerified=False",
    )
    degraded = {
        "pdd_kv_transfer_gbps": (labels, 0.5),
        "pdd_kv_transfer_verified": (labels, 0.0),
    }
    wait_for(lambda: gauges(operator, ns) == degraded, 30, what="the degraded gauges")
    scale_decode(api_client, ns, 6)
    held = wait_for(
        lambda: (
            (c := condition(get_pdd(api_client, ns, NAME), "ScalingHeld")).get("status") == "True"
            and c
        ),
        30,
        what="ScalingHeld=True",
    )
    assert held["reason"] == "KVPathDegraded"
    assert held["message"].startswith(
        "decode scale-up from 2 to 6 held: the KV transfer path is degraded "
        "(KVTransferVerified=False, TCPFallback: 0.5 GB/s measured, 50 GB/s expected)"
    )
    assert "spec.autoscaling.kvTransferGuard: false" in held["message"]
    time.sleep(3)  # passes that would scale up have run by now (resync every 2 s)
    assert statefulset_replicas(api_client, ns) == (1, 2)
    target = custom(api_client).get_namespaced_custom_object(
        GROUP, VERSION, ns, SCALERS, f"{NAME}-decode"
    )
    assert (target["spec"]["replicas"], target["status"]["replicas"]) == (6, 2)
    assert target["status"]["message"].startswith("asked for 6, runs 2: decode does not scale")
    events = wait_for(
        lambda: [e for e in core.list_namespaced_event(ns).items if e.reason == "KVPathDegraded"],
        30,
        what="the KVPathDegraded event",
    )
    assert events[0].type == "Warning"

    # Scaling down is never held.
    scale_decode(api_client, ns, 1)
    wait_for(lambda: running(api_client, ns, 1, 1), 120, what="1P/1D Ready")
    assert condition(get_pdd(api_client, ns, NAME), "ScalingHeld")["status"] == "False"

    # Held again, then the path is verified: the ask goes through.
    scale_decode(api_client, ns, 4)
    wait_for(
        lambda: condition(get_pdd(api_client, ns, NAME), "ScalingHeld").get("status") == "True",
        30,
        what="held again",
    )
    assert statefulset_replicas(api_client, ns) == (1, 1)
    answer(core, ns, transport="rdma", gbps=46.2)
    resumed = wait_for(lambda: running(api_client, ns, 2, 4), 120, what="2P/4D Ready")
    assert condition(resumed, "ScalingHeld")["status"] == "False"
    assert gauges(operator, ns) == verified

    # The deployment goes, and its series with it.
    custom(api_client).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME)
    wait_for(lambda: gauges(operator, ns) == {}, 30, what="the series removed")
