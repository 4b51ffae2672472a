"""What the operator asks the apiserver to send: only its own objects of every kind whose
handlers all want only those (a server-side label selector), so another tenant's
StatefulSets, Services, Secrets... never reach it. Read from the apiserver's audit log,
which records the operator's lists and watches with their request URIs."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from helpers.operator_proc import OPERATOR_USER, OperatorProcess
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane

OURS = "app.kubernetes.io/managed-by=pdd-operator"
BOUND = "spec.nodeName!="
NOT_OURS = "app.kubernetes.io/managed-by!=pdd-operator"
# The selected kinds this control plane serves (Workload and PodGroup need feature gates or
# Volcano; kopf does not watch what is not served).
SELECTED = (
    "statefulsets",
    "services",
    "deployments",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "networkpolicies",
    "poddisruptionbudgets",
    "resourceclaimtemplates",
    "replicasets",
    "pddrolescalers",
)


def label_selectors(control_plane: LocalControlPlane, resource: str) -> list[str]:
    """The labelSelector of each list and watch of `resource` by the operator ("" for none)."""
    return [
        parse_qs(urlsplit(uri).query).get("labelSelector", [""])[0]
        for _, uri in control_plane.reads_by(OPERATOR_USER, resource)
    ]


@pytest.mark.parametrize("resource", SELECTED)
def test_the_operator_asks_only_for_its_own_objects(
    control_plane: LocalControlPlane, operator: OperatorProcess, resource: str
) -> None:
    selectors = wait_for(
        lambda: label_selectors(control_plane, resource), 30, what=f"a watch of {resource}"
    )
    assert set(selectors) == {OURS}


def selectors(control_plane: LocalControlPlane, resource: str) -> set[tuple[str, str]]:
    """(labelSelector, fieldSelector) of each list and watch of `resource` by the operator."""
    found = set()
    for _, uri in control_plane.reads_by(OPERATOR_USER, resource):
        query = parse_qs(urlsplit(uri).query)
        found.add((query.get("labelSelector", [""])[0], query.get("fieldSelector", [""])[0]))
    return found


def test_pods_come_as_our_own_and_as_bound_ones_for_the_gpu_count(
    control_plane: LocalControlPlane, operator: OperatorProcess
) -> None:
    """The watch of our pods is label-selected; the fleet watch asks for every other pod
    bound to a node (GPU capacity), never for pods still pending, and never for ours again."""
    both = {(OURS, ""), (NOT_OURS, BOUND)}
    found = wait_for(
        lambda: (s := selectors(control_plane, "pods")) >= both and s,
        30,
        what="both watches of pods",
    )
    assert found == both


def test_nodes_are_watched_whole_once(
    control_plane: LocalControlPlane, operator: OperatorProcess
) -> None:
    """Every Node is the fleet; this also shows the audit log would show a read without a
    selector."""
    found = wait_for(lambda: selectors(control_plane, "nodes"), 30, what="a watch of nodes")
    assert found == {("", "")}


def test_events_come_only_as_those_about_statefulsets_and_failed_mounts(
    control_plane: LocalControlPlane, operator: OperatorProcess
) -> None:
    """Events carry no label of ours: the API server selects those about StatefulSets (for
    why pods were refused) and the pods' FailedMount (a deleted token Secret), and a pass
    reads none."""
    both = {
        ("", "involvedObject.kind=StatefulSet"),
        ("", "involvedObject.kind=Pod,reason=FailedMount"),
    }
    found = wait_for(
        lambda: (s := selectors(control_plane, "events")) >= both and s,
        30,
        what="both watches of events",
    )
    assert found == both
