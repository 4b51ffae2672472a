"""Table-driven tests of the placement planner (pure: no cluster needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_contract.labels import LABEL_GPUDIRECT
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus
from pdd_operator.planning.placement import (
    Fleet,
    NodeFacts,
    Placement,
    PlacementResult,
    plan_placement,
)
from pdd_operator.rendering.roles import render_affinity

CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"
DEFAULT_LABELS = f"{CLIQUE}, {RACK} or {ZONE}"
DMABUF = ((LABEL_GPUDIRECT, ("dmabuf",)),)
PEERMEM = ((LABEL_GPUDIRECT, ("peermem",)),)
CAPABLE = ((LABEL_GPUDIRECT, ("dmabuf", "peermem")),)


def make_spec(
    prefill: tuple[int, int] = (2, 2),
    decode: tuple[int, int] = (4, 2),
    gpu_direct: str = "auto",
    rdma: bool = True,
    dra: bool = False,
    placement: str = "preferred",
    levels: list[str] | None = None,
) -> PDDeploymentSpec:
    """(replicas, gpusPerInstance) per role; the default is 2P/4D at tp 2: 12 GPUs."""
    patch: dict[str, Any] = {
        "prefill": {"replicas": prefill[0], "gpusPerInstance": prefill[1]},
        "decode": {"replicas": decode[0], "gpusPerInstance": decode[1]},
        "kvTransfer": {"gpuDirect": gpu_direct},
        "topology": {"placement": placement, "dra": {"enabled": dra}},
    }
    if rdma and not dra:
        patch["kvTransfer"]["rdma"] = {"resourceName": "rdma/rdma_shared_device_a"}
    if levels is not None:
        patch["topology"]["levels"] = levels
    return make_pdd(patch).spec


def node(
    name: str,
    gpudirect: str | None = None,
    clique: str | None = None,
    rack: str | None = None,
    free: int = 8,
    allocatable: int = 8,
    ready: bool = True,
    schedulable: bool = True,
) -> NodeFacts:
    labels = {
        key: value
        for key, value in ((LABEL_GPUDIRECT, gpudirect), (CLIQUE, clique), (RACK, rack))
        if value is not None
    }
    return NodeFacts(name, labels, allocatable, allocatable - free, ready, schedulable)


def two_cliques(
    a: tuple[str, ...] = ("dmabuf", "peermem", "peermem", "none"),
    b: tuple[str, ...] = ("dmabuf", "dmabuf", "peermem", "none"),
    free_a: tuple[int, ...] = (8, 8, 8, 8),
    free_b: tuple[int, ...] = (8, 8, 8, 8),
    rack_a: str | None = None,
    rack_b: str | None = None,
) -> list[NodeFacts]:
    """Two NVLink cliques of four 8-GPU nodes; clique-a has 1 dma-buf node, clique-b has 2."""
    a_nodes = [
        node(f"a{i + 1}", g, "clique-a", rack_a, f)
        for i, (g, f) in enumerate(zip(a, free_a, strict=True))
    ]
    b_nodes = [
        node(f"b{i + 1}", g, "clique-b", rack_b, f)
        for i, (g, f) in enumerate(zip(b, free_b, strict=True))
    ]
    return a_nodes + b_nodes


def placed(
    level: str,
    domain: str,
    message: str,
    nodes: tuple[str, ...],
    requirements: tuple[tuple[str, tuple[str, ...]], ...] = (),
    mode: str = "preferred",
) -> PlacementResult:
    return PlacementResult(
        placed=True,
        placement=Placement(mode, level, domain, requirements),
        reason="Placed",
        message=message,
        nodes=nodes,
    )


def not_placed(
    reason: str,
    message: str,
    requirements: tuple[tuple[str, tuple[str, ...]], ...] = (),
    mode: str = "preferred",
) -> PlacementResult:
    return PlacementResult(
        placed=False,
        placement=Placement(mode=mode, node_requirements=requirements),
        reason=reason,
        message=message,
    )


@dataclass(frozen=True)
class Case:
    id: str
    spec: PDDeploymentSpec
    nodes: list[NodeFacts]
    expected: PlacementResult
    previous: PlacementStatus = field(default_factory=PlacementStatus)


def msg(
    domain: str, needed: int, free: int, count: int, adjective: str, level: str = CLIQUE
) -> str:
    return (
        f"prefill and decode placed in {level}={domain} "
        f"({needed} GPUs needed, {free} free on {count} {adjective} nodes)"
    )


CASES = [
    # --- GPUDirect eligibility --------------------------------------------------------------
    Case(
        "dmabuf: the clique whose dma-buf nodes fit 12 GPUs (b: 2 nodes), not a (1 node)",
        make_spec(gpu_direct="dmabuf"),
        two_cliques(),
        placed(
            CLIQUE, "clique-b", msg("clique-b", 12, 16, 2, "dma-buf-capable"), ("b1", "b2"), DMABUF
        ),
    ),
    Case(
        "peermem: clique-a has two peermem nodes, clique-b one",
        make_spec(gpu_direct="peermem"),
        two_cliques(),
        placed(
            CLIQUE, "clique-a", msg("clique-a", 12, 16, 2, "peermem-capable"), ("a2", "a3"), PEERMEM
        ),
    ),
    Case(
        "auto with an RDMA resource: dmabuf or peermem; equal cliques tie by name",
        make_spec(gpu_direct="auto"),
        two_cliques(),
        placed(
            CLIQUE,
            "clique-a",
            msg("clique-a", 12, 24, 3, "GPUDirect-capable"),
            ("a1", "a2"),
            CAPABLE,
        ),
    ),
    Case(
        "auto with DRA NICs counts as RDMA in use",
        make_spec(gpu_direct="auto", dra=True),
        two_cliques(a=("none", "none", "none", "peermem")),
        placed(
            CLIQUE,
            "clique-b",
            msg("clique-b", 12, 24, 3, "GPUDirect-capable"),
            ("b1", "b2"),
            CAPABLE,
        ),
    ),
    Case(
        "auto without RDMA: no GPUDirect filter",
        make_spec(gpu_direct="auto", rdma=False),
        two_cliques(a=("none",) * 4, b=("none",) * 4, free_a=(8, 8, 8, 0)),
        placed(CLIQUE, "clique-a", msg("clique-a", 12, 24, 4, "ready"), ("a1", "a2")),
    ),
    Case(
        "auto with RDMA but no node has the label (no topology agent): no filter",
        make_spec(gpu_direct="auto"),
        [node(f"a{i}", None, "clique-a", free=4) for i in (1, 2, 3)],
        placed(CLIQUE, "clique-a", msg("clique-a", 12, 12, 3, "ready"), ("a1", "a2", "a3")),
    ),
    Case(
        "off: no filter even where every node says none",
        make_spec(gpu_direct="off"),
        two_cliques(a=("none",) * 4, b=("none",) * 4, free_a=(8, 8, 8, 0)),
        placed(CLIQUE, "clique-a", msg("clique-a", 12, 24, 4, "ready"), ("a1", "a2")),
    ),
    Case(
        "auto with RDMA: once the agent labels some nodes, unlabeled nodes are not eligible",
        make_spec(gpu_direct="auto"),
        [node("a1", "dmabuf", "clique-a"), node("a2", None, "clique-a")]
        + [node(f"b{i}", None, "clique-b") for i in (1, 2)],
        not_placed(
            "InsufficientCapacity",
            f"no {CLIQUE} has 12 free GPUs on GPUDirect-capable nodes; largest has 8",
            CAPABLE,
        ),
    ),
    Case(
        "first-fit fills the nodes with the most free GPUs first",
        make_spec(gpu_direct="off"),
        two_cliques(free_a=(4, 8, 6, 2), free_b=(0, 0, 0, 0)),
        placed(CLIQUE, "clique-a", msg("clique-a", 12, 20, 4, "ready"), ("a2", "a3")),
    ),
    Case(
        "not ready and cordoned nodes are not counted",
        make_spec(gpu_direct="off"),
        [
            node("a1", clique="clique-a", ready=False),
            node("a2", clique="clique-a", schedulable=False),
            node("a3", clique="clique-a"),
            node("b1", clique="clique-b"),
            node("b2", clique="clique-b"),
        ],
        placed(CLIQUE, "clique-b", msg("clique-b", 12, 16, 2, "ready"), ("b1", "b2")),
    ),
    # --- choosing the domain ----------------------------------------------------------------
    Case(
        "best fit: the smaller clique that still fits (b, 16 free) over the bigger (a, 32)",
        make_spec(gpu_direct="off"),
        two_cliques(free_b=(8, 8, 0, 0)),
        placed(CLIQUE, "clique-b", msg("clique-b", 12, 16, 4, "ready"), ("b1", "b2")),
    ),
    Case(
        "best fit skips a smaller clique that does not fit",
        make_spec(gpu_direct="off"),
        two_cliques(free_b=(8, 0, 0, 0)),
        placed(CLIQUE, "clique-a", msg("clique-a", 12, 32, 4, "ready"), ("a1", "a2")),
    ),
    Case(
        "stickiness: the previous clique is kept while it fits, though b is the best fit",
        make_spec(gpu_direct="off"),
        two_cliques(free_b=(8, 8, 0, 0)),
        placed(CLIQUE, "clique-a", msg("clique-a", 12, 32, 4, "ready"), ("a1", "a2")),
        PlacementStatus(level=CLIQUE, domain="clique-a"),
    ),
    Case(
        # Other pods hold clique-a for now; moving would re-roll every pod, and two slices
        # waiting for each other's clique would swap forever. The slice waits where it is.
        "stickiness holds while the previous clique could ever fit, waiting for GPUs",
        make_spec(gpu_direct="off"),
        two_cliques(free_a=(8, 0, 0, 0)),
        PlacementResult(
            placed=True,
            placement=Placement(mode="preferred", level=CLIQUE, domain="clique-a"),
            reason="WaitingForCapacity",
            message="prefill and decode kept in nvidia.com/gpu.clique=clique-a: waiting for "
            "GPUs there (12 needed, 8 free now, 32 in all)",
        ),
        PlacementStatus(level=CLIQUE, domain="clique-a"),
    ),
    Case(
        "a previous level no longer in spec.topology.levels is not sticky",
        make_spec(gpu_direct="off", levels=[CLIQUE]),
        [*two_cliques(free_b=(8, 8, 0, 0)), node("z1", clique="clique-z")],
        placed(CLIQUE, "clique-b", msg("clique-b", 12, 16, 4, "ready"), ("b1", "b2")),
        PlacementStatus(level="example.com/pod", domain="clique-a"),
    ),
    Case(
        "rack fallback: no clique has 12 dma-buf GPUs, their rack has 16",
        make_spec(gpu_direct="dmabuf"),
        two_cliques(b=("dmabuf", "none", "none", "none"), rack_a="r1", rack_b="r1"),
        placed(RACK, "r1", msg("r1", 12, 16, 2, "dma-buf-capable", RACK), ("a1", "b1"), DMABUF),
    ),
    Case(
        "placement required is carried into the Placement",
        make_spec(gpu_direct="dmabuf", placement="required"),
        two_cliques(),
        placed(
            CLIQUE,
            "clique-b",
            msg("clique-b", 12, 16, 2, "dma-buf-capable"),
            ("b1", "b2"),
            DMABUF,
            mode="required",
        ),
    ),
    Case(
        "a role with no replicas is left out of the slice and the message",
        make_spec(prefill=(0, 8), decode=(3, 4), gpu_direct="off"),
        two_cliques(free_b=(8, 4, 0, 0)),
        PlacementResult(
            True,
            Placement("preferred", CLIQUE, "clique-b"),
            "Placed",
            f"decode placed in {CLIQUE}=clique-b (12 GPUs needed, 12 free on 4 ready nodes)",
            ("b1", "b2"),
        ),
    ),
    # --- nothing fits ------------------------------------------------------------------------
    Case(
        "too big for any clique",
        make_spec(gpu_direct="dmabuf"),
        two_cliques(b=("dmabuf", "none", "none", "none")),
        not_placed(
            "InsufficientCapacity",
            f"no {CLIQUE} has 12 free GPUs on dma-buf-capable nodes; largest has 8",
            DMABUF,
        ),
    ),
    Case(
        "fragmentation: 16 free in 4-GPU pieces cannot hold two 8-GPU instances",
        make_spec(prefill=(1, 8), decode=(1, 8), gpu_direct="off"),
        two_cliques(free_a=(4, 4, 4, 4), free_b=(4, 4, 0, 0)),
        not_placed(
            "InsufficientCapacity",
            f"no {CLIQUE} has 16 free GPUs on ready nodes; largest has 16 but no node has 8 free",
        ),
    ),
    Case(
        "fragmentation: only one node has room for an 8-GPU instance",
        make_spec(prefill=(1, 8), decode=(1, 8), gpu_direct="off"),
        two_cliques(free_a=(8, 4, 4, 4), free_b=(0, 0, 0, 0)),
        not_placed(
            "InsufficientCapacity",
            f"no {CLIQUE} has 16 free GPUs on ready nodes; largest has 20 but its nodes fit "
            "only 1 of the 2 8-GPU instances",
        ),
    ),
    Case(
        "fragmentation: the smaller instances find no room after the bigger ones",
        make_spec(prefill=(1, 8), decode=(2, 4), gpu_direct="off"),
        two_cliques(free_a=(8, 3, 3, 3), free_b=(0, 0, 0, 0)),
        not_placed(
            "InsufficientCapacity",
            f"no {CLIQUE} has 16 free GPUs on ready nodes; largest has 17 but after the 8-GPU "
            "instances no node has 4 free",
        ),
    ),
    Case(
        "no eligible node: nothing is dma-buf capable",
        make_spec(gpu_direct="dmabuf"),
        two_cliques(a=("peermem",) * 4, b=("none", "none", "peermem", "peermem")),
        not_placed(
            "NoEligibleNodes",
            "no node is dma-buf capable: GPUDirect dma-buf needs Linux >= 5.12 and the NVIDIA "
            "open kernel module; set spec.kvTransfer.gpuDirect to auto or peermem. Ready GPU "
            f"nodes: {LABEL_GPUDIRECT}=none on b1 and b2; {LABEL_GPUDIRECT}=peermem on a1, a2, "
            "a3 and 3 more",
            DMABUF,
        ),
    ),
    Case(
        "no eligible node: dmabuf forced and no topology agent labels",
        make_spec(gpu_direct="dmabuf"),
        [node("a1", clique="clique-a")],
        not_placed(
            "NoEligibleNodes",
            "no node is dma-buf capable: GPUDirect dma-buf needs Linux >= 5.12 and the NVIDIA "
            "open kernel module; set spec.kvTransfer.gpuDirect to auto or peermem. No ready GPU "
            f"node carries {LABEL_GPUDIRECT}: is the pdd topology agent running?",
            DMABUF,
        ),
    ),
    Case(
        "no eligible node: auto with RDMA and only none nodes",
        make_spec(gpu_direct="auto"),
        [node("a1", "none", "clique-a"), node("a2", None, "clique-a")],
        not_placed(
            "NoEligibleNodes",
            "no node is GPUDirect RDMA capable: dma-buf needs Linux >= 5.12 and the NVIDIA open "
            "kernel module, peermem needs the nvidia-peermem module; set "
            "spec.kvTransfer.gpuDirect to off to move KV blocks through host memory. Ready GPU "
            f"nodes: {LABEL_GPUDIRECT}=none on a1; {LABEL_GPUDIRECT}=unknown on a2",
            CAPABLE,
        ),
    ),
    Case(
        "no eligible node: every GPU node is down or cordoned",
        make_spec(gpu_direct="off"),
        [
            node("a1", ready=False),
            node("a2", schedulable=False),
            node("cpu1", allocatable=0, free=0),
        ],
        not_placed(
            "NoEligibleNodes",
            "none of the 2 GPU nodes is ready and schedulable (1 not ready, 1 cordoned)",
        ),
    ),
    Case(
        "no eligible node: no GPUs in the cluster",
        make_spec(gpu_direct="off"),
        [node("cpu1", allocatable=0, free=0)],
        not_placed(
            "NoEligibleNodes",
            "no node has nvidia.com/gpu allocatable: install the NVIDIA device plugin (e.g. with "
            "the GPU operator) and check that the GPU nodes joined the cluster",
        ),
    ),
    # --- no placement / no labels ------------------------------------------------------------
    Case(
        "placement none",
        make_spec(gpu_direct="dmabuf", placement="none"),
        two_cliques(),
        PlacementResult(
            True,
            Placement(mode="none"),
            "PlacementDisabled",
            "spec.topology.placement is none: the scheduler puts prefill and decode pods on any "
            "node",
        ),
        PlacementStatus(level=CLIQUE, domain="clique-a"),
    ),
    Case(
        "no topology labels but the slice fits across the cluster",
        make_spec(gpu_direct="dmabuf"),
        [node(f"n{i}", "dmabuf", free=4) for i in (1, 2, 3)] + [node("n4", "none")],
        PlacementResult(
            True,
            Placement("preferred", node_requirements=DMABUF),
            "NoTopologyLabels",
            f"no dma-buf-capable node carries {DEFAULT_LABELS}, so the pods are not kept in one "
            "topology domain (12 GPUs needed, 12 free on the 3 dma-buf-capable nodes); label the "
            "nodes (GPU feature discovery sets nvidia.com/gpu.clique) or set spec.topology.levels",
            ("n1", "n2", "n3"),
        ),
    ),
    Case(
        "no topology labels and the cluster is too small",
        make_spec(gpu_direct="off"),
        [node("n1")],
        not_placed(
            "InsufficientCapacity",
            f"not enough free GPUs: 12 needed, 8 free on the 1 ready node; no ready node carries "
            f"{DEFAULT_LABELS}",
        ),
    ),
    Case(
        "empty levels: nothing to group by",
        make_spec(gpu_direct="off", levels=[]),
        two_cliques(),
        PlacementResult(
            True,
            Placement("preferred"),
            "NoTopologyLabels",
            "spec.topology.levels is empty, so the pods are not kept in one topology domain (12 "
            "GPUs needed, 64 free on the 8 ready nodes); label the nodes (GPU feature discovery "
            "sets nvidia.com/gpu.clique) or set spec.topology.levels",
            ("a1", "a2"),
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_placement(case: Case) -> None:
    assert plan_placement(case.spec, case.nodes, case.previous) == case.expected


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_shared_fleet_index_plans_exactly_like_the_node_list(case: Case) -> None:
    fleet = Fleet(case.nodes)
    assert plan_placement(case.spec, fleet, case.previous) == case.expected
    assert plan_placement(case.spec, fleet, case.previous) == case.expected  # cached: same


def test_own_pods_count_as_free_without_changing_the_shared_index() -> None:
    spec = make_spec(gpu_direct="off")  # 12 GPUs
    # Half of it runs in clique-b (6 on b1, being rolled): with them b has room for all 12.
    nodes = two_cliques(free_a=(8, 8, 0, 0), free_b=(2, 8, 0, 0))
    own = {"b1": 6}
    adjusted = [
        NodeFacts(n.name, n.labels, n.allocatable_gpus, n.used_gpus - own.get(n.name, 0))
        for n in nodes
    ]
    fleet = Fleet(nodes)
    previous = PlacementStatus(level=CLIQUE, domain="clique-b")
    with_own = plan_placement(spec, fleet, previous, own=own)
    assert with_own == plan_placement(spec, adjusted, previous)
    assert (with_own.reason, with_own.placement.domain) == ("Placed", "clique-b")
    # The same index, asked for a deployment without pods there, still sees clique-b full.
    other = plan_placement(spec, fleet, PlacementStatus())
    assert other.placement.domain == "clique-a"
    assert fleet.domains((), CLIQUE, {})[-1].free == 16  # clique-a: most free, sorted last


def test_unplaced_slice_still_only_goes_to_eligible_nodes() -> None:
    result = plan_placement(
        make_spec(gpu_direct="dmabuf", placement="required"),
        two_cliques(b=("dmabuf", "none", "none", "none")),
        PlacementStatus(),
    )
    assert not result.placed
    assert render_affinity(result.placement) == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": LABEL_GPUDIRECT, "operator": "In", "values": ["dmabuf"]}
                        ]
                    }
                ]
            }
        }
    }


def test_placed_slice_becomes_domain_affinity() -> None:
    result = plan_placement(make_spec(gpu_direct="dmabuf"), two_cliques(), PlacementStatus())
    terms = render_affinity(result.placement)["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms == [
        {
            "weight": 100,
            "preference": {
                "matchExpressions": [
                    {"key": CLIQUE, "operator": "In", "values": ["clique-b"]},
                    {"key": LABEL_GPUDIRECT, "operator": "In", "values": ["dmabuf"]},
                ]
            },
        }
    ]


def test_large_cluster_is_planned() -> None:
    # 8192 nodes: 1024 cliques of 8, 128 racks, 16 zones; a 96-GPU slice fits no clique of
    # 64 GPUs, so every clique is tried before the rack level answers.
    nodes = [
        NodeFacts(
            f"n{i:05d}",
            {
                CLIQUE: f"c{i // 8:04d}",
                RACK: f"r{i // 64:03d}",
                ZONE: f"z{i // 512:02d}",
                LABEL_GPUDIRECT: "dmabuf",
            },
            8,
            0 if i % 3 else 4,
        )
        for i in range(8192)
    ]
    spec = make_spec(prefill=(4, 8), decode=(8, 8))
    result = plan_placement(spec, nodes, PlacementStatus())
    assert (result.placed, result.placement.level, result.placement.domain) == (True, RACK, "r000")
    assert len(result.nodes) == 12


def test_gpus_reserved_by_a_slice_planned_just_before_are_not_counted_twice() -> None:
    spec = make_spec(gpu_direct="off")
    nodes = two_cliques(free_b=(8, 8, 0, 0))  # b is the best fit for 12 GPUs...
    alone = plan_placement(spec, nodes, PlacementStatus())
    assert alone.placement.domain == "clique-b"
    # ...unless another slice was just placed there and its pods are not bound yet.
    busy = plan_placement(spec, nodes, PlacementStatus(), reserved={(CLIQUE, "clique-b"): 12})
    assert busy.placement.domain == "clique-a"


def test_a_refused_slice_leaves_its_kept_domain_only_for_one_with_room_now() -> None:
    spec = make_spec(gpu_direct="off")  # 12 GPUs
    previous = PlacementStatus(level=CLIQUE, domain="clique-b")
    taken = two_cliques(free_b=(2, 2, 2, 2))  # another slice took clique-b meanwhile
    kept = plan_placement(spec, taken, previous)
    assert (kept.reason, kept.placement.domain) == ("WaitingForCapacity", "clique-b")
    # The scheduler refused one of its pods and clique-a has 32 GPUs free: move there.
    moved = plan_placement(spec, taken, previous, unschedulable=True)
    assert (moved.reason, moved.placement.domain) == ("Placed", "clique-a")
    # Refused, but no other domain has room either: keep waiting where it is.
    full = two_cliques(free_a=(2, 2, 2, 2), free_b=(2, 2, 2, 2))
    waiting = plan_placement(spec, full, previous, unschedulable=True)
    assert (waiting.reason, waiting.placement.domain) == ("WaitingForCapacity", "clique-b")


def test_a_slice_whose_pods_hold_every_gpu_it_needs_is_placed_where_they_run() -> None:
    """However full its domain is around them (other tenants come and go), the status says
    the same: a slice that serves is never "waiting for GPUs"."""
    spec = make_spec(gpu_direct="off")  # 12 GPUs: 2 prefill of 2, 2 decode of 4
    previous = PlacementStatus(level=CLIQUE, domain="clique-b")
    own = {"b1": 6, "b2": 6}
    for free_b in ((0, 0, 0, 0), (1, 1, 3, 0), (8, 8, 8, 8)):
        used_by_others = two_cliques(free_b=free_b)
        nodes = [
            NodeFacts(n.name, n.labels, n.allocatable_gpus, n.used_gpus + own.get(n.name, 0))
            if n.name in own else n
            for n in used_by_others
        ]  # fmt: skip
        result = plan_placement(spec, nodes, previous, own=own)
        assert (result.reason, result.placement.domain, result.nodes) == (
            "Placed", "clique-b", ("b1", "b2")
        )  # fmt: skip
        assert result.message == (
            "prefill and decode running in nvidia.com/gpu.clique=clique-b (12 GPUs on 2 nodes)"
        )


def test_preferred_placement_says_what_runs_outside_the_domain() -> None:
    spec = make_spec(gpu_direct="off")
    previous = PlacementStatus(level=CLIQUE, domain="clique-b")
    own = {"b1": 6, "b2": 4, "a1": 2}  # the scheduler put one prefill pod in clique-a
    result = plan_placement(spec, two_cliques(free_b=(0, 0, 0, 0)), previous, own=own)
    assert (result.reason, result.placement.domain) == ("Placed", "clique-b")
    assert result.message.endswith("(12 GPUs on 2 nodes; 2 on nodes outside it, as preferred "
                                   "placement allows)")  # fmt: skip
    required = make_spec(gpu_direct="off", placement="required")  # cannot be: not trusted
    assert plan_placement(required, two_cliques(free_b=(0, 0, 0, 0)), previous, own=own).reason \
        == "WaitingForCapacity"  # fmt: skip


@pytest.mark.parametrize(
    "own",
    [{}, {"a2": 4}, {"b1": 8, "a1": 2}, {"gone": 8}],
    ids=["no-own-pods", "own-in-a", "own-in-both", "own-on-a-node-not-listed"],
)
@pytest.mark.parametrize("values", [(), ("dmabuf",)])
def test_a_domain_looked_up_by_name_is_the_one_domains_lists(
    own: dict[str, int], values: tuple[str, ...]
) -> None:
    fleet = Fleet(two_cliques(free_a=(8, 4, 2, 0), free_b=(0, 6, 8, 8)))
    listed = {d.name: d for d in fleet.domains(values, CLIQUE, own)}
    for name in ("clique-a", "clique-b", "clique-z"):
        assert fleet.domain(values, CLIQUE, name, own) == listed.get(name)
