"""The sidecar plumbing the operator renders, and probe results turned into status.transfer and
KVTransferVerified on the real control plane. The test plays the prober pod's sidecar: it
answers the operator's probe request on the pod, as the sidecar does in a cluster."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
REQUEST, RESULT = "pdd.dev/probe-request", "pdd.dev/probe-result"


def create(api: client.ApiClient, ns: str) -> None:
    body = pdd_body(
        "kv",
        ns,
        router={"enabled": False},
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 2, "gpusPerInstance": 1},
        topology={"placement": "none"},
        kvTransfer={"verification": {"minFraction": 0.5}},
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def pdd(api: client.ApiClient, ns: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "kv"
    )


def verified(api: client.ApiClient, ns: str) -> dict[str, Any]:
    conds = pdd(api, ns).get("status", {}).get("conditions", [])
    return next((c for c in conds if c["type"] == "KVTransferVerified"), {})


def answer(core: client.CoreV1Api, ns: str, request_id: str, **result: Any) -> None:
    doc = {"request_id": request_id, "path": "kv-prefill-0 -> kv-decode-0", "bytes": 1 << 30,
           "blocks": 256, "verified": True, "ucx_net_devices": "mlx5_0:1",
           "started_at": "2026-11-29T09:00:00Z", **result}  # fmt: skip
    core.patch_namespaced_pod(
        "kv-prefill-0", ns, {"metadata": {"annotations": {RESULT: json.dumps(doc)}}}
    )


def test_rendered_sidecar_token_rbac_and_network_policy(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace)
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    sts = wait_for(
        lambda: client.AppsV1Api(api_client).read_namespaced_stateful_set("kv-prefill", namespace),
        30,
        what="prefill StatefulSet",
    )
    pod_spec = sts.spec.template.spec
    sidecar = next(c for c in pod_spec.containers if c.name == "nixl-sidecar")
    assert sidecar.security_context.run_as_non_root is True
    assert sidecar.security_context.capabilities.drop == ["ALL"]
    assert "--peer-source" in sidecar.command and "k8s" in sidecar.command
    assert pod_spec.service_account_name == "kv-sidecar"
    token_volume = next(v for v in pod_spec.volumes if v.name == "sidecar-token")
    token_name = f"kv-sidecar-token-{pdd(api_client, namespace)['metadata']['uid'][:8]}"
    assert token_volume.secret.secret_name == token_name

    secret = wait_for(lambda: core.read_namespaced_secret(token_name, namespace), 30)
    assert len(secret.data["token"]) >= 40  # base64 of a 32-byte random token
    assert secret.metadata.owner_references[0].kind == "PDDeployment"

    role = rbac.read_namespaced_role("kv-sidecar", namespace)
    rules = sorted((r.verbs, r.resource_names) for r in role.rules if r.resources == ["pods"])
    # Peer discovery reads the namespace's pods; it may patch only the prober pod itself.
    assert rules == [(["get", "list", "watch"], None), (["patch"], ["kv-prefill-0"])]
    assert all(r.resources == ["pods"] for r in role.rules)

    policy = client.NetworkingV1Api(api_client).read_namespaced_network_policy(
        "kv-kv-transfer", namespace
    )
    peers, http = policy.spec.ingress
    assert peers._from[0].pod_selector.match_labels == {"pdd.dev/deployment": "kv"}
    assert [(p.protocol, p.port) for p in peers.ports] == [("TCP", None)]  # every TCP port
    # No router rendered here: the engines' HTTP port is the front door.
    assert http._from is None and [p.port for p in http.ports] == [8000]

    # The sidecar's identity may discover peers but never read Secrets.
    secrets = client.V1ResourceAttributes(namespace=namespace, verb="get", resource="secrets")
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{namespace}:kv-sidecar", resource_attributes=secrets
        )
    )
    assert (
        not client.AuthorizationV1Api(api_client)
        .create_subject_access_review(review)
        .status.allowed
    )


def test_probe_results_become_status_transfer_and_the_condition(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    create(api_client, namespace)
    core = client.CoreV1Api(api_client)

    def requested() -> str | None:
        pod = core.read_namespaced_pod("kv-prefill-0", namespace)
        return (pod.metadata.annotations or {}).get(REQUEST)

    request_id = wait_for(requested, 90, what="the operator's probe request on the prober pod")
    # The same pass writes the request on the pod, then the status that records it.
    wait_for(
        lambda: pdd(api_client, namespace)["status"]["transfer"]["requestedAt"] == request_id,
        30,
        what="status.transfer.requestedAt to record the request",
    )

    answer(core, namespace, request_id, transport="rdma", gbps=46.2, expected_gbps=50.0)
    good = wait_for(
        lambda: verified(api_client, namespace).get("status") == "True", 30, what="verified"
    )
    assert good
    transfer = pdd(api_client, namespace)["status"]["transfer"]
    assert transfer["measuredGBps"] == 46.2 and transfer["expectedGBps"] == 50.0
    assert transfer["transport"] == "rdma" and transfer["verified"] is True
    assert verified(api_client, namespace)["reason"] == "TransferVerified"

    answer(core, namespace, request_id, transport="tcp", gbps=0.5, expected_gbps=50.0)
    bad = wait_for(
        lambda: (c := verified(api_client, namespace)).get("status") == "False" and c,
        30,
        what="tcp",
    )
    assert bad["reason"] == "TCPFallback"
    assert bad["message"].startswith("tcp fallback: 0.5 GB/s, expected ≥ 25 GB/s over mlx5_0:1")
    assert "memlock" in bad["message"]
    events = wait_for(
        lambda: [
            e for e in core.list_namespaced_event(namespace).items if e.reason == "TCPFallback"
        ],
        30,
        what="TCPFallback event",
    )
    assert events[0].type == "Warning"


def test_the_sidecar_token_never_appears_in_logs_events_or_status(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    import base64

    create(api_client, namespace)
    core = client.CoreV1Api(api_client)
    token_name = f"kv-sidecar-token-{pdd(api_client, namespace)['metadata']['uid'][:8]}"
    secret = wait_for(lambda: core.read_namespaced_secret(token_name, namespace), 30)
    token = base64.b64decode(secret.data["token"]).decode()
    wait_for(lambda: pdd(api_client, namespace).get("status", {}).get("conditions"), 60)
    events = " ".join(e.message or "" for e in core.list_namespaced_event(namespace).items)
    assert token not in events
    assert token not in json.dumps(pdd(api_client, namespace))
    assert token not in operator.tail(10_000_000)
