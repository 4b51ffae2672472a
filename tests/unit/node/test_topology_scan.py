"""scan() on the fixture trees, and on broken or empty trees (it must never raise)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.topology import scan_fixture
from pdd_node.topology.model import NodeTopology
from pdd_node.topology.scan import scan

H100_ADDRESSES = [
    f"0000:{bus:02x}:00.0" for bus in (0x13, 0x23, 0x33, 0x43, 0x93, 0xA3, 0xB3, 0xC3)
]
NUMA_BY_GPU = [0, 0, 0, 0, 1, 1, 1, 1]


def matrix(topology: NodeTopology) -> list[str]:
    """Rows per GPU of distance classes per NIC, like `nvidia-smi topo -m`."""
    return [
        " ".join(str(topology.distance(gpu.index, nic.name)) for nic in topology.nics)
        for gpu in topology.gpus
    ]


def test_h100_hgx_gpus() -> None:
    topology = scan_fixture("h100-hgx")
    # Bridges, the NVSwitch (NVIDIA vendor ID, bridge class) and the NVMe drive are not GPUs.
    assert [gpu.pci_address for gpu in topology.gpus] == H100_ADDRESSES
    assert [gpu.index for gpu in topology.gpus] == list(range(8))
    assert [gpu.numa_node for gpu in topology.gpus] == NUMA_BY_GPU
    assert topology.gpus[0].pcie_root == "pci0000:10"
    assert topology.gpus[4].uuid == "GPU-00000004-93aa-4bbb-8ccc-939393939393"


def test_h100_hgx_nics() -> None:
    topology = scan_fixture("h100-hgx")
    assert [nic.name for nic in topology.nics] == [f"mlx5_{i}" for i in range(8)]
    nic = topology.nic("mlx5_5")
    assert (nic.pci_address, nic.numa_node, nic.pcie_root) == ("0000:a4:00.0", 1, "pci0000:a0")
    (port,) = nic.ports
    assert (port.port, port.state, port.rate_gbps, port.link_layer) == (
        1,
        "ACTIVE",
        400.0,
        "InfiniBand",
    )
    assert topology.active_nic_count == 8


def test_h100_hgx_distance_matrix() -> None:
    # GPU i and NIC i share a switch (PIX); the other NICs of the socket hang off other host
    # bridges (NODE); the other socket's are across the interconnect (SYS).
    assert matrix(scan_fixture("h100-hgx")) == [
        "PIX NODE NODE NODE SYS SYS SYS SYS",
        "NODE PIX NODE NODE SYS SYS SYS SYS",
        "NODE NODE PIX NODE SYS SYS SYS SYS",
        "NODE NODE NODE PIX SYS SYS SYS SYS",
        "SYS SYS SYS SYS PIX NODE NODE NODE",
        "SYS SYS SYS SYS NODE PIX NODE NODE",
        "SYS SYS SYS SYS NODE NODE PIX NODE",
        "SYS SYS SYS SYS NODE NODE NODE PIX",
    ]


def test_nics_on_socket0_distance_matrix() -> None:
    assert matrix(scan_fixture("nics-on-socket0")) == [
        "PIX NODE NODE NODE",
        "NODE PIX NODE NODE",
        "NODE NODE PIX NODE",
        "NODE NODE NODE PIX",
        "SYS SYS SYS SYS",
        "SYS SYS SYS SYS",
        "SYS SYS SYS SYS",
        "SYS SYS SYS SYS",
    ]


def test_port_down_fixture_reports_the_port_state() -> None:
    topology = scan_fixture("port-down")
    assert [port.state for port in topology.nic("mlx5_2").ports] == ["DOWN"]
    assert topology.active_nic_count == 7


@pytest.mark.parametrize(
    ("fixture", "kernel", "driver", "open_module", "peermem", "cuda"),
    [
        ("h100-hgx", (6, 8), "550.54.15", True, False, "12.4"),
        ("old-kernel", (5, 4), "535.129.03", False, True, "12.2"),
        ("proprietary-no-peermem", (6, 8), "535.129.03", False, False, "12.2"),
        ("single-gpu-vm", (6, 18), "580.159.04", True, False, "13.0"),
    ],
)
def test_software_facts(
    fixture: str,
    kernel: tuple[int, int],
    driver: str,
    open_module: bool,
    peermem: bool,
    cuda: str,
) -> None:
    topology = scan_fixture(fixture)
    assert topology.kernel_version == kernel
    assert topology.nvidia_driver_version == driver
    assert topology.open_kernel_module is open_module
    assert topology.peermem_loaded is peermem
    assert topology.cuda_driver_version == cuda


@pytest.mark.parametrize(
    ("fixture", "mode", "reason_has", "reason_lacks"),
    [
        ("h100-hgx", "dmabuf", ["dma-buf", "6.8"], []),
        ("nics-on-socket0", "dmabuf", ["dma-buf"], []),
        ("port-down", "dmabuf", ["dma-buf"], []),
        ("no-rdma", "none", ["no RDMA NIC"], []),
        ("old-kernel", "peermem", ["nvidia-peermem", "older than 5.12", "proprietary"], []),
        (
            "proprietary-no-peermem",
            "none",
            ["proprietary", "not loaded", "open kernel module", "modprobe nvidia-peermem"],
            ["older than 5.12"],
        ),
        ("single-gpu-vm", "none", ["no RDMA NIC"], []),
    ],
)
def test_gpudirect_mode_per_fixture(
    fixture: str, mode: str, reason_has: list[str], reason_lacks: list[str]
) -> None:
    topology = scan_fixture(fixture)
    assert topology.gpudirect == mode
    for phrase in reason_has:
        assert phrase in topology.gpudirect_reason
    for phrase in reason_lacks:
        assert phrase not in topology.gpudirect_reason


def test_no_rdma_has_gpus_but_no_nics() -> None:
    topology = scan_fixture("no-rdma")
    assert len(topology.gpus) == 8
    assert topology.nics == ()
    assert topology.pairs == ()


def test_single_gpu_vm_unknown_numa_on_one_node_machine_is_node_0() -> None:
    topology = scan_fixture("single-gpu-vm")
    (gpu,) = topology.gpus
    assert (gpu.pci_address, gpu.numa_node, gpu.pcie_root) == ("0000:00:06.0", 0, "pci0000:00")
    assert gpu.uuid is not None


@pytest.mark.parametrize("exists", [True, False])
def test_empty_or_missing_roots_give_an_empty_topology(tmp_path: Path, exists: bool) -> None:
    root = tmp_path if exists else tmp_path / "missing"
    topology = scan(root / "sys", root / "proc")
    assert (topology.gpus, topology.nics, topology.pairs) == ((), (), ())
    assert topology.kernel_release is None
    assert topology.gpudirect == "none"
    assert topology.gpudirect_reason == "no NVIDIA GPU on the PCI bus"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def link(link_path: Path, target: Path) -> None:
    link_path.parent.mkdir(parents=True, exist_ok=True)
    link_path.symlink_to(os.path.relpath(target, link_path.parent))


def gpu_function(sys_root: Path, address: str, numa: str = "0") -> Path:
    device = sys_root / "devices/pci0000:00/0000:00:01.0" / address
    write(device / "vendor", "0x10de\n")
    write(device / "class", "0x030200\n")
    write(device / "numa_node", f"{numa}\n")
    link(sys_root / "bus/pci/devices" / address, device)
    return device


def test_malformed_files_are_skipped_not_fatal(tmp_path: Path) -> None:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    gpu_function(sys_root, "0000:01:00.0")
    broken = sys_root / "devices/pci0000:00/0000:00:02.0/0000:02:00.0"
    (broken / "vendor").mkdir(parents=True)  # a directory where a file should be
    write(broken / "class", "not hex\n")
    link(sys_root / "bus/pci/devices/0000:02:00.0", broken)
    (sys_root / "bus/pci/devices/0000:03:00.0").symlink_to("/nonexistent")  # dangling
    ports = sys_root / "class/infiniband/mlx5_0/ports"
    write(ports / "1/state", "weird\n")
    write(ports / "1/rate", "fast\n")
    write(ports / "notaport/state", "4: ACTIVE\n")
    write(proc_root / "sys/kernel/osrelease", "???\n")
    write(proc_root / "driver/nvidia/version", "unexpected text\n")

    topology = scan(sys_root, proc_root)

    assert [gpu.pci_address for gpu in topology.gpus] == ["0000:01:00.0"]
    (nic,) = topology.nics
    assert nic.pci_address is None
    assert [(p.port, p.state, p.rate_gbps) for p in nic.ports] == [(1, "UNKNOWN", None)]
    assert topology.kernel_version is None
    assert topology.nvidia_driver_version is None
    assert "driver is not loaded" in topology.gpudirect_reason


def test_virtual_rdma_device_is_unplaced_and_far(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    gpu_function(sys_root, "0000:01:00.0")
    rxe = sys_root / "devices/virtual/infiniband/rxe0"
    write(rxe / "ports/1/state", "4: ACTIVE\n")
    write(rxe / "ports/1/link_layer", "Ethernet\n")
    link(sys_root / "class/infiniband/rxe0", rxe)
    for node in ("node0", "node1"):
        write(sys_root / "devices/system/node" / node / "cpulist", "0\n")

    topology = scan(sys_root, tmp_path / "proc")

    (nic,) = topology.nics
    assert (nic.name, nic.pci_address, nic.numa_node) == ("rxe0", None, None)
    assert topology.distance(0, "rxe0") == "SYS"


def test_unknown_numa_stays_unknown_on_a_two_node_machine(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    gpu_function(sys_root, "0000:01:00.0", numa="-1")
    for node in ("node0", "node1"):
        write(sys_root / "devices/system/node" / node / "cpulist", "0\n")
    assert scan(sys_root, tmp_path / "proc").gpus[0].numa_node is None


@pytest.mark.parametrize("module", ["nvidia_peermem", "nv_peer_mem"])
def test_either_peer_memory_module_counts(tmp_path: Path, module: str) -> None:
    write(tmp_path / "sys/module" / module / "initstate", "live\n")
    assert scan(tmp_path / "sys", tmp_path / "proc").peermem_loaded


def test_gpus_are_indexed_in_pci_bus_order(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    for address in ("0000:c3:00.0", "0000:13:00.0", "0001:01:00.0", "0000:9a:00.0"):
        gpu_function(sys_root, address)
    addresses = [gpu.pci_address for gpu in scan(sys_root, tmp_path / "proc").gpus]
    assert addresses == ["0000:13:00.0", "0000:9a:00.0", "0000:c3:00.0", "0001:01:00.0"]


def test_nics_are_in_natural_order(tmp_path: Path) -> None:
    for name in ("mlx5_10", "mlx5_2", "mlx5_1"):
        write(tmp_path / "sys/class/infiniband" / name / "ports/1/state", "4: ACTIVE\n")
    names = [nic.name for nic in scan(tmp_path / "sys", tmp_path / "proc").nics]
    assert names == ["mlx5_1", "mlx5_2", "mlx5_10"]
