"""Which Linux namespaces a pod's containers get, as a kubelet and runc give them.

A pod's containers share its IPC and UTS namespaces (held by the pod's sandbox process,
`pause.py`) and its /dev/shm; each container has a PID namespace of its own unless the pod
sets `shareProcessNamespace` (one PID namespace for the pod) or `hostPID` (the node's). This
matters for what crosses a pod boundary: UCX's `cuda_ipc` and `cma` lanes work only between
processes of one PID namespace, and SysV shared memory only within one IPC namespace.

The network is the exception: pods share the host's loopback, where the apiserver listens,
and the network shim (`netshim.c`) gives each pod its own address on it.

Pure: the pod spec in, a `PodNamespaces` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PidMode = Literal["container", "pod", "host"]

# A Linux host name is at most 64 bytes; the kubelet truncates the pod name to 63.
HOSTNAME_MAX = 63


@dataclass(frozen=True)
class PodNamespaces:
    """What the pod's sandbox creates and what its containers join."""

    pid: PidMode
    own_ipc: bool  # False with hostIPC: the node's IPC namespace and /dev/shm
    own_uts: bool  # False with hostNetwork: the node's host name
    hostname: str

    @property
    def pod_pid_namespace(self) -> bool:
        """Whether the sandbox holds a PID namespace that every container joins."""
        return self.pid == "pod"


def pod_namespaces(pod: Mapping[str, Any]) -> PodNamespaces:
    spec = pod.get("spec") or {}
    if spec.get("hostPID"):
        pid: PidMode = "host"
    elif spec.get("shareProcessNamespace"):
        pid = "pod"
    else:
        pid = "container"
    name = str(spec.get("hostname") or (pod.get("metadata") or {}).get("name") or "pod")
    return PodNamespaces(
        pid=pid,
        own_ipc=not spec.get("hostIPC"),
        own_uts=not spec.get("hostNetwork"),
        hostname=name[:HOSTNAME_MAX],
    )
