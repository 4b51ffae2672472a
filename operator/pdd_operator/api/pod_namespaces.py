"""Which namespaces a PDDeployment's prefill and decode pods share on one node (pure).

Prefill and decode are always separate pods. When both run in the host's PID namespace
(``hostPID`` through their podTemplates) UCX's cuda_ipc and cma lanes are not stopped by the
PID namespace, but each pod keeps its own IPC and mount namespaces and /dev/shm ("host-pid");
with ``hostIPC`` in both as well, only the mount namespace stays apart ("host-pid-ipc").
Rendering, the engines' wiring and the KV-path check all read the same answer.
"""

from __future__ import annotations

from pdd_contract.env import KvPeerBoundary
from pdd_operator.api.v1alpha1 import PDDeploymentSpec


def peer_boundary(spec: PDDeploymentSpec) -> KvPeerBoundary:
    """What separates a prefill engine from a decode engine on one node."""
    if not _both_roles_set(spec, "hostPID"):
        return "pod"
    return "host-pid-ipc" if _both_roles_set(spec, "hostIPC") else "host-pid"


def shares_pid_namespace(spec: PDDeploymentSpec) -> bool:
    """Whether cuda_ipc can reach from one role's pods to the other's on one node."""
    return peer_boundary(spec) != "pod"


def _both_roles_set(spec: PDDeploymentSpec, field: str) -> bool:
    """Whether both roles' podTemplates set this pod field (hostPID, hostIPC) to true."""
    return all(
        bool(((role.podTemplate or {}).get("spec") or {}).get(field))
        for role in (spec.prefill, spec.decode)
    )
