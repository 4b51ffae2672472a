"""The operator's server-side label selectors: only on kinds whose every kopf handler filters
on our label (kopf applies a resource's selector to all of its handlers)."""

from __future__ import annotations

import kopf
from kopf._core.intents.registries import get_default_registry

from pdd_operator.handlers.operator import MANAGED, OWN_LABELLED_KINDS, watch_only_ours

OURS = "app.kubernetes.io/managed-by=pdd-operator"


def resource(group: str, version: str, plural: str) -> kopf.Resource:
    return kopf.Resource(group, version, plural)


def handlers_of(res: kopf.Resource) -> list[object]:
    registry = get_default_registry()
    regs = (registry._indexing, registry._watching, registry._spawning, registry._changing)
    return [h for reg in regs for h in reg.get_all_handlers() if h.selector.check(res)]


def test_each_selected_kind_gets_our_label_selector_and_nothing_else_does() -> None:
    settings = kopf.OperatorSettings()
    watch_only_ours(settings)
    for kind in OWN_LABELLED_KINDS:
        res = resource(kind.group, kind.version, kind.plural)
        assert settings.watching.label_selectors.collect(res) == [OURS], kind.plural
    nodes = resource("", "v1", "nodes")
    assert settings.watching.label_selectors.collect(nodes) == []
    pdds = resource("pdd.dev", "v1alpha1", "pddeployments")
    assert settings.watching.label_selectors.collect(pdds) == []


def test_every_handler_of_a_selected_kind_filters_on_our_label() -> None:
    """Else the selector would hide from a handler objects it wants."""
    for kind in OWN_LABELLED_KINDS:
        found = handlers_of(resource(kind.group, kind.version, kind.plural))
        assert found, kind.plural
        assert all(h.labels == MANAGED for h in found), kind.plural


def test_kopf_watches_no_nodes_and_only_our_pods() -> None:
    """Every Node and every bound pod come from the fleet watch (handlers/fleet.py): kopf's
    per-object handling of them kept a realistic fleet from ever being reconciled."""
    assert handlers_of(resource("", "v1", "nodes")) == []
    pods = handlers_of(resource("", "v1", "pods"))
    assert pods and all(h.labels == MANAGED for h in pods)
