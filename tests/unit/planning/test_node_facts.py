"""Table-driven tests of NodeFacts built from raw Node and Pod objects."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_operator.planning.compact import compact_pod
from pdd_operator.planning.node_facts import gpu_usage, node_facts, pod_gpu_request, with_usage
from pdd_operator.planning.placement import NodeFacts

GPU = "nvidia.com/gpu"
OWN = ("pdd.dev/deployment", "llama")


def raw_node(
    name: str,
    gpus: Any = "8",
    ready: str | None = "True",
    unschedulable: bool | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"allocatable": {"cpu": "96", "memory": "2Ti"}}
    if gpus is not None:
        status["allocatable"][GPU] = gpus
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    status["conditions"] = conditions
    node: dict[str, Any] = {"metadata": {"name": name, "labels": labels or {}}, "status": status}
    if unschedulable is not None:
        node["spec"] = {"unschedulable": unschedulable}
    return node


def gpu(limit: Any = None, request: Any = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limit is not None:
        resources["limits"] = {GPU: limit, "cpu": "4"}
    if request is not None:
        resources["requests"] = {GPU: request, "memory": "8Gi"}
    return {"name": "c", "resources": resources, **extra}


def raw_pod(
    node: str | None,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if node is not None:
        spec["nodeName"] = node
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": {"labels": labels or {}}, "spec": spec, "status": {"phase": phase}}


SIDECAR = {"restartPolicy": "Always"}

REQUEST_CASES = [
    ("limits only", {"containers": [gpu(limit="2")]}, 2),
    ("requests only", {"containers": [gpu(request="3")]}, 3),
    ("requests win over limits", {"containers": [gpu(limit="4", request="2")]}, 2),
    ("integer quantity", {"containers": [gpu(limit=4)]}, 4),
    ("app containers add up", {"containers": [gpu(limit="2"), gpu(limit="2")]}, 4),
    ("no GPU", {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}, 0),
    ("no resources at all", {"containers": [{"name": "c"}]}, 0),
    ("invalid quantity counts nothing", {"containers": [gpu(limit="lots")]}, 0),
    ("suffix quantity", {"containers": [gpu(limit="1k")]}, 1000),
    (
        "init bigger than the app: max(init)",
        {"initContainers": [gpu(limit="4")], "containers": [gpu(limit="2")]},
        4,
    ),
    (
        "init smaller than the sum of the app containers",
        {"initContainers": [gpu(limit="1"), gpu(limit="3")], "containers": [gpu("2"), gpu("2")]},
        4,
    ),
    (
        "sidecar init container runs beside the app",
        {"initContainers": [gpu(limit="1", **SIDECAR)], "containers": [gpu(limit="2")]},
        3,
    ),
    (
        "regular init after a sidecar runs beside it",
        {
            "initContainers": [gpu(limit="1", **SIDECAR), gpu(limit="4")],
            "containers": [gpu(limit="2")],
        },
        5,
    ),
    (
        "regular init before a sidecar does not",
        {
            "initContainers": [gpu(limit="4"), gpu(limit="1", **SIDECAR)],
            "containers": [gpu(limit="2")],
        },
        4,
    ),
    ("pod overhead", {"containers": [gpu(limit="2")], "overhead": {GPU: "1"}}, 3),
]


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [(spec, expected) for _, spec, expected in REQUEST_CASES],
    ids=[c[0] for c in REQUEST_CASES],
)
def test_pod_gpu_request(pod_spec: dict[str, Any], expected: int) -> None:
    assert pod_gpu_request(pod_spec) == expected


NODES = [
    raw_node("n1", labels={"nvidia.com/gpu.clique": "clique-a"}),
    raw_node("n2", ready="False"),
    raw_node("n3", unschedulable=True),
    raw_node("n4", ready=None),
    raw_node("n5", gpus=None),
    raw_node("n6", unschedulable=False),
]
PODS = [
    raw_pod("n1", [gpu(limit="2")]),  # another workload: counted
    raw_pod("n1", [gpu(limit="1")], phase="Pending"),  # bound, not started yet: counted
    raw_pod("n1", [gpu(limit="4")], labels={OWN[0]: OWN[1], "app": "x"}),  # ours to re-place
    raw_pod("n1", [gpu(limit="8")], phase="Succeeded"),  # finished: GPUs are free again
    raw_pod("n1", [gpu(limit="8")], phase="Failed"),
    raw_pod(None, [gpu(limit="8")], phase="Pending"),  # unbound: holds no node's GPUs
    raw_pod("gone", [gpu(limit="8")]),  # bound to a node not in the list
    raw_pod("n2", [gpu(limit="2")], labels={OWN[0]: "other"}),  # other deployment: counted
    raw_pod("n6", [gpu(limit="8")]),
    raw_pod("n6", [gpu(limit="8")]),  # over-committed: free clamps at 0
]


def facts(
    name: str, used: int, ready: bool = True, schedulable: bool = True, **kw: Any
) -> NodeFacts:
    return NodeFacts(name, kw.get("labels", {}), kw.get("allocatable", 8), used, ready, schedulable)


def test_node_facts_of_the_nodes_alone() -> None:
    result = node_facts(iter(NODES))  # one pass: a generator works
    assert result == [
        facts("n1", 0, labels={"nvidia.com/gpu.clique": "clique-a"}),
        facts("n2", 0, ready=False),
        facts("n3", 0, schedulable=False),
        facts("n4", 0, ready=False),
        facts("n5", 0, allocatable=0),
        facts("n6", 0),
    ]


def test_with_usage_counts_every_bound_unfinished_pod() -> None:
    # Ours too: the planner tells its own GPUs apart by Fleet.held, not by leaving them out.
    result = with_usage(node_facts(NODES), gpu_usage(iter(PODS), OWN[0]).used)
    assert result == [
        facts("n1", 7, labels={"nvidia.com/gpu.clique": "clique-a"}),
        facts("n2", 2, ready=False),
        facts("n3", 0, schedulable=False),
        facts("n4", 0, ready=False),
        facts("n5", 0, allocatable=0),
        facts("n6", 16),
    ]
    assert [f.free_gpus for f in result] == [1, 6, 8, 8, 0, 0]  # over-committed clamps at 0


def test_a_recount_lends_the_unchanged_nodes_of_the_last_and_counts_the_rest_afresh() -> None:
    bases = node_facts(NODES)
    last = with_usage(bases, {"n1": 3, "n2": 2, "n3": 1})
    now = with_usage(bases, {"n1": 5, "n3": 1, "n6": 1}, last)
    assert now == with_usage(bases, {"n1": 5, "n3": 1, "n6": 1})
    assert now[1] == bases[1]  # n2's pods went: back to no GPU in use
    assert now[2] is last[2]  # n3: unchanged, the same object
    assert now[0] is not last[0] and now[0].used_gpus == 5


def test_labels_are_copied_not_shared() -> None:
    node = raw_node("n1", labels={"a": "1"})
    [fact] = node_facts([node])
    node["metadata"]["labels"]["a"] = "2"
    assert fact.labels == {"a": "1"}


def test_thousands_of_nodes_and_pods() -> None:
    # Correctness at fleet size; speed is measured by `make bench`, not asserted here.
    nodes = [raw_node(f"n{i}") for i in range(5000)]
    pods = [raw_pod(f"n{i % 5000}", [gpu(limit="1")]) for i in range(60000)]
    result = with_usage(node_facts(nodes), gpu_usage(pods).used)
    assert len(result) == 5000
    assert {f.used_gpus for f in result} == {12}


def test_gpus_held_per_deployment_match_the_pods_counted_as_used() -> None:
    in_ns = [{**pod, "metadata": {**pod["metadata"], "namespace": "team-a"}} for pod in PODS]
    in_ns.append(raw_pod("n2", [gpu(limit="2")], labels={OWN[0]: OWN[1]}))  # no namespace
    usage = gpu_usage(in_ns, OWN[0])
    assert usage.used == {"n1": 7, "n2": 4, "gone": 8, "n6": 16}
    assert usage.held == {
        ("team-a", "llama"): {"n1": 4},  # running; the finished and unbound ones hold nothing
        ("team-a", "other"): {"n2": 2},
        ("", "llama"): {"n2": 2},  # same name in another namespace: another deployment
    }


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [(spec, expected) for _, spec, expected in REQUEST_CASES],
    ids=[c[0] for c in REQUEST_CASES],
)
def test_a_compacted_pod_counts_the_gpus_its_whole_spec_requests(
    pod_spec: dict[str, Any], expected: int
) -> None:
    pod = {"metadata": {"namespace": "n", "labels": {}}, "spec": {**pod_spec, "nodeName": "x"}}
    kept = compact_pod(pod)
    if not expected:
        assert kept is None  # holds no GPU: not indexed
        return
    assert kept is not None and pod_gpu_request(kept["spec"]) == expected
    assert gpu_usage([kept]).used == gpu_usage([pod]).used == {"x": expected}
