"""A component's own identity in the deployment's namespace: a ServiceAccount, a Role with
exactly the rules it needs, and the RoleBinding between them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_account(
    account: str, namespace: str, meta: Mapping[str, Any], rules: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, all named ``account``."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": dict(meta),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [dict(rule) for rule in rules],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]
