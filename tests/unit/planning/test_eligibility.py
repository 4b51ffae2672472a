"""Node eligibility by nodeSelector and taints: the scheduler's rule, and the planner counting
room only on nodes a role's pods may go to (pure: no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus
from pdd_operator.planning.compact import compact_node
from pdd_operator.planning.eligibility import (
    RoleNodes,
    Taint,
    Toleration,
    hard_taints,
    role_nodes,
)
from pdd_operator.planning.node_facts import node_facts
from pdd_operator.planning.placement import Fleet, NodeFacts, plan_placement

CLIQUE = "nvidia.com/gpu.clique"
DEDICATED = Taint("dedicated", "team-a", "NoSchedule")
TOLERATE_DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "team-a"}


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("dedicated", "Equal", "team-a"), DEDICATED, True),
        (Toleration("dedicated", "Equal", "team-b"), DEDICATED, False),
        (Toleration("dedicated", "Exists"), DEDICATED, True),
        (Toleration("other", "Exists"), DEDICATED, False),
        (Toleration("", "Exists"), DEDICATED, True),  # an empty key with Exists: every taint
        (Toleration("dedicated", "Exists", effect="NoExecute"), DEDICATED, False),
        (Toleration("dedicated", "Exists", effect="NoSchedule"), DEDICATED, True),
        (Toleration("flag", "Equal", ""), Taint("flag", "", "NoExecute"), True),
    ],
)
def test_a_toleration_matches_a_taint_by_the_schedulers_rule(
    toleration: Toleration, taint: Taint, tolerated: bool
) -> None:
    assert toleration.tolerates(taint) is tolerated


def test_only_the_effects_that_refuse_a_pod_are_kept() -> None:
    raw = [
        {"key": "a", "value": "1", "effect": "NoSchedule"},
        {"key": "b", "effect": "PreferNoSchedule"},
        {"key": "c", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
        "not a taint",
    ]
    assert hard_taints(raw) == (Taint("a", "1", "NoSchedule"), Taint("c", "", "NoExecute"))
    assert hard_taints(None) == ()


def test_compact_nodes_keep_the_taints_the_planner_reads() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {CLIQUE: "c"}},
        "spec": {"taints": [{"key": "a", "value": "1", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    (facts,) = node_facts([compact_node(node)])
    assert facts.taints == (Taint("a", "1", "NoSchedule"),)


def test_the_admitted_tolerations_are_assumed() -> None:
    """ExtendedResourceToleration gives a GPU pod nvidia.com/gpu:NoSchedule (managed clusters
    taint their GPU nodes so); a NoSchedule taint of another key is refused."""
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    assert RoleNodes().accepts({}, (gpu,))
    assert not RoleNodes().accepts({}, (Taint("nvidia.com/gpu", "present", "NoExecute"),))
    assert not RoleNodes().accepts({}, (DEDICATED,))


def test_a_pod_template_replaces_the_tolerations_and_merges_the_node_selector() -> None:
    spec = make_pdd(
        {
            "prefill": {
                "nodeSelector": {"pool": "a", "zone": "z1"},
                "tolerations": [TOLERATE_DEDICATED],
                "podTemplate": {
                    "spec": {
                        "nodeSelector": {"zone": "z2"},
                        "tolerations": [{"key": "other", "operator": "Exists"}],
                    }
                },
            }
        }
    ).spec
    asks = role_nodes(spec.prefill)
    assert asks.node_selector == (("pool", "a"), ("zone", "z2"))
    assert asks.tolerations == (Toleration("other", "Exists"),)
    assert role_nodes(spec.decode) == RoleNodes()


def gpu_node(name: str, clique: str, free: int = 8, *taints: Taint, **labels: str) -> NodeFacts:
    return NodeFacts(name, {CLIQUE: clique, **labels}, 8, 8 - free, taints=taints)


def spec_of(prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None) -> Any:
    patch: dict[str, Any] = {
        "prefill": {"replicas": 1, "gpusPerInstance": 4, **(prefill or {})},
        "decode": {"replicas": 1, "gpusPerInstance": 4, **(decode or {})},
        "topology": {"placement": "required"},
    }
    return make_pdd(patch).spec


def plan(spec: PDDeploymentSpec, nodes: list[NodeFacts]) -> Any:
    return plan_placement(spec, Fleet(nodes), PlacementStatus())


def test_a_domain_of_nodes_the_pods_do_not_tolerate_is_not_room() -> None:
    """The tainted clique has the fewest free GPUs (best fit) but the pods may not go there."""
    nodes = [
        gpu_node("t1", "tainted", 8, DEDICATED),
        gpu_node("f1", "free", 8),
        gpu_node("f2", "free", 8),
    ]
    result = plan(spec_of(), nodes)
    assert (result.reason, result.placement.domain) == ("Placed", "free")
    tolerant = {"tolerations": [TOLERATE_DEDICATED]}
    result = plan(spec_of(tolerant, tolerant), nodes)
    assert (result.reason, result.placement.domain) == ("Placed", "tainted")


def test_each_role_is_packed_onto_the_nodes_it_may_go_to() -> None:
    """One clique: a tainted node only prefill tolerates, an untainted one with 4 free GPUs.
    The decode pod fits only the untainted node; prefill takes the tainted one."""
    nodes = [gpu_node("t1", "c", 8, DEDICATED), gpu_node("u1", "c", 4)]
    spec = spec_of(prefill={"tolerations": [TOLERATE_DEDICATED]})
    result = plan(spec, nodes)
    assert (result.reason, result.nodes) == ("Placed", ("t1", "u1"))
    # Decode asking twice as much no longer fits: the 8 free GPUs it sees are prefill's node.
    bigger = spec_of(prefill={"tolerations": [TOLERATE_DEDICATED]}, decode={"gpusPerInstance": 8})
    result = plan(bigger, nodes)
    assert result.reason == "InsufficientCapacity"
    assert "no node the decode pods may go to has 8 free" in result.message


def test_a_node_selector_keeps_a_role_to_the_labelled_nodes() -> None:
    nodes = [gpu_node("a1", "a", 8), gpu_node("b1", "b", 8, pool="big")]
    spec = spec_of(
        prefill={"nodeSelector": {"pool": "big"}}, decode={"nodeSelector": {"pool": "big"}}
    )
    result = plan(spec, nodes)
    assert (result.reason, result.placement.domain, result.nodes) == ("Placed", "b", ("b1",))


def test_a_role_no_node_takes_is_named_with_what_keeps_it_off() -> None:
    other = Taint("gpu-class", "h200", "NoExecute")
    nodes = [
        gpu_node("t2", "c", 8, DEDICATED),
        gpu_node("t1", "c", 8, DEDICATED),
        gpu_node("p1", "d", 8, other, pool="big"),
    ]
    tolerant = {"tolerations": [TOLERATE_DEDICATED, {"key": "gpu-class", "operator": "Exists"}]}
    result = plan(spec_of(decode=tolerant), nodes)
    assert result.reason == "NoEligibleNodes"
    assert result.message == (
        "none of the 3 ready nodes takes the prefill pods: 2 nodes with the taint "
        "dedicated=team-a:NoSchedule, which they do not tolerate (t1 and t2); 1 node with the "
        "taint gpu-class=h200:NoExecute, which they do not tolerate (p1); add the toleration "
        "to spec.prefill.tolerations, or change spec.prefill.nodeSelector"
    )
    result = plan(spec_of(tolerant, {**tolerant, "nodeSelector": {"pool": "x"}}), nodes)
    assert result.message.startswith(
        "none of the 3 ready nodes takes the decode pods: 3 nodes without the label pool=x "
        "(p1, t1 and t2);"
    )
