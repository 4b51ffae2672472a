"""The Reconciler's pipeline (plan -> render -> apply -> status) against the in-memory cluster
of helpers.fake_cluster: what it writes, in which order, and when it writes nothing."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.planning.placement import Fleet, NodeFacts
from pdd_operator.reconcile import REFERENCED_FIRST, Reconciler
from pdd_operator.rendering.children import child_key, render_children
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.status.drift import rendered_fingerprint
from pdd_operator.status.observe import PodSummary

NS = "team-a"
KEY = (NS, "llama")
CLIQUE = "nvidia.com/gpu.clique"
CHILDREN = {
    ("ServiceAccount", "llama-sidecar"),
    ("Role", "llama-sidecar"),
    ("RoleBinding", "llama-sidecar"),
    ("ServiceAccount", "llama-router"),
    ("Role", "llama-router"),
    ("RoleBinding", "llama-router"),
    ("NetworkPolicy", "llama-kv-transfer"),
    ("NetworkPolicy", "llama-router"),
    ("StatefulSet", "llama-prefill"),
    ("StatefulSet", "llama-decode"),
    ("Service", "llama-prefill"),
    ("Service", "llama-decode"),
    ("Service", "llama-router"),
    ("Deployment", "llama-router"),
    ("PodDisruptionBudget", "llama-prefill"),
    ("PodDisruptionBudget", "llama-decode"),
}


def body(name: str = "llama", **spec: Any) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(name=name, uid=f"uid-{name}", resourceVersion="1")
    result["spec"]["topology"] = {"placement": "none"}
    result["spec"].update(spec)
    return result


async def settle(cluster: FakeCluster, rec: Reconciler, key: tuple[str, str] = KEY) -> None:
    """Passes until one writes nothing (the fake's index follows every write at once)."""
    for _ in range(5):
        before = len(cluster.writes)
        await rec.reconcile(key)
        if len(cluster.writes) == before:
            return
    raise AssertionError(f"still writing: {cluster.writes[-5:]}")


def condition(cluster: FakeCluster, type_: str, key: tuple[str, str] = KEY) -> tuple[str, str]:
    conditions = cluster.stored[key]["status"]["conditions"]
    found = next(c for c in conditions if c["type"] == type_)
    return found["status"], found["reason"]


async def test_a_new_deployment_applies_its_children_in_waves_and_writes_status_once() -> None:
    # Slow Role and ServiceAccount applies: sent in one wave with the rest, the RoleBinding
    # would reach the fake server before its Role and be refused.
    cluster = FakeCluster(body(), slow_kinds={"Role": 0.05, "ServiceAccount": 0.05})
    metrics = OperatorMetrics(CollectorRegistry())
    await reconciler_for(cluster, metrics).reconcile(KEY)

    applies = [(kind, name) for verb, kind, name in cluster.writes if verb == "apply"]
    assert sorted(applies) == sorted(CHILDREN)
    # The sidecar's and the router's Role and ServiceAccount, before anything else.
    assert {kind for kind, _ in applies[:4]} == REFERENCED_FIRST
    assert [w for w in cluster.writes if w[0] != "apply"] == [
        ("create", "Secret", names.token_secret_name("llama", "uid-llama")),
        ("status", "PDDeployment", "llama"),
    ]
    assert condition(cluster, "Ready") == ("False", "ReplicasNotReady")
    assert condition(cluster, "Stalled") == ("False", "NotStalled")
    assert cluster.stored[KEY]["status"]["observedGeneration"] == 3
    writes = "pdd_operator_api_writes_total"
    assert metrics.registry.get_sample_value(writes, {"verb": "apply", "kind": "Role"}) == 2
    assert (
        metrics.registry.get_sample_value(writes, {"verb": "status", "kind": "PDDeployment"}) == 1
    )


async def test_each_pass_asked_for_is_counted_by_its_cause() -> None:
    cluster = FakeCluster(body())
    metrics = OperatorMetrics(CollectorRegistry())
    rec = reconciler_for(cluster, metrics)
    for cause in ("pods", "pods", "statefulsets"):
        await rec.reconcile(KEY, cause=cause)
    asked = "pdd_operator_pass_requests_total"
    assert metrics.registry.get_sample_value(asked, {"cause": "pods"}) == 2
    assert metrics.registry.get_sample_value(asked, {"cause": "statefulsets"}) == 1


async def test_an_unchanged_pass_writes_nothing() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.workloads_ready(NS)
    await rec.reconcile(KEY)
    assert condition(cluster, "Ready") == ("True", "AllReplicasReady")
    assert cluster.events[-1][:2] == ("Normal", "Ready")
    writes, events = len(cluster.writes), len(cluster.events)

    for _ in range(3):  # resyncs, and passes answering pod or child events that changed nothing
        await rec.reconcile(KEY)
    assert (len(cluster.writes), len(cluster.events)) == (writes, events)


async def test_readiness_follows_the_pods_not_the_statefulsets_own_counts() -> None:
    """Under load a StatefulSet's controller counts its pods seconds after they change: the
    pass asked by a pod's event reads the pods themselves."""
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.workloads_ready(NS)
    for (_, _, kind, _), live in cluster.objects.items():
        if kind == "StatefulSet":  # not counted yet
            live["status"] |= {"replicas": 0, "readyReplicas": 0, "updatedReplicas": 0}
    await rec.reconcile(KEY)
    assert condition(cluster, "Ready") == ("True", "AllReplicasReady")
    assert cluster.stored[KEY]["status"]["decodeReplicas"] == "4/4"

    # The controller now counts every pod ready; one is not any more.
    cluster.workloads_ready(NS)
    [(where, pods)] = [(k, p) for k, p in cluster.workload_pods.items() if k[3] == "llama-decode"]
    cluster.workload_pods[where] = [replace(pods[0], ready=False), *pods[1:]]
    await rec.reconcile(KEY)
    assert condition(cluster, "Ready")[0] == "False"
    assert cluster.stored[KEY]["status"]["decodeReplicas"] == "3/4"


async def test_events_are_posted_only_after_the_status_write_succeeded() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.workloads_ready(NS)
    cluster.status_error = RuntimeError("the API server went away")
    events = list(cluster.events)
    with pytest.raises(RuntimeError):
        await rec.reconcile(KEY)
    assert cluster.events == events  # Ready did not reach the server: nobody is told
    cluster.status_error = None
    await rec.reconcile(KEY)
    assert cluster.events[len(events) :] == [
        ("Normal", "Ready", "prefill 2/2 ready, decode 4/4 ready, router 1/1 ready")
    ]


async def test_a_deleted_child_is_applied_again_and_nothing_else() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.deleted_by_hand(NS, ("v1", "Service", "llama-decode"))
    writes = len(cluster.writes)
    await rec.reconcile(KEY)
    assert cluster.writes[writes:] == [("apply", "Service", "llama-decode")]
    assert cluster.child(NS, ("v1", "Service", "llama-decode"))


async def test_children_no_longer_rendered_are_deleted() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.update_spec(KEY, {"router": {"enabled": False}})
    writes = len(cluster.writes)
    await rec.reconcile(KEY)
    assert sorted(w for w in cluster.writes[writes:] if w[0] == "delete") == [
        ("delete", "Deployment", "llama-router"),
        ("delete", "NetworkPolicy", "llama-router"),
        ("delete", "Role", "llama-router"),
        ("delete", "RoleBinding", "llama-router"),
        ("delete", "Service", "llama-router"),
        ("delete", "ServiceAccount", "llama-router"),
    ]
    assert not [kind for (_, _, kind, name) in cluster.objects if name == "llama-router"]


def prober_pod(ready: bool = True) -> PodSummary:
    name = names.prober_pod_name("llama")
    return PodSummary(name, "u0", "prefill", "gpu-0", ready, "r", None)


async def test_a_due_probe_is_asked_for_once_and_recorded_in_the_one_status_write() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.pods_of[KEY] = [prober_pod()]
    cluster.workloads_ready(NS)
    writes = len(cluster.writes)
    await rec.reconcile(KEY)
    assert cluster.writes[writes:] == [
        ("annotate", "Pod", "llama-prefill-0"),
        ("status", "PDDeployment", "llama"),
    ]
    [asked] = [p.probe_request for p in cluster.pods_of[KEY]]
    assert asked and cluster.stored[KEY]["status"]["transfer"]["requestedAt"] == asked
    assert condition(cluster, "Ready") == ("True", "AllReplicasReady")

    writes = len(cluster.writes)
    await rec.reconcile(KEY)
    assert cluster.writes[writes:] == []


async def test_a_probe_request_that_failed_is_not_in_the_status() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.pods_of[KEY] = [prober_pod()]
    cluster.workloads_ready(NS)
    cluster.annotate_error = RuntimeError("pod is gone")
    await rec.reconcile(KEY)
    assert condition(cluster, "Ready") == ("True", "AllReplicasReady")
    assert cluster.stored[KEY]["status"]["transfer"]["requestedAt"] == ""
    cluster.annotate_error = None
    await rec.reconcile(KEY)  # the next pass asks again
    assert cluster.stored[KEY]["status"]["transfer"]["requestedAt"]


def one_clique(gpus: int) -> Fleet:
    return Fleet([NodeFacts(f"gpu-{i}", {CLIQUE: "c1"}, 8, 0) for i in range(gpus // 8)])


def placed(**spec: Any) -> dict[str, Any]:
    """A slice of 8 GPUs that must sit in one NVLink clique."""
    return {
        "prefill": {"replicas": 1, "gpusPerInstance": 4},
        "decode": {"replicas": 1, "gpusPerInstance": 4},
        "topology": {"placement": "required", "levels": [CLIQUE]},
        **spec,
    }


async def test_the_placement_reservation_is_released_when_the_deployment_goes_away() -> None:
    first, second = (NS, "llama"), (NS, "other")
    cluster = FakeCluster(body("llama", **placed()), body("other", **placed()))
    cluster.fleet_snapshot = one_clique(8)  # room for one slice; no pod is bound yet
    rec = reconciler_for(cluster)
    await rec.reconcile(first)
    await rec.reconcile(second)
    assert condition(cluster, "Placed", first) == ("True", "Placed")
    assert condition(cluster, "Placed", second) == ("False", "InsufficientCapacity")
    await rec.reconcile(second)  # the first slice's reservation still holds the clique
    assert condition(cluster, "Placed", second) == ("False", "InsufficientCapacity")

    cluster.delete_deployment(first)
    await rec.reconcile(first)
    await rec.reconcile(second)
    assert condition(cluster, "Placed", second) == ("True", "Placed")
    assert cluster.stored[second]["status"]["placement"]["domain"] == "c1"


async def test_the_per_process_deployment_gauges_count_passes_and_drop_what_is_gone() -> None:
    """pdd_operator_deployments_reconciled (had a pass in this process: the bench's proof that a
    restarted operator re-verified every deployment) and _tracked (held state: back to its level
    once deployments are gone, else per-deployment state leaks)."""
    other = (NS, "other")
    cluster = FakeCluster(body("llama"), body("other"))
    metrics = OperatorMetrics(CollectorRegistry())
    rec = reconciler_for(cluster, metrics)

    def gauge(name: str) -> float | None:
        return metrics.registry.get_sample_value(f"pdd_operator_deployments_{name}")

    assert (gauge("reconciled"), gauge("tracked")) == (0, 0)
    await rec.reconcile(KEY)
    assert (gauge("reconciled"), gauge("tracked")) == (1, 1)
    await rec.reconcile(other)
    await rec.reconcile(KEY)  # a second pass of the same deployment counts it once
    assert (gauge("reconciled"), gauge("tracked")) == (2, 2)

    cluster.delete_deployment(other)
    await rec.reconcile(other)
    assert (gauge("reconciled"), gauge("tracked")) == (1, 1)


async def test_triggers_that_come_while_a_deployment_waits_for_a_pass_slot_need_no_more_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = FakeCluster(body())
    rec = Reconciler(cluster, cluster, OperatorSettings(), cluster.emit, max_concurrent=1)
    passes: list[tuple[str, str]] = []
    release = asyncio.Event()

    async def one_pass(key: tuple[str, str]) -> None:
        passes.append(key)
        if key == ("other", "busy"):
            await release.wait()

    monkeypatch.setattr(rec, "_reconcile_once", one_pass)
    busy = asyncio.create_task(rec.reconcile(("other", "busy")))
    await asyncio.sleep(0)  # it holds the only pass slot
    waiting = [asyncio.create_task(rec.reconcile(KEY)) for _ in range(3)]
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(busy, *waiting)

    # The three triggers came before the deployment's pass read anything: one pass answers them.
    assert passes == [("other", "busy"), KEY]


async def test_a_burst_of_triggers_is_answered_once_it_is_quiet_and_a_stream_at_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triggers 0.02 s apart with a 0.2 s quiet delay: one pass after the burst. A stream that
    never goes quiet still gets a pass every 0.5 s (the cap), not never. (The margins are wide:
    a loaded machine wakes sleepers late.)"""
    cluster = FakeCluster(body())
    rec = Reconciler(cluster, cluster, OperatorSettings(), cluster.emit, coalesce_max_s=0.5)
    loop = asyncio.get_running_loop()
    passes: list[float] = []

    async def one_pass(key: tuple[str, str]) -> None:
        passes.append(loop.time())

    monkeypatch.setattr(rec, "_reconcile_once", one_pass)

    async def triggers(count: int) -> float:
        tasks, last = [], 0.0
        for _ in range(count):
            last = loop.time()
            tasks.append(asyncio.create_task(rec.reconcile(KEY, 0.2, "pods")))
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        return last

    last = await triggers(5)  # 0.08 s of triggers
    assert len(passes) == 1 and passes[0] >= last + 0.2
    passes.clear()
    start = loop.time()
    last = await triggers(75)  # 1.5 s or more without a quiet moment
    assert passes[0] - start >= 0.5
    assert 2 <= len(passes) <= (last - start) / 0.5 + 1


async def test_triggers_a_later_pass_has_read_need_no_pass_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod event waits for its burst to end; meanwhile a spec change runs a pass at once.
    That pass read what the pod event announced: when the wait ends, nothing is left to do.
    A pod event after that pass began gets a pass."""
    cluster = FakeCluster(body())
    rec = Reconciler(cluster, cluster, OperatorSettings(), cluster.emit)
    passes: list[str] = []

    async def one_pass(key: tuple[str, str]) -> None:
        passes.append("pass")

    monkeypatch.setattr(rec, "_reconcile_once", one_pass)
    waiting = asyncio.create_task(rec.reconcile(KEY, 0.05, "pods"))
    await asyncio.sleep(0)
    await rec.reconcile(KEY, cause="pddeployments")
    await waiting
    assert passes == ["pass"]
    await rec.reconcile(KEY, 0.05, "pods")
    assert passes == ["pass", "pass"]


async def test_a_failed_pass_leaves_the_asks_it_took_to_run_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod event waits; a spec change's pass begins after it and fails (an API error): the
    pod event's wait ends in a pass of its own, as if the failed one had never run."""
    cluster = FakeCluster(body())
    rec = Reconciler(cluster, cluster, OperatorSettings(), cluster.emit)
    passes: list[str] = []

    async def one_pass(key: tuple[str, str]) -> None:
        passes.append("pass")
        if len(passes) == 1:
            raise RuntimeError("the API server answered 503")

    monkeypatch.setattr(rec, "_reconcile_once", one_pass)
    waiting = asyncio.create_task(rec.reconcile(KEY, 0.05, "pods"))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await rec.reconcile(KEY, cause="pddeployments")
    await waiting
    assert passes == ["pass", "pass"]


def test_a_render_after_one_input_changed_keeps_every_childs_own_fingerprint() -> None:
    """A new render reuses the owned-fields fingerprints of the children that rendered the
    same; the ones that changed get new ones, as a fresh render would give them."""
    rec = reconciler_for(FakeCluster(body()))
    pdd = PDDeployment.from_body(body())
    first = RenderContext(rec.settings)
    rolled = replace(first, partitions={"decode": 1})
    before = rec._render(pdd, first).owned
    after = rec._render(pdd, rolled).owned

    def fresh(ctx: RenderContext) -> dict[Any, str]:
        return {child_key(o): rendered_fingerprint(o) for o in render_children(pdd, ctx)}

    assert after == fresh(rolled)
    changed = {key[1:] for key in after if after[key] != before[key]}
    assert changed == {("StatefulSet", "llama-decode")}


def test_a_namesake_created_again_gets_fingerprints_of_its_own() -> None:
    """Deleted and created again under the same name before a pass saw it gone: children
    that render the same but for their owner reference (the uid) are fingerprinted anew."""
    rec = reconciler_for(FakeCluster(body()))
    old = PDDeployment.from_body(body())
    again = PDDeployment.from_body({**body(), "metadata": {**body()["metadata"], "uid": "uid-2"}})
    ctx = RenderContext(rec.settings)
    rec._render(old, ctx)
    fresh = {child_key(o): rendered_fingerprint(o) for o in render_children(again, ctx)}
    assert rec._render(again, ctx).owned == fresh
