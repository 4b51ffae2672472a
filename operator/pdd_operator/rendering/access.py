"""A component's own identity in the deployment's namespace: a ServiceAccount, a Role with
exactly the rules it needs, and the RoleBinding between them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Where the kubelet's automount puts a pod's ServiceAccount credentials, and where the client
# libraries' in-cluster configuration looks for them.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_ACCESS_VOLUME = "pdd-kube-api-access"


def api_access_volume() -> dict[str, Any]:
    """What the ServiceAccount admission plugin adds to a pod that automounts its token (a
    bound, expiring token, the cluster CA, the namespace), as a volume of the pod's own: with
    automounting off, only the containers that mount it (`api_access_mount`) hold the
    credential, not every container of the pod."""
    return {
        "name": API_ACCESS_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


def api_access_mount() -> dict[str, Any]:
    return {"name": API_ACCESS_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}


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
