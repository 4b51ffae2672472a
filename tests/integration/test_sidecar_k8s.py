"""Real sidecars against the real operator's rendering, on the real control plane.

The operator runs a PDDeployment; the test then starts ``python -m pdd_sidecar`` with the
command and environment the operator rendered for the pods' ``nixl-sidecar`` containers, as
if it were those containers: the pod identity from the real pods, the deployment token from
the operator's Secret, and the API identity of the rendered ServiceAccount (a TokenRequest
token), so the rendered Role is what discovery and the probe annotations run on. Each sidecar
listens on its pod's simulated IP (198.18.0.0/15) mapped into loopback by a CIDR
``PDD_PEER_ADDRESS_MAP``; nothing ever dials a simulated address.

Shown here: discovery through the deployment's pods (real pod names and UIDs), a replaced decode
pod reported removed (old UID) and added (new UID) through the watch, the operator's probe
request answered with a real NIXL probe (DRAM over TCP on loopback) and turned into
``status.transfer`` and ``KVTransferVerified``, and the sidecar's identity refused Secrets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helpers.factories import small_pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.pdd_objects import condition, get_pdd, ready_body
from helpers.sidecar_proc import (
    Sidecar,
    deployment_token,
    loopback_for,
    port_free_on,
    rendered_sidecar,
    running_pod,
    running_sidecars,
    service_account_kubeconfig,
    sidecar_env,
    until,
)
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NAME = "kv"
REQUEST, RESULT = "pdd.dev/probe-request", "pdd.dev/probe-result"
REVISION_LABEL = "pdd.dev/revision"


@pytest.fixture
def sidecars() -> Iterator[list[Sidecar]]:
    with running_sidecars() as started:
        yield started


def create(api: client.ApiClient, ns: str) -> None:
    body = small_pdd_body(
        NAME,
        ns,
        engine={"type": "vllm"},
        decode={"replicas": 2},
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def test_real_sidecars_discover_replace_and_probe(
    operator: OperatorProcess,
    control_plane: Any,
    api_client: client.ApiClient,
    namespace: str,
    sidecars: list[Sidecar],
    tmp_path: Path,
) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    create(api_client, ns)
    wait_for(lambda: ready_body(api_client, ns, NAME), 90, what="the PDDeployment Ready")

    pods = {name: running_pod(core, ns, name) for name in
            ("kv-prefill-0", "kv-decode-0", "kv-decode-1")}  # fmt: skip
    revision = pods["kv-prefill-0"].metadata.labels[REVISION_LABEL]
    assert {p.metadata.labels[REVISION_LABEL] for p in pods.values()} == {revision}

    uid = get_pdd(api_client, ns, NAME)["metadata"]["uid"]
    token_file = tmp_path / "token"
    token = deployment_token(core, ns, NAME, uid, token_file)
    kubeconfig = service_account_kubeconfig(
        control_plane, core, ns, NAME, tmp_path / "sa.kubeconfig"
    )

    rendered = {
        role: rendered_sidecar(api_client, ns, f"{NAME}-{role}") for role in ("prefill", "decode")
    }
    port = port_free_on([loopback_for(p.status.pod_ip) for p in pods.values()])

    def start(pod: client.V1Pod) -> Sidecar:
        role = pod.metadata.labels["pdd.dev/role"]
        env = sidecar_env(rendered[role], pod, kubeconfig)
        assert env["PDD_REVISION"] == revision and env["PDD_PROBER_POD"] == "kv-prefill-0"
        sidecar = Sidecar(pod, rendered[role], port, token, env).start(tmp_path, token_file)
        sidecars.append(sidecar)
        return sidecar

    # The prober pod's sidecar and kv-decode-0's first: the prober answers the operator's
    # request (already stamped: the deployment is Ready) with a probe of the first live decode
    # peer, which is then kv-decode-0, the only decode pod with a sidecar.
    decode0, prefill = start(pods["kv-decode-0"]), start(pods["kv-prefill-0"])
    for sidecar in (decode0, prefill):
        until(sidecar.healthy, 45, f"sidecar {sidecar.pod} healthy", sidecars)

    # Discovery through the pods with the rendered Role: both decode pods with their
    # real names and UIDs, kv-decode-1 too although no sidecar answers for it yet.
    expected = {(p.metadata.name, p.metadata.uid) for n, p in pods.items() if "decode" in n}

    def listed() -> dict[str, Any] | None:
        peers = prefill.get("/v1/peers?role=decode")
        return peers if {(p["pod"], p["pod_uid"]) for p in peers["pods"]} == expected else None

    listing = until(listed, 45, "the prefill sidecar to list both decode pods", sidecars)
    for entry in listing["pods"]:
        assert entry["address"] == f"{loopback_for(pods[entry['pod']].status.pod_ip)}:{port}"

    # The operator's probe request, answered by the prober pod's sidecar with a real probe.
    def answered() -> dict[str, Any] | None:
        annotations = core.read_namespaced_pod("kv-prefill-0", ns).metadata.annotations or {}
        result = json.loads(annotations.get(RESULT, "{}") or "{}")
        requested = annotations.get(REQUEST)
        return result if requested and result.get("request_id") == requested else None

    result = until(answered, 120, "the probe result on the prober pod", sidecars)
    assert result["error"] is None, result
    assert result["verified"] is True, result
    assert result["gbps"] > 0 and result["bytes"] > 0, result
    assert result["transport"] in ("tcp", "shm"), result
    assert (result["src_role"], result["dst_role"], result["peer"]) == (
        "prefill", "decode", "kv-decode-0"
    )  # fmt: skip
    assert prefill.get("/v1/status")["last_probe"]["verified"] is True

    def judged() -> dict[str, Any] | None:
        body = get_pdd(api_client, ns, NAME)
        verdict = condition(body, "KVTransferVerified")
        transfer = body.get("status", {}).get("transfer", {})
        return body if verdict.get("status") == "False" and transfer.get("measuredGBps") else None

    body = until(judged, 60, "status.transfer and KVTransferVerified", sidecars)
    verdict = condition(body, "KVTransferVerified")
    print("status", json.dumps(body.get("status")))  # shown when the test fails
    assert verdict["reason"] in ("TCPFallback", "BelowExpectedBandwidth"), verdict
    transfer = body["status"]["transfer"]
    assert transfer["measuredGBps"] > 0 and transfer["transport"] == result["transport"]
    assert transfer["requestedAt"] == result["request_id"]

    # kv-decode-1's sidecar too; stand-ins for the engines publish an agent named after the pod.
    decode1 = start(pods["kv-decode-1"])
    until(decode1.healthy, 45, "sidecar kv-decode-1 healthy", sidecars)
    for sidecar in (decode0, decode1):
        sidecar.call("PUT", f"/v1/agents/{sidecar.pod}", f"metadata of {sidecar.uid}".encode())

    def discovered() -> dict[str, Any] | None:
        peers = prefill.get("/v1/peers?role=decode")
        agents = {(a["name"], a["pod_uid"], a["revision"]) for a in peers["agents"]}
        answering = all(p["error"] is None and p["revision"] == revision for p in peers["pods"])
        wanted = {(name, uid, revision) for name, uid in expected}
        return peers if agents == wanted and answering else None

    peers = until(discovered, 45, "the prefill sidecar to list both decode agents", sidecars)
    status = prefill.get("/v1/status")
    assert status["self"]["pod_uid"] == pods["kv-prefill-0"].metadata.uid
    assert status["self"]["revision"] == revision and status["incompatible_peers"] == []

    # A decode pod replaced: the StatefulSet recreates it with a new UID and a new IP.
    since = peers["version"]
    old = pods["kv-decode-1"]
    core.delete_namespaced_pod("kv-decode-1", ns)
    decode1.stop()  # its containers die with it
    new = running_pod(core, ns, "kv-decode-1", not_uid=old.metadata.uid)
    decode1b = start(new)
    until(decode1b.healthy, 45, "the replacement's sidecar healthy", sidecars)
    decode1b.call("PUT", "/v1/agents/kv-decode-1", f"metadata of {new.metadata.uid}".encode())

    def replaced() -> bool:
        agents = prefill.get("/v1/peers?role=decode")["agents"]
        return ("kv-decode-1", new.metadata.uid) in {(a["name"], a["pod_uid"]) for a in agents}

    until(replaced, 45, "the prefill sidecar to list the replacement", sidecars)
    watch = prefill.get(f"/v1/peers/watch?since={since}&wait_s=0&role=decode")
    print("watch since", since, json.dumps(watch))
    assert watch["resync"] is False
    assert [(r["name"], r["pod_uid"]) for r in watch["removed"]] == [
        ("kv-decode-1", old.metadata.uid)
    ]
    assert [(r["name"], r["pod_uid"]) for r in watch["added"]] == [
        ("kv-decode-1", new.metadata.uid)
    ]

    # The sidecar's API identity discovers peers, but Secrets are refused.
    sa_api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(sa_api).list_namespaced_secret(ns)
        assert refused.value.status == 403
        assert client.CoreV1Api(sa_api).list_namespaced_pod(ns).items
    finally:
        sa_api.close()
    for sidecar in sidecars:
        assert token not in sidecar.log()
