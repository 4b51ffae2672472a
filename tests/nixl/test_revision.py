"""Revision pairing: a sidecar started with ``--revision`` (the operator renders PDD_REVISION,
the pod's ``pdd.dev/revision``) lists, serves and probes only peers of the other role that
report the same revision; the others show up in ``/v1/status`` as ``incompatible_peers``.
Real sidecar processes on 127.0.0.0/8; engines are stood in for by plain publications."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nixl_harness import Processes, SidecarProcess, free_port, http, wait_until

pytestmark = pytest.mark.nixl

NEW, OLD = "5c0ffee123", "0badcafe45"


def _names(sidecar: SidecarProcess, key: str, role: str = "decode") -> list[str]:
    return sorted(item.get("pod") or item["name"] for item in _peers(sidecar, role)[key])


def _peers(sidecar: SidecarProcess, role: str) -> dict[str, Any]:
    document: dict[str, Any] = sidecar.get_json(f"/v1/peers?role={role}")
    return document


def test_a_prefill_pod_pairs_only_with_decode_pods_of_its_revision(procs: Processes) -> None:
    hosts = {
        "kv-prefill-0": "127.0.0.2",  # revision NEW
        "kv-prefill-1": "127.0.0.3",  # no revision: pairs with anything (backwards compatible)
        "kv-decode-0": "127.0.0.4",  # NEW: the match
        "kv-decode-1": "127.0.0.5",  # OLD: a rollout's not yet updated pod
        "kv-decode-2": "127.0.0.6",  # reports none (a sidecar from before revisions)
    }
    ports = {pod: free_port(host) for pod, host in hosts.items()}
    source = "static:" + ",".join(
        f"{pod.split('-')[1]}={host}:{ports[pod]}" for pod, host in hosts.items()
    )
    revisions = {"kv-prefill-0": NEW, "kv-decode-0": NEW, "kv-decode-1": OLD}
    sidecars = {}
    for pod, host in hosts.items():
        extra = ("--revision", revisions[pod]) if pod in revisions else ()
        sidecars[pod] = procs.sidecar(
            host=host, port=ports[pod], role=pod.split("-")[1], pod=pod, uid=f"uid-{pod}",
            peer_source=source, extra_args=extra,
        )  # fmt: skip
    for pod, sidecar in sidecars.items():
        assert http("PUT", f"{sidecar.url}/v1/agents/{pod}", body=f"md-{pod}".encode())[0] == 200
    new_prefill, any_prefill = sidecars["kv-prefill-0"], sidecars["kv-prefill-1"]

    # The prefill without a revision sees every decode agent.
    wait_until(
        lambda: _names(any_prefill, "agents") == ["kv-decode-0", "kv-decode-1", "kv-decode-2"],
        20,
        "the revision-less prefill to list all three decode agents",
    )

    def settled() -> bool:
        status = new_prefill.get_json("/v1/status")
        return len(status["incompatible_peers"]) == 2 and bool(_names(new_prefill, "agents"))

    wait_until(settled, 20, "the NEW prefill to sort its decode peers")
    peers = _peers(new_prefill, "decode")
    assert [(a["name"], a["pod_uid"], a["revision"]) for a in peers["agents"]] == [
        ("kv-decode-0", "uid-kv-decode-0", NEW)
    ]
    assert [(p["pod"], p["revision"]) for p in peers["pods"]] == [("kv-decode-0", NEW)]
    status = new_prefill.get_json("/v1/status")
    assert status["self"]["revision"] == NEW
    assert sorted((p["pod"], p["revision"]) for p in status["incompatible_peers"]) == [
        ("kv-decode-1", OLD),
        ("kv-decode-2", ""),  # unknown revision: not paired either
    ]
    assert all(p["role"] == "decode" for p in status["incompatible_peers"])
    # Its own role is not filtered: the revision-less prefill is still a listed peer.
    assert _names(new_prefill, "pods", role="prefill") == ["kv-prefill-1"]

    # Their metadata is not served, and the probe refuses them as peers.
    assert http("GET", f"{new_prefill.url}/v1/agents/kv-decode-0")[1] == b"md-kv-decode-0"
    for pod in ("kv-decode-1", "kv-decode-2"):
        assert http("GET", f"{new_prefill.url}/v1/agents/{pod}")[0] == 404
        body = json.dumps({"peer": pod}).encode()
        assert http("POST", f"{new_prefill.url}/v1/probe", body=body)[0] == 404

    # The pairing is symmetric: the OLD decode pod pairs with no prefill pod here (a missing
    # revision is as incompatible as another one).
    old_decode = sidecars["kv-decode-1"]

    def old_sorted() -> list[tuple[str, str]]:
        incompatible = old_decode.get_json("/v1/status")["incompatible_peers"]
        return sorted((p["pod"], p["revision"]) for p in incompatible)

    expected = [("kv-prefill-0", NEW), ("kv-prefill-1", "")]
    wait_until(lambda: old_sorted() == expected, 20, "the OLD decode to sort its prefill peers")
    listed = _peers(old_decode, "prefill")
    assert (listed["agents"], listed["pods"]) == ([], [])

    # A static peer is named by its address until its sidecar has answered as a pod (a
    # 3-worker run read "127.0.0.6:PORT" here): wait for both names, then assert them.
    def own_role_peers() -> list[str]:
        return sorted(p["pod"] for p in old_decode.get_json("/v1/status")["peers"])

    own = ["kv-decode-0", "kv-decode-2"]
    wait_until(lambda: own_role_peers() == own, 20, "the OLD decode to name its own role's peers")
    assert own_role_peers() == own
