"""Simulated GPU nodes: their specs, fleets of them, and the Node objects sent to the apiserver.

Pure: nothing here talks to the apiserver."""

from __future__ import annotations

import ipaddress
import string
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdd_contract.resources import GPU_RESOURCE

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
KUBELET_VERSION = "v1.35.4"
# The kernel and driver of an HGX H100 node where GPUDirect RDMA through dma-buf works
# (kernel >= 5.12, open kernel module); tests that need a worse node override the labels.
KERNEL = ("6", "8", "6.8.0-60-generic")
DRIVER = ("570", "133", "20")

Json = dict[str, Any]


def gpu_node_labels(
    gpus: int = 8, clique: str = "clique-a", product: str = GPU_PRODUCT
) -> dict[str, str]:
    """The GPU-feature-discovery and node-feature-discovery labels of an HGX node."""
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.clique": clique,
        "nvidia.com/cuda.driver-version.major": DRIVER[0],
        "nvidia.com/cuda.driver-version.minor": DRIVER[1],
        "nvidia.com/cuda.driver-version.revision": DRIVER[2],
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "8",
        "feature.node.kubernetes.io/kernel-version.major": KERNEL[0],
        "feature.node.kubernetes.io/kernel-version.minor": KERNEL[1],
        "feature.node.kubernetes.io/kernel-version.full": KERNEL[2],
    }


def gpu_node_capacity(gpus: int = 8) -> dict[str, str]:
    return {
        GPU_RESOURCE: str(gpus),
        "cpu": "128",
        "memory": "2Ti",
        "pods": "256",
        "ephemeral-storage": "3500Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }


@dataclass(frozen=True)
class SimNode:
    """One simulated node. The defaults describe an 8-GPU H100 HGX node; `allocatable`
    defaults to `capacity`. The kubelet's own labels (hostname, os, arch) are always added."""

    name: str
    labels: Mapping[str, str] = field(default_factory=gpu_node_labels)
    annotations: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=gpu_node_capacity)
    allocatable: Mapping[str, str] | None = None
    taints: Sequence[Mapping[str, str]] = ()

    def all_labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.labels,
        }


def clique_name(index: int) -> str:
    """clique-a ... clique-z, clique-aa, ... (spreadsheet columns), so names sort by index
    within the first 26 and stay short for thousands."""
    letters = ""
    n = index + 1
    while n:
        n, rem = divmod(n - 1, 26)
        letters = string.ascii_lowercase[rem] + letters
    return f"clique-{letters}"


def gpu_fleet(
    cliques: int,
    nodes_per_clique: int,
    gpus: int = 8,
    racks_per_clique: int = 1,
    zone: str = "zone-a",
    extra_labels: Callable[[int, str], Mapping[str, str]] | None = None,
    name_prefix: str = "gpu",
) -> list[SimNode]:
    """`cliques` NVLink domains of `nodes_per_clique` nodes each, named `gpu-a-00`, ...

    Each clique spans `racks_per_clique` racks (`topology.kubernetes.io/rack`), nodes dealt
    round-robin; all are in `zone`. `extra_labels(index, name)` adds or overrides labels of the
    node with that fleet-wide index."""
    width = max(2, len(str(nodes_per_clique - 1)))
    nodes = []
    for c in range(cliques):
        clique = clique_name(c)
        for i in range(nodes_per_clique):
            index = c * nodes_per_clique + i
            name = f"{name_prefix}-{clique.removeprefix('clique-')}-{i:0{width}d}"
            labels = {
                **gpu_node_labels(gpus, clique),
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/rack": f"rack-{clique.removeprefix('clique-')}-"
                f"{i % racks_per_clique}",
            }
            if extra_labels:
                labels.update(extra_labels(index, name))
            nodes.append(SimNode(name, labels=labels, capacity=gpu_node_capacity(gpus)))
    return nodes


SIMULATED_RANGE = ipaddress.ip_network("198.18.0.0/15")


class IpPool:
    """Hands out simulated addresses upward from `first` inside 198.18.0.0/15, skipping .0 and
    .255 (they read as network/broadcast addresses to people and some tools). Thread-safe;
    never reuses one."""

    def __init__(self, first: str) -> None:
        self._next = int(ipaddress.IPv4Address(first))
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            while self._next & 0xFF in (0, 255):
                self._next += 1
            addr = ipaddress.IPv4Address(self._next)
            if addr not in SIMULATED_RANGE:
                raise RuntimeError("simulated address pool exhausted")
            self._next += 1
            return str(addr)

    def __iter__(self) -> Iterator[str]:
        while True:
            yield self.allocate()


def node_ready_condition(ready: bool, reason: str, message: str, now: str) -> Json:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def node_conditions(now: str) -> list[Json]:
    pressure = [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ]
    conds = [
        {
            "type": t,
            "status": "False",
            "reason": r,
            "message": r,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t, r in pressure
    ]
    return [
        *conds,
        node_ready_condition(True, "KubeletReady", "kubelet is posting ready status", now),
    ]


def node_status(node: SimNode, ip: str, now: str) -> Json:
    labels = node.all_labels()
    return {
        "capacity": dict(node.capacity),
        "allocatable": dict(node.allocatable if node.allocatable is not None else node.capacity),
        "conditions": node_conditions(now),
        "addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": node.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": node.name,
            "systemUUID": node.name,
            "bootID": node.name,
            "kernelVersion": labels.get(
                "feature.node.kubernetes.io/kernel-version.full", KERNEL[2]
            ),
            "osImage": "Ubuntu 24.04.2 LTS",
            "containerRuntimeVersion": "containerd://2.0.0-sim",
            "kubeletVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def node_object(node: SimNode, ip: str, now: str) -> Json:
    """The full Node, status included: the apiserver keeps a Node's status on create (unlike
    most kinds), so one POST registers a ready node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": node.all_labels(),
            "annotations": {"pdd.dev/simulated": "true", **node.annotations},
        },
        "spec": {"providerID": f"sim://{node.name}", "taints": [dict(t) for t in node.taints]},
        "status": node_status(node, ip, now),
    }


NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def taints_for_readiness(taints: Sequence[Mapping[str, Any]], ready: bool) -> list[Json]:
    """What the node-lifecycle controller would do (it is not running here): a NotReady node
    gets the not-ready NoSchedule taint, a Ready one loses it."""
    kept = [dict(t) for t in taints if t.get("key") != NOT_READY_TAINT["key"]]
    return kept if ready else [*kept, dict(NOT_READY_TAINT)]
