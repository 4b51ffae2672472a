"""The fleet watch's pure parts: the compact store it keeps, and how a watch stream is read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.informers.fleet import FleetCache, FleetState
from pdd_operator.kube.client import WatchExpired, _json_lines, _watch_error
from pdd_operator.kube.decoding import WHOLE
from pdd_operator.planning.node_facts import GpuUsage, gpu_usage
from pdd_operator.status.observe import PodSummary, summarize_pod


def node(name: str, gpus: int = 8, ready: str = "True", heartbeat: str = "t0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"pdd.test/x": "1"}},
        "status": {
            "allocatable": {GPU_RESOURCE: str(gpus), "cpu": "64"},
            "conditions": [
                {"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat},
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
            ],
        },
    }


def pod(uid: str, node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    limits = {GPU_RESOURCE: str(gpus)} if gpus else {}
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": uid},
        "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def test_a_heartbeat_changes_nothing_kept_and_so_no_version() -> None:
    state = FleetState()
    state.nodes.apply("ADDED", node("n1"))
    version = state.nodes.version
    state.nodes.apply("MODIFIED", node("n1", heartbeat="t1"))
    assert state.nodes.version == version
    state.nodes.apply("MODIFIED", node("n1", ready="False", heartbeat="t2"))
    assert state.nodes.version == version + 1
    assert state.nodes.get("n1")["status"]["conditions"] == [{"type": "Ready", "status": "False"}]


def test_pods_without_gpus_or_finished_are_not_kept_nor_counted() -> None:
    state = FleetState()
    state.pod_store().apply("ADDED", pod("a", "n1", gpus=0))
    state.pod_store().apply("ADDED", pod("b", "n1", gpus=2))
    assert len(state.pod_store()) == 1
    assert state.gpus.usage().used == {"n1": 2}
    state.pod_store().apply("MODIFIED", pod("b", "n1", gpus=2, phase="Succeeded"))
    assert len(state.pod_store()) == 0
    assert state.gpus.usage() == GpuUsage({}, {})


def test_deleted_and_relisted_objects_leave_the_store() -> None:
    state = FleetState()
    for name in ("n1", "n2", "n3"):
        state.nodes.apply("ADDED", node(name))
    state.nodes.apply("DELETED", node("n1"))
    state.nodes.reset([node("n2")])  # n3 went while no watch ran
    assert [n["metadata"]["name"] for n in state.nodes.values()] == ["n2"]


def test_the_fleet_is_rebuilt_when_a_node_changes_even_within_its_max_age() -> None:
    state = FleetState()
    cache = FleetCache(state, max_age=3600)
    state.nodes.apply("ADDED", node("n1", gpus=8))
    assert [n.name for n in cache.fleet().nodes] == ["n1"]
    state.nodes.apply("ADDED", node("n2", gpus=8))
    assert sorted(n.name for n in cache.fleet().nodes) == ["n1", "n2"]


def test_watch_lines_are_decoded_across_chunk_boundaries() -> None:
    events = [{"type": "ADDED", "object": {"n": i}} for i in range(3)]
    stream = "\n".join(json.dumps(e) for e in events).encode()
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    assert list(_json_lines(chunks, WHOLE.event)) == events


def test_a_410_status_means_list_again_and_anything_else_is_an_error() -> None:
    gone = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version: 1 (5012)"}  # fmt: skip
    assert isinstance(_watch_error("/api/v1/nodes", gone), WatchExpired)
    other = {"kind": "Status", "status": "Failure", "reason": "InternalError", "code": 500,
             "message": "etcd is down"}  # fmt: skip
    error = _watch_error("/api/v1/nodes", other)
    assert not isinstance(error, WatchExpired)
    with pytest.raises(RuntimeError, match="etcd is down"):
        raise error


def test_our_pods_gpus_come_from_the_owned_summaries_as_the_others_come_from_the_store() -> None:
    """The fleet watch leaves our pods out; their summaries count the same GPUs, held by
    their deployment, and none once they failed or while unbound."""
    state = FleetState()
    state.nodes.apply("ADDED", node("n1", gpus=8))
    state.pod_store().apply("ADDED", pod("theirs", "n1", gpus=2))
    ours = [
        (summary("kv-prefill-0", "n1", gpus=2), ("team-a", "kv")),
        (summary("kv-decode-0", "n1", gpus=4), ("team-a", "kv")),
        (summary("kv-decode-1", "", gpus=4), ("team-a", "kv")),  # not bound yet
        (summary("kv-decode-2", "n1", gpus=4, failed=True), ("team-a", "kv")),
    ]
    for summary_, key in ours:
        state.own_pod(summary_.uid, summary_, key)
    fleet = FleetCache(state).fleet()
    assert [(n.name, n.used_gpus) for n in fleet.nodes] == [("n1", 8)]
    assert fleet.held == {("team-a", "kv"): {"n1": 6}}


def summary(name: str, node_name: str, gpus: int, failed: bool = False) -> PodSummary:
    return PodSummary(name, f"uid-{name}", "decode", node_name, True, "r", None, gpus=gpus,
                      failed=failed)  # fmt: skip


def test_a_pod_summary_carries_its_effective_gpu_request() -> None:
    body = pod("p", "n1", gpus=3)
    body["metadata"]["annotations"] = {}
    assert summarize_pod(body).gpus == 3


@pytest.mark.parametrize(("label", "expected"), [(None, 0), ("2", 2), ("x", 0)])
def test_a_pod_summary_carries_the_slice_it_serves(label: str | None, expected: int) -> None:
    body = pod("p", "n1", gpus=1)
    if label is not None:
        body["metadata"]["labels"] = {"pdd.dev/slice": label}
    assert summarize_pod(body).slice == expected


@pytest.mark.parametrize(
    ("ready", "since", "expected"),
    [("True", "2026-12-02T20:01:24Z", 1796241684.0), ("False", "2026-12-02T20:01:24Z", 0.0),
     ("True", "not a time", 0.0)],
)  # fmt: skip
def test_a_pod_summary_says_since_when_the_pod_is_ready(
    ready: str, since: str, expected: float
) -> None:
    body = pod("p", "n1", gpus=1)
    body["status"] = {
        "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": since}]
    }
    summary = summarize_pod(body)
    assert (summary.ready, summary.ready_since) == (ready == "True", expected)


def test_an_own_pod_that_went_or_failed_holds_nothing_any_more() -> None:
    state = FleetState()
    prefill = summary("kv-prefill-0", "n1", gpus=2)
    state.own_pod(prefill.uid, prefill, ("team-a", "kv"))
    state.own_pod("uid-kv-decode-0", summary("kv-decode-0", "n2", gpus=4), ("team-a", "kv"))
    state.own_pod(prefill.uid, None, None)
    failed = summary("kv-decode-0", "n2", gpus=4, failed=True)
    assert state.gpus.usage().held == {("team-a", "kv"): {"n2": 4}}
    state.own_pod(failed.uid, failed, ("team-a", "kv"))
    assert state.gpus.usage() == GpuUsage({}, {})


def test_the_snapshot_is_rebuilt_only_when_gpu_use_or_a_node_changed() -> None:
    state = FleetState()
    cache = FleetCache(state, max_age=0)
    state.nodes.apply("ADDED", node("n1", gpus=8))
    first = cache.fleet()
    assert cache.fleet() is first  # nothing changed: the planner's domains stay grouped
    state.pod_store().apply("ADDED", pod("a", "n1", gpus=3))
    assert [n.used_gpus for n in cache.fleet().nodes] == [3]
    within = FleetCache(state, max_age=3600)
    assert [n.used_gpus for n in within.fleet().nodes] == [3]
    state.pod_store().apply("DELETED", pod("a", "n1", gpus=3))
    assert [n.used_gpus for n in within.fleet().nodes] == [3]  # a second stale at most


def labelled_pod(uid: str, node_name: str, gpus: int, phase: str, owner: str) -> dict[str, Any]:
    body = pod(uid, node_name, gpus, phase)
    body["metadata"]["labels"] = {LABEL_DEPLOYMENT: owner} if owner else {}
    return body


UIDS = st.sampled_from(["a", "b", "c", "d"])
POD_STATES = st.builds(
    labelled_pod,
    UIDS,
    st.sampled_from(["", "n1", "n2"]),
    st.integers(0, 3),
    st.sampled_from(["Pending", "Running", "Succeeded"]),
    st.sampled_from(["", "kv", "other"]),
)
EVENTS = st.one_of(
    st.tuples(st.sampled_from(["ADDED", "MODIFIED"]), POD_STATES),
    st.tuples(st.just("DELETED"), POD_STATES),
    st.tuples(st.just("RELIST"), st.lists(POD_STATES, unique_by=lambda p: p["metadata"]["uid"])),
)


@given(st.lists(EVENTS, max_size=30))
def test_the_ledger_kept_on_each_event_counts_what_a_recount_of_the_live_pods_counts(
    events: list[tuple[str, Any]],
) -> None:
    state = FleetState()
    live: dict[str, dict[str, Any]] = {}
    for what, body in events:
        if what == "RELIST":
            state.pod_store().reset(body)
            live = {p["metadata"]["uid"]: p for p in body}
        else:
            state.pod_store().apply(what, body)
            live.pop(body["metadata"]["uid"], None)
            if what != "DELETED":
                live[body["metadata"]["uid"]] = body
    assert state.gpus.usage() == gpu_usage(live.values(), LABEL_DEPLOYMENT)
