"""Scale to zero and back on the request path: the pods really run (the local cluster's
PodRuntime, the reference engine as the one test double), the router is the upstream one the
operator rendered, and the scale steps go through the decode PDDRoleScaler's /scale.

At zero the router must answer at once with a status and a message that say why (never hang,
never refuse the connection), the PDDeployment must say ScaledToZero, and the router pod must
be the same pod before, during and after (a scaling step restarts nothing). What each upstream
router answers is its own: vllm-router a 503, smg 1.13.0 a 404 model_not_found (it routes in
its multi-model mode under service discovery, and no option of it turns that into a 503:
docs/autoscaling.md, "SGLang's router at zero").

Slices: grown beyond its domain, a deployment's requests through each slice's router are
prefilled and decoded by that slice's pods only, their KV handed over and verified.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from helpers.operator_proc import OperatorProcess
from helpers.pod_watch import watching_pods
from helpers.running_pods import (
    OwnNodes,
    ready_router_url_of,
    refengine_image,
    refengine_pdd,
    router_pods,
    running_nodes,
)
from helpers.traffic import complete, steady_traffic, when_and_where
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane, SimNode, gpu_node_labels
from pdd_localcluster.nodes import gpu_node_capacity
from pdd_localcluster.runtime import PodRuntime

GROUP, VERSION, PLURAL, SCALERS = "pdd.dev", "v1alpha1", "pddeployments", "pddrolescalers"
NODES = OwnNodes("pdd.test/autoscaling-path", ("as-rp-0",))
# Two domains for the slices test, under a level only they carry, tainted for that test's
# pods alone, of 2 GPUs each: one holds one prefill and one decode, and no more.
SLICE_LEVEL = "pdd.test/request-path-slices"
SLICE_TAINT = {"key": SLICE_LEVEL, "value": "true", "effect": "NoSchedule"}
SLICE_NODES = [
    SimNode(
        f"as-rp-{domain}",
        labels={**gpu_node_labels(gpus, clique=f"rp-{domain}"), SLICE_LEVEL: domain},
        capacity=gpu_node_capacity(gpus),
        taints=(SLICE_TAINT,),
    )
    for domain, gpus in (("near", 2), ("far", 2))
]
# What a router answers when it has no prefill and decode to send to.
AT_ZERO_STATUSES = (503, 404)
TIMEOUT_S = 20.0
READY_S = 240.0
# engine -> what its router answers at zero: status and the message in its body.
AT_ZERO = {
    "vllm": (503, "No available workers: 0 prefill, 0 decode"),
    "sglang": (404, '"code":"model_not_found","message":"No worker available for model \'tiny\'"'),
}


@pytest.fixture(scope="module")
def runtime(
    control_plane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRuntime]:
    state = tmp_path_factory.mktemp("autoscaling-path")
    with running_nodes(control_plane, state, NODES, "127.88", SLICE_NODES) as rt:
        yield rt


def body(name: str, engine: str) -> dict[str, Any]:
    autoscaling = {"decode": {"minReplicas": 0, "maxReplicas": 2}, "follower": "prefill"}
    return refengine_pdd(name, engine, NODES, replicas=1, autoscaling=autoscaling)


def pdd(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def at(api: client.ApiClient, ns: str, name: str, n: int) -> bool:
    st = pdd(api, ns, name).get("status", {})
    want = f"{n}/{n}"
    ready = conditions(pdd(api, ns, name)).get("Ready", {}).get("status") == "True"
    return st.get("prefillReplicas") == want and st.get("decodeReplicas") == want and ready


def scale_decode(api: client.ApiClient, ns: str, name: str, replicas: int) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, SCALERS, f"{name}-decode", {"spec": {"replicas": replicas}}
    )


def router_pod(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod:
    """The one ready router pod (its own address: no kube-proxy routes the ClusterIP here)."""
    pods = core.list_namespaced_pod(
        ns, label_selector=f"pdd.dev/deployment={name},pdd.dev/role=router"
    ).items
    ready = [
        p
        for p in pods
        if p.status.pod_ip
        and not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    assert len(ready) == 1, [p.metadata.name for p in pods]
    return ready[0]


def engine_pods(core: client.CoreV1Api, ns: str, name: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(ns, label_selector=f"pdd.dev/deployment={name}").items
    return [p for p in pods if p.metadata.labels.get("pdd.dev/role") in ("prefill", "decode")]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_scale_to_zero_answers_at_once_and_scaling_back_serves_again(
    engine: str,
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    runtime: PodRuntime,
) -> None:
    core, name, ns = client.CoreV1Api(api_client), "tiny-auto", namespace
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, body(name, engine)
    )
    wait_for(lambda: at(api_client, ns, name, 1), READY_S, what="1P/1D Ready")
    router = router_pod(core, ns, name)
    url = f"http://{router.status.pod_ip}:8000"
    first = wait_for(
        lambda: (o := complete(url, "tiny", "hello " * 10, timeout=TIMEOUT_S)).ok and o,
        60,
        what="a completion at 1P/1D",
    )
    assert first.served.get("kv_verified"), first

    # To zero: the router stays (same pod, still ready) and answers at once with its reason.
    scale_decode(api_client, ns, name, 0)
    wait_for(lambda: not engine_pods(core, ns, name), 90, what="no engine pods")
    zero = wait_for(
        lambda: (
            conditions(obj := pdd(api_client, ns, name)).get("ScaledToZero", {}).get("status")
            == "True"
            and obj
        ),
        30,
        what="ScaledToZero",
    )
    assert conditions(zero)["Ready"]["status"] == "True", conditions(zero)["Ready"]
    status, reason = AT_ZERO[engine]
    outcome = wait_for(
        lambda: (o := complete(url, "tiny", "hello", timeout=TIMEOUT_S)).status == status and o,
        30,
        what=f"the router's {status} at zero",
    )
    assert outcome.seconds < 2, outcome  # answered, not hung
    assert reason in outcome.error, outcome
    assert router_pod(core, ns, name).metadata.uid == router.metadata.uid

    # And back: the same router pairs the new pods.
    scale_decode(api_client, ns, name, 1)
    wait_for(lambda: at(api_client, ns, name, 1), READY_S, what="1P/1D Ready from zero")
    back = wait_for(
        lambda: (o := complete(url, "tiny", "hello again " * 10, timeout=TIMEOUT_S)).ok and o,
        60,
        what="a completion after scaling back",
    )
    assert back.served.get("kv_verified"), back
    assert conditions(pdd(api_client, ns, name))["ScaledToZero"]["status"] == "False"
    assert router_pod(core, ns, name).metadata.uid == router.metadata.uid


def rolled_to(core: client.CoreV1Api, ns: str, name: str, revision: str, n: int) -> bool:
    """Every engine and router pod runs (or, for the router, pairs) `revision`, n engine pods
    per role Ready, and no old pod is left."""
    pods = core.list_namespaced_pod(ns, label_selector=f"pdd.dev/deployment={name}").items
    ready = [
        p
        for p in pods
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    return (
        all(p.metadata.labels.get("pdd.dev/revision") == revision for p in pods)
        and sum(p.metadata.labels.get("pdd.dev/role") != "router" for p in ready) == 2 * n
        and len(pods) == 2 * n + 1
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_autoscaled_deployment_rolls_its_engine_and_the_router_never_runs_dry(
    engine: str,
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    runtime: PodRuntime,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An autoscaled deployment's router is Ready without workers (so a deployment at zero
    answers), so a router of the new revision would take the traffic before any pod of that
    revision could serve it. The router keeps pairing the old revision until the new one has
    a Ready pod in every role, and the old routers keep an old pair until they are gone: under
    steady traffic no request is refused for want of workers."""
    core, name, ns = client.CoreV1Api(api_client), "tiny-auto-roll", namespace
    autoscaling = {"decode": {"minReplicas": 2, "maxReplicas": 2}, "follower": "prefill"}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        refengine_pdd(name, engine, NODES, replicas=2, autoscaling=autoscaling),
    )
    wait_for(lambda: at(api_client, ns, name, 2), READY_S, what="2P/2D Ready")
    old = pdd(api_client, ns, name)["status"]["decode"]["revision"]

    with (
        watching_pods(core, ns, router_pods(name)) as routers,
        steady_traffic(lambda: ready_router_url_of(routers.pods()), "tiny", timeout=TIMEOUT_S) as t,
    ):
        time.sleep(2)
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            {"spec": {"engine": {"image": refengine_image(engine, build="b2")}}},
        )
        new = wait_for(
            lambda: (r := pdd(api_client, ns, name)["status"]["decode"]["revision"]) != old and r,
            30,
            what="the new revision",
        )
        wait_for(lambda: rolled_to(core, ns, name, new, 2), READY_S, what="the rollout")
        time.sleep(3)
    outcomes = t.outcomes
    failed = [o.error for o in outcomes if not o.ok]
    with capsys.disabled():
        print(
            f"\nautoscaled rollout [{engine}]: {len(outcomes)} sent, {len(failed)} failed",
            failed[:3],
        )
    refused = [o for o in outcomes if o.status in AT_ZERO_STATUSES]
    assert not refused, (
        f"{len(refused)} of {len(outcomes)} refused ({when_and_where(refused)}): "
        f"{[o.error for o in refused[:3]]}"
    )
    assert len(failed) < 0.1 * len(outcomes), failed[:5]


def served_by(url: str, prompt: str) -> tuple[str, str]:
    """The (prefill, decode) pods one completion went through, its KV handoff verified."""
    outcome = wait_for(
        lambda: (o := complete(url, "tiny", prompt, timeout=TIMEOUT_S)).ok and o,
        60,
        what=f"a completion through {url}",
    )
    assert outcome.served.get("kv_verified"), outcome
    return outcome.served["prefill"], outcome.served["decode"]


def pods_on_slice_nodes(core: client.CoreV1Api) -> list[str]:
    return [
        p.metadata.name
        for node in SLICE_NODES
        for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.name}").items
    ]


def slice_router(core: client.CoreV1Api, ns: str, name: str, index: int) -> str:
    """The URL of the ready router pod of one slice (the home's carries no slice label)."""
    pods = core.list_namespaced_pod(
        ns, label_selector=f"pdd.dev/deployment={name},pdd.dev/role=router"
    ).items
    ready = [
        p
        for p in pods
        if p.metadata.labels.get("pdd.dev/slice", "0") == str(index)
        and p.status.pod_ip
        and not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    assert len(ready) == 1, [p.metadata.name for p in pods]
    return f"http://{ready[0].status.pod_ip}:8000"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_slice_router_pairs_only_its_slice_on_the_request_path(
    engine: str,
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    runtime: PodRuntime,
) -> None:
    """Real pods and the real routers: the home slice in one domain, slice 1 in the other once
    decode asks for 2; every completion through a slice's router is prefilled and decoded by that
    slice's pods (the engines report which pods served it), its KV verified."""
    core, name, ns = client.CoreV1Api(api_client), "tiny-slices", namespace
    toleration = {**SLICE_TAINT, "operator": "Equal"}
    role = {"replicas": 1, "gpusPerInstance": 1, "tolerations": [toleration]}
    # The other engine's run may still be leaving these nodes (its namespace is deleted in
    # the background).
    wait_for(lambda: not pods_on_slice_nodes(core), 120, what="the slice nodes empty")
    obj = refengine_pdd(
        name,
        engine,
        NODES,
        replicas=1,
        prefill=role,
        decode=role,
        topology={"placement": "required", "levels": [SLICE_LEVEL]},
        # KV moves over TCP on loopback here, so once the probe has measured the path the
        # KV-path guard would hold decode's growth (ScalingHeld/KVPathDegraded): this test is
        # about the slices, not the guard.
        autoscaling={
            "decode": {"minReplicas": 1, "maxReplicas": 2},
            "follower": "prefill",
            "kvTransferGuard": False,
        },
    )
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, obj
    )
    wait_for(lambda: at(api_client, ns, name, 1), READY_S, what="1P/1D Ready")
    home_domain = pdd(api_client, ns, name)["status"]["placement"]["domain"]
    other = {"near": "far", "far": "near"}[home_domain]

    scale_decode(api_client, ns, name, 2)  # the home is full: slice 1 opens in the other
    wait_for(lambda: at(api_client, ns, name, 2), READY_S, what="2P/2D Ready over two slices")
    shown = pdd(api_client, ns, name)["status"]["slices"]
    assert [(s["domain"], s["prefill"], s["decode"]) for s in shown] == [
        (home_domain, 1, 1),
        (other, 1, 1),
    ]
    home, far = slice_router(core, ns, name, 0), slice_router(core, ns, name, 1)
    for i in range(4):  # both routers see both slices' pods in the namespace: none crosses
        assert served_by(home, f"home {i} " * 8) == (f"{name}-prefill-0", f"{name}-decode-0")
        assert served_by(far, f"far {i} " * 8) == (f"{name}-prefill-s1-0", f"{name}-decode-s1-0")

    scale_decode(api_client, ns, name, 1)  # slice 1 is emptied and removed
    wait_for(
        lambda: (
            len(pdd(api_client, ns, name)["status"]["slices"]) == 1 and at(api_client, ns, name, 1)
        ),
        READY_S,
        what="slice 1 removed",
    )
    assert served_by(home, "home again " * 8) == (f"{name}-prefill-0", f"{name}-decode-0")
