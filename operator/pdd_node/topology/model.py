"""The node topology model: GPUs, RDMA NICs, how far apart they sit on PCIe, and whether
GPUDirect RDMA works on the node.

The node agent builds it from sysfs/procfs (`scan.py`) and publishes it on the Node
(`annotation.py`); the planner and the preflight container read it. Field names are part of
the `v1` annotation format: renaming one is a schema change.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdd_contract.labels import GpuDirectMode

SCHEMA_VERSION: Literal["v1"] = "v1"

# nvidia-smi's `topo -m` classes for a GPU-NIC pair, nearest first. PIX: at most one PCIe
# switch between them; PXB: several switches, no host bridge; PHB: through one PCIe host
# bridge (root complex); NODE: across host bridges of one NUMA node; SYS: across sockets.
DistanceClass = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]
DISTANCE_CLASSES: tuple[DistanceClass, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")

PORT_ACTIVE = "ACTIVE"

# Domain may be wider than 4 hex digits (Intel VMD domains look like 10000:01:00.0).
_PCI_ADDRESS = r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
_PCIE_ROOT = r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$"
_NIC_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Gpu(_Frozen):
    """One NVIDIA GPU (a PCI function of class 3D or VGA controller)."""

    index: int = Field(ge=0, description="NVML / nvidia-smi index: position in PCI bus order")
    pci_address: str = Field(pattern=_PCI_ADDRESS, description="e.g. 0000:18:00.0")
    numa_node: int | None = Field(default=None, ge=0, description="None when unknown")
    pcie_root: str | None = Field(
        default=None, pattern=_PCIE_ROOT, description="PCIe host bridge, e.g. pci0000:17"
    )
    uuid: str | None = Field(default=None, description="GPU-..., from /proc/driver/nvidia")


class RdmaPort(_Frozen):
    """One port of an RDMA device, as in /sys/class/infiniband/<dev>/ports/<n>."""

    port: int = Field(ge=1)
    state: str = Field(description="ACTIVE, DOWN, INIT, ARMED, ... or UNKNOWN")
    rate_gbps: float | None = Field(default=None, ge=0, description="link rate in Gb/s (bits)")
    link_layer: str | None = Field(default=None, description="InfiniBand or Ethernet (RoCE)")

    @property
    def active(self) -> bool:
        return self.state == PORT_ACTIVE


class RdmaNic(_Frozen):
    """One RDMA device (e.g. mlx5_3) and its ports."""

    name: str = Field(pattern=_NIC_NAME)
    pci_address: str | None = Field(default=None, pattern=_PCI_ADDRESS)
    numa_node: int | None = Field(default=None, ge=0)
    pcie_root: str | None = Field(default=None, pattern=_PCIE_ROOT)
    ports: tuple[RdmaPort, ...] = ()

    @property
    def active_ports(self) -> tuple[RdmaPort, ...]:
        return tuple(port for port in self.ports if port.active)


class GpuNicPair(_Frozen):
    """How far a GPU and a NIC are apart on PCIe, in nvidia-smi's classes."""

    gpu: int = Field(ge=0)
    nic: str = Field(pattern=_NIC_NAME)
    distance: DistanceClass


class NodeTopology(_Frozen):
    """Everything the operator needs to know about one node's GPU/NIC layout."""

    version: Literal["v1"] = SCHEMA_VERSION
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[RdmaNic, ...] = ()
    pairs: tuple[GpuNicPair, ...] = ()
    kernel_release: str | None = Field(default=None, description="/proc/sys/kernel/osrelease")
    kernel_major: int | None = Field(default=None, ge=0)
    kernel_minor: int | None = Field(default=None, ge=0)
    nvidia_driver_version: str | None = None
    open_kernel_module: bool = False
    peermem_loaded: bool = False
    cuda_driver_version: str | None = Field(
        default=None, description="highest CUDA version the driver supports, e.g. 12.4"
    )
    gpudirect: GpuDirectMode = "none"
    gpudirect_reason: str = ""

    @model_validator(mode="after")
    def _references_are_consistent(self) -> NodeTopology:
        gpu_indices = [gpu.index for gpu in self.gpus]
        nic_names = [nic.name for nic in self.nics]
        _require_unique("GPU index", gpu_indices)
        _require_unique("NIC name", nic_names)
        _require_unique("GPU-NIC pair", [(pair.gpu, pair.nic) for pair in self.pairs])
        for pair in self.pairs:
            if pair.gpu not in gpu_indices or pair.nic not in nic_names:
                raise ValueError(f"pair ({pair.gpu}, {pair.nic}) names an unknown GPU or NIC")
        return self

    @property
    def kernel_version(self) -> tuple[int, int] | None:
        if self.kernel_major is None or self.kernel_minor is None:
            return None
        return (self.kernel_major, self.kernel_minor)

    @property
    def active_nic_count(self) -> int:
        """NICs with at least one ACTIVE port: the ones a transfer can use right now."""
        return sum(1 for nic in self.nics if nic.active_ports)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        known = ", ".join(str(gpu.index) for gpu in self.gpus) or "none"
        raise KeyError(f"GPU index {index} is not on this node (GPUs: {known})")

    def nic(self, name: str) -> RdmaNic:
        for nic in self.nics:
            if nic.name == name:
                return nic
        raise KeyError(f"RDMA NIC {name} is not on this node")

    def distance(self, gpu: int, nic: str) -> DistanceClass | None:
        for pair in self.pairs:
            if pair.gpu == gpu and pair.nic == nic:
                return pair.distance
        return None


def _require_unique(what: str, values: list[int] | list[str] | list[tuple[int, str]]) -> None:
    seen: set[object] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what}: {value}")
        seen.add(value)


def nic_sort_key(name: str) -> tuple[str | int, ...]:
    """Natural order for device names: mlx5_2 before mlx5_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
