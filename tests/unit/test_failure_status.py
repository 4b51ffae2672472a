"""Failures outside the operator's children, in status (pure): pods the API server refuses to
create (the controller's FailedCreate Events), pods on a Node that no longer exists, and the
nodes the engine pods are on now."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.planning.placement import Placement, PlacementResult
from pdd_operator.status.compute import Observed, PodProblem, WorkloadState, compute_status
from pdd_operator.status.conditions import find
from pdd_operator.status.observe import PodSummary, pod_nodes, pod_problems
from pdd_operator.status.refusals import Refusal, creation_refusal

T0 = "2026-01-01T00:00:00Z"
QUOTA = (
    'pods "llama-prefill-0" is forbidden: exceeded quota: gpus, requested: '
    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=0, limited: "
    "requests.nvidia.com/gpu=0"
)
REFUSED = {
    "reason": "FailedCreate",
    "message": f"create Pod llama-prefill-0 in StatefulSet llama-prefill failed error: {QUOTA}",
    "lastTimestamp": "2026-01-01T00:00:05Z",
}
CREATED = {
    "reason": "SuccessfulCreate",
    "message": "create Pod llama-prefill-0 in StatefulSet llama-prefill successful",
    "lastTimestamp": "2026-01-01T00:00:09Z",
}


@pytest.mark.parametrize(
    "events,expected",
    [
        ([], ""),
        ([REFUSED], QUOTA),  # the API server's answer, without the controller's preamble
        ([REFUSED, CREATED], ""),  # created since (the quota was raised): over
        ([CREATED, {**REFUSED, "lastTimestamp": "2026-01-01T00:00:10Z"}], QUOTA),
        ([{**REFUSED, "message": "webhook said no"}], "webhook said no"),
        ([{"reason": "SuccessfulDelete", "lastTimestamp": "2026-01-01T00:01:00Z"}], ""),
        # events.k8s.io writers: eventTime, and a series' last occurrence.
        (
            [
                {**CREATED, "lastTimestamp": None, "eventTime": "2026-01-01T00:00:09.000000Z"},
                {**REFUSED, "series": {"lastObservedTime": "2026-01-01T00:00:20.000000Z"}},
            ],
            QUOTA,
        ),
    ],
)
def test_the_newest_pod_creation_decides(events: list[dict[str, Any]], expected: str) -> None:
    assert creation_refusal(events) == expected


def pod(name: str, node: str, role: str = "decode", ready: bool = True) -> PodSummary:
    return PodSummary(name, f"uid-{name}", role, node, ready, "r1", None)


def nodes(ready: dict[str, bool]) -> Any:
    return ready.get


def test_a_pod_on_a_node_that_no_longer_exists_is_a_problem_even_while_it_says_ready() -> None:
    problems = pod_problems([pod("d-0", "gone"), pod("d-1", "n1")], nodes({"n1": True}))
    assert [(p.pod, p.reason) for p in problems] == [("d-0", "NodeLost")]
    assert "node gone no longer exists" in problems[0].message
    assert "kubectl delete pod d-0" in problems[0].message


def test_an_unbound_pod_is_not_on_a_lost_node() -> None:
    assert pod_problems([pod("d-0", "", ready=False)], nodes({})) == []


def test_pod_nodes_are_the_existing_nodes_of_engine_pods() -> None:
    pods = [
        pod("p-0", "n2", "prefill"),
        pod("d-0", "n1"),
        pod("d-1", "n1"),
        pod("d-2", "gone"),
        pod("r-0", "n3", "router"),  # the router holds no GPU: not part of the slice
        pod("d-3", ""),
    ]
    assert pod_nodes(pods, nodes({"n1": True, "n2": False, "n3": True})) == ("n1", "n2")


def short(desired: int = 1) -> WorkloadState:
    return WorkloadState(True, desired, 0, 0, "r1", "r1", 1, 1, pods=0)


def test_refused_pods_are_degraded_and_stalled_with_the_api_servers_answer() -> None:
    pdd = make_pdd()
    refusal = Refusal("prefill", "llama-prefill", QUOTA)
    observed = Observed(
        workloads={"prefill": short(), "decode": short()},
        wanted={"prefill": 1, "decode": 1},
        pod_problems=[PodProblem("llama-decode-0", "decode", "Unschedulable", "no GPUs")],
        refusals=[refusal],
    )
    status = compute_status(pdd, observed, T0)
    degraded = find(status.conditions, "Degraded")
    stalled = find(status.conditions, "Stalled")
    assert degraded is not None and stalled is not None
    assert (degraded.status, degraded.reason) == ("True", "PodsRefused")
    assert degraded.message == f"pods of llama-prefill cannot be created: {QUOTA}"
    assert (stalled.status, stalled.reason) == ("True", "PodsRefused")


def placed(*on: str) -> PlacementResult:
    where = Placement("required", "nvidia.com/gpu.clique", "c1")
    return PlacementResult(True, where, "Placed", "m", on)


def test_placement_nodes_follow_the_pods_once_they_are_bound() -> None:
    pdd = make_pdd()
    before = compute_status(pdd, Observed(placement=placed("n1", "n2")), T0)
    assert before.placement.nodes == ["n1", "n2"]  # nothing bound yet: the planner's choice
    pdd = pdd.model_copy(update={"status": before})
    moved = compute_status(pdd, Observed(placement=placed("n1", "n2"), pod_nodes=("n2", "n3")), T0)
    assert moved.placement.nodes == ["n2", "n3"]
    assert (moved.placement.level, moved.placement.domain) == ("nvidia.com/gpu.clique", "c1")
