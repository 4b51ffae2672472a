"""The Reconciler's side of slices, against the in-memory cluster of helpers.fake_cluster:
beyond its home domain an autoscaled deployment opens a slice in the next best domain (its own
StatefulSets pinned there and a router pairing only its pods), shrinks by emptying the newest
slice, reports each slice in status.slices, and never changes a running pod's template."""

from __future__ import annotations

import copy
from typing import Any

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.api.v1alpha1 import API_VERSION, SCALER_KIND
from pdd_operator.planning.placement import Fleet, NodeFacts
from pdd_operator.reconcile import Reconciler

NS = "team-a"
KEY = (NS, "llama")
LEVEL = "nvidia.com/gpu.clique"
DECODE_LEADS = {
    "decode": {"minReplicas": 0, "maxReplicas": 16},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}


def body() -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(name="llama", uid="uid-llama", resourceVersion="1")
    result["spec"].update(
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 2, "gpusPerInstance": 1},
        topology={"placement": "required", "levels": [LEVEL]},
        autoscaling=DECODE_LEADS,
    )
    return result


def fleet() -> Fleet:
    """Cliques a (6 GPUs: home, fewest free), b (8) and c (16): b is the next best."""
    return Fleet(
        NodeFacts(f"node-{clique}", {LEVEL: clique}, gpus, 0)
        for clique, gpus in (("a", 6), ("b", 8), ("c", 16))
    )


async def settle(cluster: FakeCluster, rec: Reconciler) -> None:
    for _ in range(6):
        before = len(cluster.writes)
        await rec.reconcile(KEY)
        cluster.workloads_ready(NS)
        if len(cluster.writes) == before:
            return
    raise AssertionError(f"still writing: {cluster.writes[-5:]}")


def workload(cluster: FakeCluster, kind: str, name: str) -> dict[str, Any] | None:
    api = "apps/v1"
    return cluster.objects.get((NS, api, kind, name))


def counts(cluster: FakeCluster, suffix: str = "") -> dict[str, int] | None:
    found = {
        role: workload(cluster, "StatefulSet", f"llama-{role}{suffix}")
        for role in ("prefill", "decode")
    }
    if any(sts is None for sts in found.values()):
        return None
    return {role: sts["spec"]["replicas"] for role, sts in found.items() if sts is not None}


def pinned_to(sts: dict[str, Any]) -> list[str]:
    affinity = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (expression,) = [e for e in terms[0]["matchExpressions"] if e["key"] == LEVEL]
    return list(expression["values"])


def router_selectors(deployment: dict[str, Any]) -> dict[str, list[str]]:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    out: dict[str, list[str]] = {}
    flag = ""
    for arg in args:
        if arg in ("--prefill-selector", "--decode-selector"):
            flag = arg
            out[flag] = []
        elif arg.startswith("--"):
            flag = ""
        elif flag:
            out[flag].append(arg)
    return out


def templates(cluster: FakeCluster) -> dict[str, Any]:
    return {
        name: live["spec"]["template"]
        for (ns, _, kind, name), live in cluster.objects.items()
        if ns == NS and kind in ("StatefulSet", "Deployment")
    }


async def test_growth_beyond_the_home_domain_opens_a_slice_and_shrinking_empties_it() -> None:
    cluster = FakeCluster(body())
    cluster.fleet_snapshot = fleet()
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    assert cluster.stored[KEY]["status"]["placement"]["domain"] == "a"
    assert cluster.stored[KEY]["status"]["slices"] == [
        {"index": 0, "level": LEVEL, "domain": "a", "prefill": 1, "decode": 2}
    ]
    before = templates(cluster)

    cluster.scale(NS, "llama-decode", 8)  # home a holds 4 decode + 2 prefill
    await settle(cluster, rec)

    assert counts(cluster) == {"prefill": 2, "decode": 4}
    assert counts(cluster, "-s1") == {"prefill": 2, "decode": 4}
    for role in ("prefill", "decode"):
        home = workload(cluster, "StatefulSet", f"llama-{role}")
        piece = workload(cluster, "StatefulSet", f"llama-{role}-s1")
        assert home is not None and piece is not None
        assert pinned_to(home) == ["a"]
        assert pinned_to(piece) == ["b"]  # the next best clique: fewest free that holds it
        assert piece["spec"]["template"]["metadata"]["labels"]["pdd.dev/slice"] == "1"
    home_router = workload(cluster, "Deployment", "llama-router")
    slice_router = workload(cluster, "Deployment", "llama-router-s1")
    assert home_router is not None and slice_router is not None
    assert "app.kubernetes.io/instance=llama" in router_selectors(home_router)["--decode-selector"]
    assert "pdd.dev/slice=1" in router_selectors(slice_router)["--prefill-selector"]
    assert "pdd.dev/slice=1" in router_selectors(slice_router)["--decode-selector"]
    status = cluster.stored[KEY]["status"]
    assert status["slices"] == [
        {"index": 0, "level": LEVEL, "domain": "a", "prefill": 2, "decode": 4},
        {"index": 1, "level": LEVEL, "domain": "b", "prefill": 2, "decode": 4},
    ]
    assert status["decode"]["desired"] == 8
    assert status["prefill"]["desired"] == 4
    scaler = cluster.objects[(NS, API_VERSION, SCALER_KIND, "llama-decode")]
    assert scaler["status"]["replicas"] == 8
    assert scaler["status"]["readyReplicas"] == 8
    # No template of what ran before changed: no running pod restarts.
    assert {name: templates(cluster)[name] for name in before} == before

    cluster.scale(NS, "llama-decode", 6)  # the newest slice shrinks first
    await settle(cluster, rec)
    assert counts(cluster) == {"prefill": 2, "decode": 4}
    assert counts(cluster, "-s1") == {"prefill": 1, "decode": 2}

    cluster.scale(NS, "llama-decode", 3)  # emptied, slice 1 goes; then home shrinks
    await settle(cluster, rec)
    assert counts(cluster) == {"prefill": 2, "decode": 3}
    assert counts(cluster, "-s1") is None
    assert workload(cluster, "Deployment", "llama-router-s1") is None
    assert cluster.stored[KEY]["status"]["slices"] == [
        {"index": 0, "level": LEVEL, "domain": "a", "prefill": 2, "decode": 3}
    ]
    assert {name: templates(cluster)[name] for name in before} == before


async def grown(cluster: FakeCluster) -> Reconciler:
    """The deployment at decode 8: 2P/4D at home in a, 2P/4D in slice 1 in b."""
    cluster.fleet_snapshot = fleet()
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.scale(NS, "llama-decode", 8)
    await settle(cluster, rec)
    assert counts(cluster, "-s1") == {"prefill": 2, "decode": 4}
    return rec


async def test_a_restarted_operator_keeps_the_slices_status_lists_and_writes_nothing() -> None:
    cluster = FakeCluster(body())
    await grown(cluster)
    # Clique d (6 GPUs) would now be the best fit for a new slice: slice 1 stays in b.
    cluster.fleet_snapshot = Fleet([*fleet().nodes, NodeFacts("node-d", {LEVEL: "d"}, 6, 0)])
    writes = len(cluster.writes)
    await reconciler_for(cluster).reconcile(KEY)  # a new process: nothing in memory
    assert cluster.writes[writes:] == []
    assert counts(cluster, "-s1") == {"prefill": 2, "decode": 4}


async def test_a_home_statefulset_deleted_by_hand_comes_back_and_the_slice_stays() -> None:
    cluster = FakeCluster(body())
    rec = await grown(cluster)
    cluster.deleted_by_hand(NS, ("apps/v1", "StatefulSet", "llama-decode"))
    await settle(cluster, rec)
    assert counts(cluster) == {"prefill": 2, "decode": 4}
    assert counts(cluster, "-s1") == {"prefill": 2, "decode": 4}
