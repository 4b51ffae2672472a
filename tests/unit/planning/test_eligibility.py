"""Node eligibility by nodeSelector and taints: the scheduler's rule, and the planner counting
room only on nodes a role's pods may go to (pure: no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus
from pdd_operator.planning.compact import compact_node
from pdd_operator.planning.eligibility import (
    GPU_TOLERATION,
    RoleNodes,
    Taint,
    Toleration,
    hard_taints,
    role_nodes,
)
from pdd_operator.planning.node_facts import node_facts
from pdd_operator.planning.placement import (
    Fleet,
    NodeFacts,
    fits_domain,
    plan_placement,
    ranked_domains,
)
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.roles import render_pod_template

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


def test_an_operator_kubernetes_does_not_know_tolerates_nothing() -> None:
    assert not Toleration("dedicated", "Gt", "team-a").tolerates(DEDICATED)


def test_gpu_pods_tolerate_the_gpu_taint_and_carry_the_toleration() -> None:
    """Nodes tainted nvidia.com/gpu:NoSchedule are room for the GPU pods, which the renderer
    gives that toleration whatever the podTemplate says; DRA's pods request no nvidia.com/gpu
    and get neither."""
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    pdd = make_pdd({"prefill": {"podTemplate": {"spec": {"tolerations": []}}}})
    assert role_nodes(pdd.spec.prefill).accepts({}, (gpu,))
    assert not role_nodes(pdd.spec.prefill).accepts({}, (DEDICATED,))
    assert not role_nodes(pdd.spec.prefill, gpu_pods=False).accepts({}, (gpu,))
    rendered = render_pod_template(pdd, "prefill", RenderContext())["spec"]["tolerations"]
    assert rendered == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    dra = make_pdd({"topology": {"dra": {"enabled": True}}})
    assert "tolerations" not in render_pod_template(dra, "decode", RenderContext())["spec"]


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
    assert asks.tolerations == (Toleration("other", "Exists"), GPU_TOLERATION)
    assert role_nodes(spec.decode) == RoleNodes(tolerations=(GPU_TOLERATION,))


@pytest.mark.parametrize(
    "role",
    [
        {"nodeSelector": {"pool": "a"}, "tolerations": [TOLERATE_DEDICATED]},
        {
            "nodeSelector": {"pool": "a", "zone": "z1"},
            "tolerations": [TOLERATE_DEDICATED],
            "podTemplate": {"spec": {"nodeSelector": {"zone": "z2"}, "tolerations": None}},
        },
        {
            "nodeSelector": {"pool": "a"},
            "podTemplate": {
                "spec": {"nodeSelector": None, "tolerations": [{"operator": "Exists"}]}
            },
        },
    ],
)
def test_what_the_planner_reads_is_what_the_pods_get(role: dict[str, Any]) -> None:
    pdd = make_pdd({"prefill": role})
    pod = render_pod_template(pdd, "prefill", RenderContext())["spec"]
    asks = role_nodes(pdd.spec.prefill)
    assert dict(asks.node_selector) == (pod.get("nodeSelector") or {})
    rendered = [
        Toleration(
            t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""), t.get("effect", "")
        )
        for t in pod["tolerations"]
    ]
    assert asks.tolerations == tuple(rendered)


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
        "to spec.prefill.tolerations"
    )
    result = plan(spec_of(tolerant, {**tolerant, "nodeSelector": {"pool": "x"}}), nodes)
    assert result.message == (
        "none of the 3 ready nodes takes the decode pods: 3 nodes without the label pool=x "
        "(p1, t1 and t2); change spec.decode.nodeSelector or label the nodes"
    )
    templated = {  # the podTemplate's tolerations replace the role's
        "tolerations": [TOLERATE_DEDICATED],
        "podTemplate": {"spec": {"tolerations": [{"key": "x", "operator": "Exists"}]}},
    }
    result = plan(spec_of(templated, tolerant), nodes)
    assert result.message.endswith(
        "(p1); add the toleration to spec.prefill.podTemplate.spec.tolerations (they replace "
        "spec.prefill.tolerations)"
    )


TOLERANT = {"tolerations": [TOLERATE_DEDICATED]}


@pytest.mark.parametrize("names", [("a-u", "z-t"), ("z-u", "a-t")])
def test_a_role_fills_the_nodes_only_it_may_use_first(names: tuple[str, str]) -> None:
    """Prefill may use both nodes, decode only the untainted one: however the names sort,
    prefill takes the tainted node and leaves the other to decode."""
    untainted, tainted = names
    nodes = [gpu_node(untainted, "c", 8), gpu_node(tainted, "c", 8, DEDICATED)]
    spec = spec_of(prefill={**TOLERANT, "gpusPerInstance": 8}, decode={"gpusPerInstance": 8})
    result = plan(spec, nodes)
    assert (result.reason, result.nodes) == ("Placed", tuple(sorted(names)))


def test_a_larger_group_leaves_the_shared_node_to_the_smaller_one() -> None:
    """Prefill 2 x 4 GPUs may use both nodes, decode 1 x 4 only the untainted one."""
    nodes = [gpu_node("a", "c", 8), gpu_node("b", "c", 4, DEDICATED)]
    spec = spec_of(prefill={**TOLERANT, "replicas": 2}, decode={})
    assert plan(spec, nodes).reason == "Placed"


def test_a_kept_domain_where_one_role_can_never_fit_is_let_go() -> None:
    """Decode (8 GPUs) may use only the 4-GPU node of clique c: the sum of c's GPUs (20)
    would hold the slice, its nodes never will; the slice goes to d."""
    nodes = [
        gpu_node("c-t1", "c", 0, DEDICATED),
        gpu_node("c-t2", "c", 0, DEDICATED),
        NodeFacts("c-u", {CLIQUE: "c"}, 4, 0),
        gpu_node("d-t", "d", 8, DEDICATED),
        gpu_node("d-u", "d", 8),
    ]
    spec = spec_of(prefill={**TOLERANT, "gpusPerInstance": 8}, decode={"gpusPerInstance": 8})
    previous = PlacementStatus(level=CLIQUE, domain="c")
    result = plan_placement(spec, Fleet(nodes), previous)
    assert (result.reason, result.placement.domain) == ("Placed", "d")


def test_a_slice_running_in_its_domain_stays_when_its_nodes_seem_to_refuse_it() -> None:
    """The pods run on nodes whose taint the spec does not tolerate (a Kueue flavor or a
    webhook gave them the toleration): the scheduler admitted them, the slice is not moved."""
    nodes = [gpu_node("t1", "c", 0, DEDICATED), gpu_node("f1", "d", 8)]
    previous = PlacementStatus(level=CLIQUE, domain="c")
    result = plan_placement(spec_of(), Fleet(nodes), previous, own={"t1": 8})
    assert (result.reason, result.placement.domain) == ("Placed", "c")
    assert result.message.startswith("prefill and decode running in")


def test_a_slice_scaled_to_zero_keeps_to_the_nodes_its_roles_may_use() -> None:
    """At zero replicas the roles still ask what they asked: the tolerating slice's domains
    are the tainted ones, where it grows back."""
    nodes = [gpu_node("t1", "c", 8, DEDICATED), gpu_node("u1", "d", 16)]
    zero = spec_of({**TOLERANT, "replicas": 0}, {**TOLERANT, "replicas": 0})
    fleet = Fleet(nodes)
    assert ranked_domains(zero, fleet, CLIQUE) == ["c", "d"]
    assert fits_domain(spec_of(TOLERANT, TOLERANT), fleet, CLIQUE, "c")
    assert not fits_domain(spec_of(), fleet, CLIQUE, "c")
    assert ranked_domains(spec_of(), fleet, CLIQUE) == ["d"]


def test_dra_pods_on_nodes_with_the_gpu_taint_are_told_which_taint_keeps_them_off() -> None:
    """With DRA the pods request no nvidia.com/gpu and get no toleration for its taint: the
    refusal names that taint, as the room count does."""
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    dra = make_pdd(
        {
            "prefill": {"replicas": 1, "gpusPerInstance": 4},
            "decode": {"replicas": 1, "gpusPerInstance": 4},
            "topology": {"placement": "required", "dra": {"enabled": True}},
        }
    ).spec
    result = plan(dra, [gpu_node("g1", "c", 8, gpu), gpu_node("g2", "c", 8, gpu)])
    assert result.reason == "NoEligibleNodes"
    assert "the taint nvidia.com/gpu=present:NoSchedule" in result.message
