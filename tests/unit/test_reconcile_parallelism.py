"""The Reconciler and a layout the model cannot be split by, against the in-memory cluster of
helpers.fake_cluster: the engine StatefulSets are not created (every pod would fail at engine
start), running ones are not changed to the layout that cannot work, the rest is applied, and
the engines come once the spec fits."""

from __future__ import annotations

import copy
from typing import Any

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings

NS = "team-a"
KEY = (NS, "llama")
STATEFULSETS = {("StatefulSet", "llama-prefill"), ("StatefulSet", "llama-decode")}


def body(gpus: int) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(uid="uid-llama", resourceVersion="1")
    spec = result["spec"]
    spec["topology"] = {"placement": "none"}
    spec["model"] = {"name": "meta-llama/Llama-3.1-70B-Instruct"}
    spec["prefill"] = {"replicas": 1, "gpusPerInstance": gpus}
    spec["decode"] = {"replicas": 1, "gpusPerInstance": gpus}
    return result


def reconciler(cluster: FakeCluster) -> Reconciler:
    return Reconciler(cluster, cluster, OperatorSettings(), cluster.emit)


def applied(cluster: FakeCluster, since: int = 0) -> set[tuple[str, str]]:
    return {(kind, name) for verb, kind, name in cluster.writes[since:] if verb == "apply"}


def condition(cluster: FakeCluster, type_: str) -> tuple[str, str]:
    found = next(c for c in cluster.stored[KEY]["status"]["conditions"] if c["type"] == type_)
    return found["status"], found["reason"]


async def test_a_tp_the_model_cannot_use_holds_the_engines_until_it_can() -> None:
    cluster = FakeCluster(body(3))
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    assert not STATEFULSETS & applied(cluster)
    assert ("Deployment", "llama-router") in applied(cluster)
    reason = "AttentionHeadsNotDivisible"
    assert condition(cluster, "ParallelismSupported") == ("False", reason)
    assert condition(cluster, "Stalled") == ("True", reason)
    [event] = [e for e in cluster.events if e[1] == reason]
    assert event[0] == "Warning" and "use a tensor-parallel size of 1, 2, 4 or 8" in event[2]

    cluster.update_spec(KEY, {"prefill": {"gpusPerInstance": 8}, "decode": {"gpusPerInstance": 8}})
    await rec.reconcile(KEY)
    assert applied(cluster) >= STATEFULSETS
    assert condition(cluster, "ParallelismSupported") == ("True", "FitsModel")
    assert condition(cluster, "Stalled")[0] == "False"


async def test_running_engines_keep_their_layout_against_one_that_cannot_work() -> None:
    cluster = FakeCluster(body(8))
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    assert applied(cluster) >= STATEFULSETS
    writes = len(cluster.writes)
    cluster.update_spec(KEY, {"prefill": {"gpusPerInstance": 6}, "decode": {"gpusPerInstance": 6}})
    await rec.reconcile(KEY)
    verbs = {(verb, kind) for verb, kind, _ in cluster.writes[writes:]}
    assert ("apply", "StatefulSet") not in verbs and ("delete", "StatefulSet") not in verbs
    assert condition(cluster, "Ready") == ("False", "AttentionHeadsNotDivisible")
