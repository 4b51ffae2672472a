"""The operator's RBAC covers every kind it renders as a child, with every verb it uses on
them, whichever way the chart grants it: a ClusterRole, or a Role per watched namespace. The
rules come from kube.resources.CHILD_KINDS through `make generate`
(templates/_child-rules.tpl); this checks the chart as helm renders it, so a rule left out of
rbac.yaml's include, or a stale generated file, fails here (and as a 403 in
test_manifests_rbac)."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_operator.kube.resources import CHILD_KINDS, CHILD_VERBS

from .support import Helm

OPERATOR_ACCOUNT = "pdd-operator"


def granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(API group, resource) -> the verbs the rules grant on it."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                verbs.setdefault((group, resource), set()).update(rule.get("verbs", []))
    return verbs


def operator_roles(
    docs: list[dict[str, Any]], kind: str, namespaces: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The operator's own ClusterRole, or its Role in each watched namespace: those bound to
    its ServiceAccount (its leader election's Role in its own namespace is not one)."""
    bound = {
        (d["metadata"].get("namespace"), d["roleRef"]["name"])
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s.get("name") == OPERATOR_ACCOUNT for s in d.get("subjects", []))
    }
    return [
        d
        for d in docs
        if d["kind"] == kind
        and (d["metadata"].get("namespace"), d["metadata"]["name"]) in bound
        and (kind == "ClusterRole" or d["metadata"].get("namespace") in namespaces)
    ]


WATCHED = ("team-a", "team-b")


@pytest.mark.parametrize(
    ("values", "kind", "expected"),
    [
        ((), "ClusterRole", 1),
        (("--set", "watchNamespaces={team-a,team-b}"), "Role", len(WATCHED)),
    ],
    ids=["cluster-wide", "watched-namespaces"],
)
def test_every_child_kind_is_granted_every_verb_the_operator_uses(
    helm: Helm, values: tuple[str, ...], kind: str, expected: int
) -> None:
    roles = operator_roles(helm.template(*values), kind, WATCHED)
    assert len(roles) == expected, f"{kind}s bound to the operator's ServiceAccount: {roles}"
    for role in roles:
        verbs = granted(role["rules"])
        for child in CHILD_KINDS:
            missing = set(CHILD_VERBS) - verbs.get((child.group, child.plural), set())
            assert not missing, f"{role['metadata']['name']}: {child.kind} lacks {missing}"
