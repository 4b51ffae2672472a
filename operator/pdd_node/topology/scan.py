"""Build a NodeTopology from a sysfs and a procfs tree, reading files only.

The roots are parameters so the node agent can read the host's trees mounted at /host/sys and
/host/proc, and tests can point at fixture trees. A missing or unreadable file means "not
present": the scan of a machine without GPUs or RDMA NICs returns empty lists, never raises.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pdd_node.topology.gpudirect import GpuDirectFacts, decide_gpudirect
from pdd_node.topology.model import (
    Gpu,
    GpuNicPair,
    NodeTopology,
    RdmaNic,
    RdmaPort,
    nic_sort_key,
)
from pdd_node.topology.parse import (
    cuda_version_for_driver,
    gpu_uuid,
    parse_cuda_version,
    parse_gpu_information,
    parse_hex,
    parse_kernel_release,
    parse_numa_node,
    parse_nvidia_version,
    parse_port_rate,
    parse_port_state,
)
from pdd_node.topology.pcie import PciePath, distance_class

NVIDIA_VENDOR_ID = 0x10DE
# PCI class codes (class >> 8): 0x0300 VGA controller, 0x0302 3D controller. NVSwitches
# (0x0680, "other bridge") share the vendor ID and must not count as GPUs.
GPU_CLASS_CODES = frozenset({0x0300, 0x0302})
# Kernel modules that give the NIC access to GPU memory through the peer-memory API:
# NVIDIA's nvidia-peermem and Mellanox's older nv_peer_mem.
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")

_NUMA_NODE_DIR = re.compile(r"^node\d+$")


@dataclass(frozen=True)
class _PlacedGpu:
    gpu: Gpu
    pcie: PciePath | None


@dataclass(frozen=True)
class _PlacedNic:
    nic: RdmaNic
    pcie: PciePath | None


def scan(sysfs_root: Path, procfs_root: Path) -> NodeTopology:
    """Read the node's GPUs, RDMA NICs, their PCIe distances and the GPUDirect facts."""
    single_numa_node = _has_single_numa_node(sysfs_root)
    gpus = _scan_gpus(sysfs_root, procfs_root, single_numa_node)
    nics = _scan_nics(sysfs_root, single_numa_node)
    kernel_release = _read_text(procfs_root / "sys/kernel/osrelease")
    kernel = parse_kernel_release(kernel_release) if kernel_release else None
    driver_text = _read_text(procfs_root / "driver/nvidia/version")
    driver = parse_nvidia_version(driver_text or "")
    cuda = cuda_version_for_driver(driver.version)
    peermem_loaded = any((sysfs_root / "module" / name).is_dir() for name in PEERMEM_MODULES)
    facts = GpuDirectFacts(
        gpu_count=len(gpus),
        rdma_nic_count=len(nics),
        driver_loaded=driver.version is not None,
        kernel=kernel,
        open_kernel_module=driver.open_kernel_module,
        peermem_loaded=peermem_loaded,
        cuda=parse_cuda_version(cuda),
    )
    mode, reason = decide_gpudirect(facts)
    return NodeTopology(
        gpus=tuple(placed.gpu for placed in gpus),
        nics=tuple(placed.nic for placed in nics),
        pairs=_pairs(gpus, nics),
        kernel_release=kernel_release,
        kernel_major=kernel[0] if kernel else None,
        kernel_minor=kernel[1] if kernel else None,
        nvidia_driver_version=driver.version,
        open_kernel_module=driver.open_kernel_module,
        peermem_loaded=peermem_loaded,
        cuda_driver_version=cuda,
        gpudirect=mode,
        gpudirect_reason=reason,
    )


def _scan_gpus(sysfs_root: Path, procfs_root: Path, single_numa_node: bool) -> list[_PlacedGpu]:
    uuids = _gpu_uuids_by_address(procfs_root)
    functions = sorted(
        (entry for entry in _list_dir(sysfs_root / "bus/pci/devices") if _is_nvidia_gpu(entry)),
        key=lambda entry: _pci_sort_key(entry.name),
    )
    placed: list[_PlacedGpu] = []
    # nvidia-smi / NVML number GPUs in PCI bus order; so does CUDA_DEVICE_ORDER=PCI_BUS_ID.
    for index, entry in enumerate(functions):
        address = entry.name.lower()
        pcie = PciePath.from_sysfs_path(os.path.realpath(entry))
        gpu = Gpu(
            index=index,
            pci_address=address,
            numa_node=_numa_node(entry, single_numa_node),
            pcie_root=pcie.host_bridge if pcie else None,
            uuid=uuids.get(address),
        )
        placed.append(_PlacedGpu(gpu=gpu, pcie=pcie))
    return placed


def _is_nvidia_gpu(pci_function: Path) -> bool:
    vendor = parse_hex(_read_text(pci_function / "vendor") or "")
    pci_class = parse_hex(_read_text(pci_function / "class") or "")
    return (
        vendor == NVIDIA_VENDOR_ID and pci_class is not None and pci_class >> 8 in GPU_CLASS_CODES
    )


def _gpu_uuids_by_address(procfs_root: Path) -> dict[str, str]:
    uuids: dict[str, str] = {}
    for gpu_dir in _list_dir(procfs_root / "driver/nvidia/gpus"):
        information = parse_gpu_information(_read_text(gpu_dir / "information") or "")
        uuid = gpu_uuid(information)
        address = information.get("Bus Location", gpu_dir.name).lower()
        if uuid:
            uuids[address] = uuid
    return uuids


def _scan_nics(sysfs_root: Path, single_numa_node: bool) -> list[_PlacedNic]:
    placed: list[_PlacedNic] = []
    for entry in sorted(
        _list_dir(sysfs_root / "class/infiniband"), key=lambda entry: nic_sort_key(entry.name)
    ):
        device = entry / "device"
        # /sys/class/infiniband/<dev> itself resolves to .../<pci function>/infiniband/<dev>,
        # a fallback where the device link is missing.
        located = device if device.exists() else entry
        pcie = PciePath.from_sysfs_path(os.path.realpath(located))
        nic = RdmaNic(
            name=entry.name,
            pci_address=pcie.address if pcie else None,
            numa_node=_numa_node(device, single_numa_node) if device.exists() else None,
            pcie_root=pcie.host_bridge if pcie else None,
            ports=_scan_ports(entry / "ports"),
        )
        placed.append(_PlacedNic(nic=nic, pcie=pcie))
    return placed


def _scan_ports(ports_dir: Path) -> tuple[RdmaPort, ...]:
    ports: list[RdmaPort] = []
    for port_dir in _list_dir(ports_dir):
        if not port_dir.name.isdigit() or int(port_dir.name) < 1:
            continue
        ports.append(
            RdmaPort(
                port=int(port_dir.name),
                state=parse_port_state(_read_text(port_dir / "state") or ""),
                rate_gbps=parse_port_rate(_read_text(port_dir / "rate") or ""),
                link_layer=_read_text(port_dir / "link_layer"),
            )
        )
    return tuple(sorted(ports, key=lambda port: port.port))


def _pairs(gpus: list[_PlacedGpu], nics: list[_PlacedNic]) -> tuple[GpuNicPair, ...]:
    return tuple(
        GpuNicPair(
            gpu=gpu.gpu.index,
            nic=nic.nic.name,
            distance=distance_class(gpu.pcie, gpu.gpu.numa_node, nic.pcie, nic.nic.numa_node),
        )
        for gpu in gpus
        for nic in nics
    )


def _numa_node(pci_function: Path, single_numa_node: bool) -> int | None:
    node = parse_numa_node(_read_text(pci_function / "numa_node") or "-1")
    # Firmware often reports -1 on one-socket machines; there every device is on node 0
    # (nvidia-smi says so too). With several nodes, -1 stays unknown.
    if node is None and single_numa_node:
        return 0
    return node


def _has_single_numa_node(sysfs_root: Path) -> bool:
    nodes = [
        entry
        for entry in _list_dir(sysfs_root / "devices/system/node")
        if _NUMA_NODE_DIR.match(entry.name)
    ]
    return len(nodes) <= 1


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:  # missing, a directory, permission denied: all mean "not present"
        return None


def _list_dir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _pci_sort_key(address: str) -> tuple[int, ...]:
    return tuple(int(part, 16) for part in re.split(r"[:.]", address) if _is_hex(part))


def _is_hex(text: str) -> bool:
    return parse_hex(text) is not None
