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


@pytest.mark.parametrize("resource", ["pods", "nodes"])
def test_pods_and_nodes_are_still_watched_whole(
    control_plane: LocalControlPlane, operator: OperatorProcess, resource: str
) -> None:
    """The GPU capacity index needs every bound pod and every Node; this also shows the
    audit log would show a watch without a selector."""
    selectors = wait_for(
        lambda: label_selectors(control_plane, resource), 30, what=f"a watch of {resource}"
    )
    assert "" in selectors
