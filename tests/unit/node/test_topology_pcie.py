"""Distance classes between two PCI functions, as nvidia-smi `topo -m` defines them."""

from __future__ import annotations

import pytest

from pdd_node.topology.model import DistanceClass
from pdd_node.topology.pcie import PciePath, distance_class

ROOT_A = "/sys/devices/pci0000:10/0000:10:01.0"
ROOT_A2 = "/sys/devices/pci0000:10/0000:10:02.0"  # second root port of the same host bridge
ROOT_B = "/sys/devices/pci0000:20/0000:20:01.0"  # another host bridge

# One switch under ROOT_A: upstream 11:00.0, downstream ports 12:00.0 and 12:01.0.
SWITCH = f"{ROOT_A}/0000:11:00.0"
# A second-level switch under the first switch's third downstream port.
SWITCH2 = f"{SWITCH}/0000:12:02.0/0000:15:00.0"


def path(text: str) -> PciePath:
    parsed = PciePath.from_sysfs_path(text)
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("a", "a_numa", "b", "b_numa", "expected"),
    [
        # GPU and NIC on two downstream ports of one switch: one switch traversed.
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", 0, f"{SWITCH}/0000:12:01.0/0000:14:00.0", 0, "PIX"),
        # Two functions of one dual-port NIC next to a GPU: still one switch.
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", 0, f"{SWITCH}/0000:12:01.0/0000:14:00.1", 0, "PIX"),
        # GPU behind a second-level switch, NIC on the first-level switch: two switches.
        (
            f"{SWITCH2}/0000:16:00.0/0000:17:00.0",
            0,
            f"{SWITCH}/0000:12:01.0/0000:14:00.0",
            0,
            "PXB",
        ),
        # Both behind different second-level switches of one first-level switch: three.
        (
            f"{SWITCH2}/0000:16:00.0/0000:17:00.0",
            0,
            f"{SWITCH}/0000:12:03.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0",
            0,
            "PXB",
        ),
        # Behind different root ports of one host bridge: through the host bridge.
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", 0, f"{ROOT_A2}/0000:30:00.0", 0, "PHB"),
        # Devices directly on root ports of the same host bridge.
        (f"{ROOT_A}/0000:31:00.0", 0, f"{ROOT_A2}/0000:30:00.0", 0, "PHB"),
        # Devices on the root bus itself (a VM): one host bridge.
        (
            "/sys/devices/pci0000:00/0000:00:06.0",
            0,
            "/sys/devices/pci0000:00/0000:00:07.0",
            0,
            "PHB",
        ),
        # Different host bridges, one NUMA node.
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", 0, f"{ROOT_B}/0000:21:00.0", 0, "NODE"),
        # Different host bridges, different NUMA nodes.
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", 0, f"{ROOT_B}/0000:21:00.0", 1, "SYS"),
        # Different host bridges, NUMA unknown: assume the far case.
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", None, f"{ROOT_B}/0000:21:00.0", None, "SYS"),
    ],
)
def test_distance_class(
    a: str, a_numa: int | None, b: str, b_numa: int | None, expected: DistanceClass
) -> None:
    assert distance_class(path(a), a_numa, path(b), b_numa) == expected
    assert distance_class(path(b), b_numa, path(a), a_numa) == expected  # symmetric


@pytest.mark.parametrize(("numa", "expected"), [(0, "NODE"), (1, "SYS"), (None, "SYS")])
def test_unplaced_device_falls_back_to_numa(numa: int | None, expected: DistanceClass) -> None:
    gpu = path(f"{SWITCH}/0000:12:00.0/0000:13:00.0")
    assert distance_class(gpu, 0, None, numa) == expected


@pytest.mark.parametrize(
    ("text", "host_bridge", "chain", "switch_count"),
    [
        (f"{SWITCH}/0000:12:00.0/0000:13:00.0", "pci0000:10", 4, 1),
        (f"{SWITCH2}/0000:16:00.0/0000:17:00.0", "pci0000:10", 6, 2),
        ("/sys/devices/pci0000:00/0000:00:06.0", "pci0000:00", 1, 0),
        # An RDMA device path ends at the PCI function; the rest is not part of the chain.
        (f"{SWITCH}/0000:12:01.0/0000:14:00.0/infiniband/mlx5_0", "pci0000:10", 4, 1),
        # Intel VMD puts devices in a wide domain behind the VMD controller's own function.
        (
            "/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0/10000:e1:00.0",
            "pci10000:e0",
            2,
            0,
        ),
        # Fixture trees live under arbitrary roots.
        (f"/tmp/x/sys{SWITCH}/0000:12:00.0/0000:13:00.0", "pci0000:10", 4, 1),
    ],
)
def test_parse_sysfs_path(text: str, host_bridge: str, chain: int, switch_count: int) -> None:
    parsed = path(text)
    assert parsed.host_bridge == host_bridge
    assert len(parsed.chain) == chain
    assert len(parsed.switches) == switch_count


@pytest.mark.parametrize(
    "text", ["/sys/devices/virtual/infiniband/rxe0", "/sys/devices/pci0000:00", "", "/"]
)
def test_paths_outside_a_host_bridge_are_unplaced(text: str) -> None:
    assert PciePath.from_sysfs_path(text) is None
