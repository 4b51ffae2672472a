"""What the operator watches, and how: kopf only PDDeployments; the informers every other
kind, our own objects selected by our label on the API server, Nodes and bound pods whole."""

from __future__ import annotations

from kopf._core.intents.registries import get_default_registry

import pdd_operator.handlers.operator  # noqa: F401  (registers the kopf handlers)
from pdd_operator.informers.fleet import FleetState, fleet_collections
from pdd_operator.informers.owned import OwnedObjects, owned_collections
from pdd_operator.kube.resources import CHILD_KINDS

OURS = ("labelSelector", "app.kubernetes.io/managed-by=pdd-operator")


def kopf_resources() -> set[tuple[str, str]]:
    registry = get_default_registry()
    regs = (registry._indexing, registry._watching, registry._spawning, registry._changing)
    selectors = {h.selector for reg in regs for h in reg.get_all_handlers()}
    return {(s.group or "", s.plural or s.any_name or "") for s in selectors if s is not None}


def test_kopf_handles_pddeployments_only_and_indexes_nothing() -> None:
    assert kopf_resources() == {("pdd.dev", "pddeployments")}
    assert not list(get_default_registry()._indexing.get_all_handlers())


def test_every_own_kind_is_label_selected_and_confined_to_the_namespaces_given() -> None:
    collections = owned_collections(OwnedObjects(), ("a", "b"), "m", None)
    plurals = {c.path.rsplit("/", 1)[-1] for c in collections}
    assert {k.plural for k in CHILD_KINDS} | {"pods", "replicasets", "pddrolescalers"} == plurals
    assert all(c.selectors == (OURS,) for c in collections)
    assert {c.path.split("/namespaces/")[1].split("/")[0] for c in collections} == {"a", "b"}
    assert len(collections) == 2 * len(plurals)


def test_nodes_whole_and_others_pods_bound_to_a_node() -> None:
    nodes, pods = fleet_collections(FleetState())
    assert (nodes.path, nodes.selectors) == ("/api/v1/nodes", ())
    assert (pods.path, pods.selectors) == (
        "/api/v1/pods",
        (
            ("fieldSelector", "spec.nodeName!="),
            ("labelSelector", "app.kubernetes.io/managed-by!=pdd-operator"),
        ),
    )
