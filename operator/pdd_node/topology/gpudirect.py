"""Whether GPUDirect RDMA works on a node, which flavour, and what to fix when it does not.

dma-buf (the upstream path) needs Linux >= 5.12, the NVIDIA *open* kernel module and a CUDA
driver >= 11.7. The legacy path is the nvidia-peermem kernel module (or Mellanox's older
nv_peer_mem), which works with either kernel module flavour.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdd_contract.labels import GpuDirectMode
from pdd_node.topology.model import NodeTopology
from pdd_node.topology.parse import parse_cuda_version

DMABUF_MIN_KERNEL = (5, 12)
DMABUF_MIN_CUDA = (11, 7)

FIX_OPEN_MODULE = (
    "install the NVIDIA open kernel module (package nvidia-driver-<branch>-open, or GPU "
    "Operator driver.kernelModuleType=open) on Linux >= 5.12 for dma-buf"
)
FIX_PEERMEM = (
    "load nvidia-peermem (modprobe nvidia-peermem, or GPU Operator driver.rdma.enabled=true)"
)


@dataclass(frozen=True)
class GpuDirectFacts:
    """The node facts the decision depends on."""

    gpu_count: int
    rdma_nic_count: int
    driver_loaded: bool
    kernel: tuple[int, int] | None
    open_kernel_module: bool
    peermem_loaded: bool
    cuda: tuple[int, int] | None  # None: unknown, not held against dma-buf


def facts_from_topology(topology: NodeTopology) -> GpuDirectFacts:
    """The facts as published in a topology (to re-decide, or explain, its verdict)."""
    return GpuDirectFacts(
        gpu_count=len(topology.gpus),
        rdma_nic_count=len(topology.nics),
        driver_loaded=topology.nvidia_driver_version is not None,
        kernel=topology.kernel_version,
        open_kernel_module=topology.open_kernel_module,
        peermem_loaded=topology.peermem_loaded,
        cuda=parse_cuda_version(topology.cuda_driver_version),
    )


def decide_gpudirect(facts: GpuDirectFacts) -> tuple[GpuDirectMode, str]:
    """dma-buf when the node supports it, else peermem when loaded, else none; the reason says
    why, and for none what to change."""
    blocker = gpudirect_blocker(facts)
    if blocker is not None:
        return "none", blocker
    missing = dmabuf_missing(facts)
    if not missing:
        return "dmabuf", (
            f"GPUDirect RDMA through dma-buf: Linux {_version(facts.kernel)} >= 5.12 with the "
            "NVIDIA open kernel module" + _cuda_note(facts.cuda)
        )
    if facts.peermem_loaded:
        return "peermem", (
            f"GPUDirect RDMA through nvidia-peermem; dma-buf is unavailable: {'; '.join(missing)}"
        )
    return "none", (
        f"GPUDirect RDMA is unavailable: {'; '.join(missing)}; and nvidia-peermem is not "
        f"loaded. Fix: {FIX_OPEN_MODULE}, or {FIX_PEERMEM}"
    )


def gpudirect_blocker(facts: GpuDirectFacts) -> str | None:
    """What rules out GPUDirect RDMA of either flavour (no GPU, no driver, no RDMA NIC), with
    the fix; None when the node has all three."""
    if facts.gpu_count == 0:
        return "no NVIDIA GPU on the PCI bus"
    if not facts.driver_loaded:
        return (
            "the NVIDIA driver is not loaded (/proc/driver/nvidia/version is missing or "
            "unreadable): install the driver (e.g. the GPU Operator) for GPUDirect RDMA"
        )
    if facts.rdma_nic_count == 0:
        return (
            "no RDMA NIC in /sys/class/infiniband: load the NIC's RDMA driver (mlx5_ib, e.g. "
            "through the NVIDIA Network Operator) or run on nodes with RDMA NICs"
        )
    return None


def dmabuf_missing(facts: GpuDirectFacts) -> list[str]:
    """What stands between the node and dma-buf GPUDirect RDMA, one phrase per gap."""
    missing: list[str] = []
    if facts.kernel is None:
        missing.append("the kernel version is unknown (needs >= 5.12)")
    elif facts.kernel < DMABUF_MIN_KERNEL:
        missing.append(f"Linux {_version(facts.kernel)} is older than 5.12")
    if not facts.open_kernel_module:
        missing.append("the NVIDIA driver is the proprietary kernel module, not the open one")
    if facts.cuda is not None and facts.cuda < DMABUF_MIN_CUDA:
        missing.append(f"the CUDA driver {_version(facts.cuda)} is older than 11.7")
    return missing


def _version(version: tuple[int, int] | None) -> str:
    return "unknown" if version is None else f"{version[0]}.{version[1]}"


def _cuda_note(cuda: tuple[int, int] | None) -> str:
    return "" if cuda is None else f" (CUDA {_version(cuda)})"
