"""Instances over several nodes wait for their gang scheduler: while its API is not served
the Reconciler creates none of them (no half-placed instance) and says what to enable."""

from __future__ import annotations

import copy
from typing import Any

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.status.gang import REASON_MISSING, REASON_READY

NS = "team-a"
KEY = (NS, "llama")
TWO_NODES = {"replicas": 2, "gpusPerInstance": 8, "nodesPerInstance": 2}


def body(**spec: Any) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(uid="uid-llama", resourceVersion="1")
    fields: dict[str, Any] = {
        "topology": {"placement": "none"},
        "prefill": dict(TWO_NODES),
        "decode": {"replicas": 1, "gpusPerInstance": 8},
    }
    result["spec"].update({**fields, **spec})
    return result


def applied(cluster: FakeCluster) -> set[tuple[str, str]]:
    return {(kind, name) for verb, kind, name in cluster.writes if verb == "apply"}


def conditions(cluster: FakeCluster) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in cluster.stored[KEY]["status"]["conditions"]}


async def test_without_the_gang_api_no_instance_is_created_and_status_says_the_fix() -> None:
    cluster = FakeCluster(body())
    cluster.served_apis = set()
    await reconciler_for(cluster).reconcile(KEY)
    writes = applied(cluster)
    assert ("StatefulSet", "llama-decode") in writes  # single-node instances go ahead
    assert not {w for w in writes if w[0] == "StatefulSet" and w[1].startswith("llama-prefill")}
    assert ("Workload", "llama-prefill") not in writes
    found = conditions(cluster)
    gang = found["GangScheduling"]
    assert (gang["status"], gang["reason"]) == ("False", REASON_MISSING)
    assert "GenericWorkload" in gang["message"] and "spec.scheduling.gang" in gang["message"]
    assert (found["Stalled"]["status"], found["Stalled"]["reason"]) == ("True", REASON_MISSING)


async def test_with_the_gang_api_the_instances_and_their_workload_are_applied() -> None:
    cluster = FakeCluster(body())
    await reconciler_for(cluster).reconcile(KEY)
    writes = applied(cluster)
    assert {("StatefulSet", "llama-prefill-0"), ("StatefulSet", "llama-prefill-1")} <= writes
    assert ("Workload", "llama-prefill") in writes
    gang = conditions(cluster)["GangScheduling"]
    assert (gang["status"], gang["reason"]) == ("True", REASON_READY)


async def test_volcano_is_looked_for_by_its_own_api() -> None:
    cluster = FakeCluster(body(scheduling={"gang": "volcano"}))
    await reconciler_for(cluster).reconcile(KEY)
    assert ("APIGroup", "", "scheduling.volcano.sh/v1beta1") in cluster.reads
    assert conditions(cluster)["GangScheduling"]["status"] == "False"


async def test_gang_none_and_single_node_deployments_ask_nothing() -> None:
    for spec in (
        {"scheduling": {"gang": "none"}},
        {"prefill": {"replicas": 1, "gpusPerInstance": 8}},
    ):
        cluster = FakeCluster(body(**spec))
        await reconciler_for(cluster).reconcile(KEY)
        assert not [r for r in cluster.reads if r[0] == "APIGroup"]
        assert "GangScheduling" not in conditions(cluster)
