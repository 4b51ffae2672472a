"""The security contexts of every pod and container the operator renders: what Pod Security
admission judges a namespace's level by (docs/security.md, "Pod Security levels").

Every pod asks for the container runtime's default seccomp profile, every container drops all
capabilities and never escalates, and the operator's own containers and the router run as a
non-root user. The engine is the exception it cannot avoid: its image decides its user (vLLM's
and SGLang's run as root), and RDMA needs IPC_LOCK to pin memory.
"""

from __future__ import annotations

from typing import Any

# The pdd images' USER (Dockerfile). Set explicitly: the kubelet cannot verify runAsNonRoot
# against an image whose USER is a name, and a router image of the user's may run as root.
NON_ROOT_UID = 65532


def _runtime_default() -> dict[str, str]:
    return {"type": "RuntimeDefault"}


def pod_security_context() -> dict[str, Any]:
    """At pod level, so containers a podTemplate adds are confined too."""
    return {"seccompProfile": _runtime_default()}


def engine_security_context(capabilities: list[str]) -> dict[str, Any]:
    """No runAsNonRoot: the image's user is the engine's (a podTemplate may add it)."""
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": capabilities},
    }


def non_root_security_context(read_only_root: bool) -> dict[str, Any]:
    """The preflight's, the sidecar's and the router's. The seccomp profile is repeated here
    because a podTemplate may change the pod's, and these containers are the operator's."""
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": _runtime_default(),
    }
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context
