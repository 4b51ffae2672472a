"""Per-rank KV-path verification where instances span nodes, on the real control plane with the
real operator and real sidecars (``python -m pdd_sidecar`` with the rendered command, env,
token and Role, as in test_sidecar_k8s.py) measuring with the real NIXL probe (DRAM over TCP
on loopback).

A 2-node prefill and a 2-node decode instance (`gang: none`: the shared control plane has no
gang gates, and all-or-nothing binding is test_multinode.py's subject): the operator asks both
prefill ranks with one request id, each against the same rank of the decode instance. The
decode rank-1 sidecar is not started at first, so rank 1's probe finds its pair unreachable:
KVTransferVerified=False, reason RankPathDegraded, naming that rank, with both ranks listed in
status.transfer.ranks. Once that sidecar runs, the next round (intervalSeconds later) verifies
both ranks and the condition returns to True.

The verification floor is lowered (minFraction 1e-4 of the 50 GB/s an RDMA path should reach)
so that TCP on loopback counts as a good path here; a slow path's verdict is the unit tests'.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import pdd_body
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
NAME = "rk"
REQUEST, PEER = "pdd.dev/probe-request", "pdd.dev/probe-peer"
INTERVAL = 60  # the smallest interval the API allows
TWO_NODES = {"replicas": 1, "gpusPerInstance": 1, "nodesPerInstance": 2}
PREFILL = ("rk-prefill-0-0", "rk-prefill-0-1")
DECODE = ("rk-decode-0-0", "rk-decode-0-1")


@pytest.fixture
def sidecars() -> Iterator[list[Sidecar]]:
    with running_sidecars() as started:
        yield started


def create(api: client.ApiClient, ns: str) -> None:
    body = pdd_body(
        NAME,
        ns,
        engine={"type": "vllm"},
        router={"enabled": False},
        prefill=dict(TWO_NODES),
        decode=dict(TWO_NODES),
        topology={"placement": "none"},
        scheduling={"gang": "none"},
        kvTransfer={"verification": {"minFraction": 0.0001, "intervalSeconds": INTERVAL}},
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def verdict(api: client.ApiClient, ns: str, status: str, reason: str) -> dict[str, Any] | None:
    body = get_pdd(api, ns, NAME)
    cond = condition(body, "KVTransferVerified")
    return body if (cond.get("status"), cond.get("reason")) == (status, reason) else None


def test_every_prefill_rank_probes_its_pair_and_a_degraded_rank_is_named(
    operator: OperatorProcess,
    control_plane: Any,
    api_client: client.ApiClient,
    namespace: str,
    sidecars: list[Sidecar],
    tmp_path: Path,
) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    create(api_client, ns)
    wait_for(lambda: ready_body(api_client, ns, NAME), 180, what="the PDDeployment Ready")
    pods = {name: running_pod(core, ns, name) for name in (*PREFILL, *DECODE)}

    # One round: the same request id on every prefill rank, each with its own decode pair.
    def asked() -> dict[str, dict[str, str]] | None:
        notes = {n: core.read_namespaced_pod(n, ns).metadata.annotations or {} for n in PREFILL}
        return notes if all(REQUEST in a for a in notes.values()) else None

    notes = wait_for(asked, 60, what="probe requests on both prefill ranks")
    first_round = notes[PREFILL[0]][REQUEST]
    assert notes[PREFILL[1]][REQUEST] == first_round
    assert [notes[n][PEER] for n in PREFILL] == list(DECODE)
    for name in DECODE:  # decode pods are measured against, never asked
        assert REQUEST not in (core.read_namespaced_pod(name, ns).metadata.annotations or {})

    uid = get_pdd(api_client, ns, NAME)["metadata"]["uid"]
    token_file = tmp_path / "token"
    token = deployment_token(core, ns, NAME, uid, token_file)
    kubeconfig = service_account_kubeconfig(
        control_plane, core, ns, NAME, tmp_path / "sa.kubeconfig"
    )
    rendered = {role: rendered_sidecar(api_client, ns, f"{NAME}-{role}-0")
                for role in ("prefill", "decode")}  # fmt: skip
    port = port_free_on([loopback_for(p.status.pod_ip) for p in pods.values()])

    def start(name: str) -> Sidecar:
        pod = pods[name]
        env = sidecar_env(rendered[pod.metadata.labels["pdd.dev/role"]], pod, kubeconfig)
        sidecar = Sidecar(pod, rendered[pod.metadata.labels["pdd.dev/role"]], port, token, env)
        sidecars.append(sidecar.start(tmp_path, token_file))
        return sidecar

    # Every rank but decode rank 1: prefill rank 1's pair cannot be reached.
    for sidecar in [start(n) for n in (*PREFILL, DECODE[0])]:
        until(sidecar.healthy, 45, f"sidecar {sidecar.pod} healthy", sidecars)

    body = until(
        lambda: verdict(api_client, ns, "False", "RankPathDegraded"),
        180,  # rank 1 waits 30 s for its pair before it answers
        "KVTransferVerified=False RankPathDegraded",
        sidecars,
    )
    print("status", json.dumps(body["status"]))  # shown when the test fails
    message = condition(body, "KVTransferVerified")["message"]
    assert message.startswith(
        "1 of 2 measured ranks degraded; worst rk-prefill-0-1 (prefill instance 0 rank 1 -> "
        "rk-decode-0-1): ProbeFailed: transfer probe failed"
    ), message
    assert "decode pod rk-decode-0-1, this rank's pair, has no reachable sidecar" in message
    ranks = {r["pod"]: r for r in body["status"]["transfer"]["ranks"]}
    assert set(ranks) == set(PREFILL)
    good, bad = ranks[PREFILL[0]], ranks[PREFILL[1]]
    assert (good["verified"], good["reason"], good["peer"]) == (True, "TransferVerified", DECODE[0])
    assert good["measuredGBps"] > 0 and good["transport"] in ("tcp", "shm"), good
    assert (bad["verified"], bad["reason"], bad["rank"]) == (False, "ProbeFailed", 1)

    # The pair comes up; the next round (an interval after the first) verifies both ranks.
    until(start(DECODE[1]).healthy, 45, "sidecar rk-decode-0-1 healthy", sidecars)
    body = until(
        lambda: verdict(api_client, ns, "True", "TransferVerified"),
        INTERVAL + 90,
        "KVTransferVerified=True after the next round",
        sidecars,
    )
    transfer = body["status"]["transfer"]
    assert transfer["requestedAt"] > first_round
    assert transfer["message"].startswith("all 2 measured ranks verified; slowest rk-prefill-0-")
    assert [(r["pod"], r["peer"], r["verified"]) for r in transfer["ranks"]] == [
        (PREFILL[0], DECODE[0], True),
        (PREFILL[1], DECODE[1], True),
    ]
