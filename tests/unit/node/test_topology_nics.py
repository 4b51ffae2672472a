"""NIC choice per GPU, UCX_NET_DEVICES, link limits and the GPUDirect decision."""

from __future__ import annotations

import pytest

from helpers.topology import scan_fixture
from pdd_node.topology.gpudirect import GpuDirectFacts, decide_gpudirect
from pdd_node.topology.model import (
    DistanceClass,
    Gpu,
    GpuNicPair,
    NodeTopology,
    RdmaNic,
    RdmaPort,
)
from pdd_node.topology.nics import (
    choose_ports,
    gpudirect_mode,
    link_limit_gbytes_per_s,
    nearest_nics,
    select_nics,
    ucx_net_devices,
)

ALL = list(range(8))


@pytest.mark.parametrize(
    ("fixture", "gpus", "expected"),
    [
        # Every GPU has its own NIC behind its switch.
        ("h100-hgx", ALL, {i: f"mlx5_{i}:1" for i in ALL}),
        ("h100-hgx", [5, 2], {5: "mlx5_5:1", 2: "mlx5_2:1"}),
        # mlx5_2's port is DOWN: GPU 2 takes the next nearest (NODE: mlx5_0/1/3) and, those
        # being equal, the first by name.
        ("port-down", ALL, {**{i: f"mlx5_{i}:1" for i in ALL}, 2: "mlx5_0:1"}),
        ("port-down", [2], {2: "mlx5_0:1"}),
        # ...and when GPU 0 is in the same process, GPU 2 spreads to a NIC nobody uses yet.
        ("port-down", [0, 2], {0: "mlx5_0:1", 2: "mlx5_1:1"}),
        # Socket-1 GPUs reach all four NICs equally (SYS): spread over them, not all on mlx5_0.
        ("nics-on-socket0", ALL, {i: f"mlx5_{i % 4}:1" for i in ALL}),
        ("nics-on-socket0", [4, 5], {4: "mlx5_0:1", 5: "mlx5_1:1"}),
        # GPU 0 has one nearest NIC and keeps it though GPU 4 is listed first.
        ("nics-on-socket0", [4, 0], {4: "mlx5_1:1", 0: "mlx5_0:1"}),
        ("no-rdma", ALL, {}),
        ("h100-hgx", [], {}),
    ],
)
def test_select_nics(fixture: str, gpus: list[int], expected: dict[int, str]) -> None:
    chosen = select_nics(scan_fixture(fixture), gpus)
    assert chosen == expected
    assert list(chosen) == [gpu for gpu in gpus if gpu in expected]  # in the order asked


@pytest.mark.parametrize(
    ("fixture", "gpus", "expected"),
    [
        ("h100-hgx", [0, 1], "mlx5_0:1,mlx5_1:1"),
        ("h100-hgx", [1, 0], "mlx5_1:1,mlx5_0:1"),
        ("nics-on-socket0", ALL, "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"),  # deduplicated
        ("no-rdma", [0], ""),
    ],
)
def test_ucx_net_devices(fixture: str, gpus: list[int], expected: str) -> None:
    assert ucx_net_devices(scan_fixture(fixture), gpus) == expected


def test_choice_carries_distance_and_link_limit() -> None:
    choice = choose_ports(scan_fixture("port-down"), [2])[2]
    assert (choice.nic, choice.port, choice.distance) == ("mlx5_0", 1, "NODE")
    assert choice.link_limit_gbytes_per_s == 50.0


@pytest.mark.parametrize(("rate", "limit"), [(400, 50.0), (200, 25.0), (100, 12.5)])
def test_link_limit(rate: float, limit: float) -> None:
    assert link_limit_gbytes_per_s(rate) == limit


def test_unknown_gpu_index_is_an_error_naming_the_gpus() -> None:
    with pytest.raises(KeyError, match="GPU index 9 is not on this node"):
        select_nics(scan_fixture("h100-hgx"), [9])


def test_nearest_nics_ignores_port_state() -> None:
    assert nearest_nics(scan_fixture("port-down"), 2) == ("PIX", ["mlx5_2"])
    assert nearest_nics(scan_fixture("no-rdma"), 2) == (None, [])


def synthetic(
    nics: list[tuple[str, list[tuple[str, float | None]]]],
    distances: dict[str, DistanceClass],
) -> NodeTopology:
    """One GPU (index 0) and NICs given as (name, [(port state, rate)]), at `distances`."""
    return NodeTopology(
        gpus=(Gpu(index=0, pci_address="0000:01:00.0"),),
        nics=tuple(
            RdmaNic(
                name=name,
                ports=tuple(
                    RdmaPort(port=number, state=state, rate_gbps=rate)
                    for number, (state, rate) in enumerate(ports, start=1)
                ),
            )
            for name, ports in nics
        ),
        pairs=tuple(GpuNicPair(gpu=0, nic=nic, distance=d) for nic, d in distances.items()),
    )


@pytest.mark.parametrize(
    ("nics", "distances", "expected"),
    [
        # Nearer class beats a faster port.
        (
            [("mlx5_a", [("ACTIVE", 100)]), ("mlx5_b", [("ACTIVE", 400)])],
            {"mlx5_a": "PXB", "mlx5_b": "PHB"},
            "mlx5_a:1",
        ),
        # Same class: the faster port.
        (
            [("mlx5_a", [("ACTIVE", 200)]), ("mlx5_b", [("ACTIVE", 400)])],
            {"mlx5_a": "NODE", "mlx5_b": "NODE"},
            "mlx5_b:1",
        ),
        # Same class and rate: by name, naturally ordered (mlx5_2 before mlx5_10).
        (
            [("mlx5_10", [("ACTIVE", 400)]), ("mlx5_2", [("ACTIVE", 400)])],
            {"mlx5_10": "SYS", "mlx5_2": "SYS"},
            "mlx5_2:1",
        ),
        # A dual-port NIC with port 1 down: port 2.
        ([("mlx5_0", [("DOWN", 400), ("ACTIVE", 400)])], {"mlx5_0": "PIX"}, "mlx5_0:2"),
        # Unknown rate counts as slowest.
        (
            [("mlx5_a", [("ACTIVE", None)]), ("mlx5_b", [("ACTIVE", 100)])],
            {"mlx5_a": "PIX", "mlx5_b": "PIX"},
            "mlx5_b:1",
        ),
        # A NIC with no pair (unplaced) counts as SYS.
        ([("mlx5_a", [("ACTIVE", 400)]), ("rxe0", [("ACTIVE", 400)])], {"rxe0": "NODE"}, "rxe0:1"),
        # INIT / ARMED ports carry no traffic.
        ([("mlx5_0", [("INIT", 400)]), ("mlx5_1", [("ARMED", 400)])], {}, None),
    ],
)
def test_preference_order(
    nics: list[tuple[str, list[tuple[str, float | None]]]],
    distances: dict[str, DistanceClass],
    expected: str | None,
) -> None:
    assert select_nics(synthetic(nics, distances), [0]).get(0) == expected


FACTS = GpuDirectFacts(
    gpu_count=8,
    rdma_nic_count=8,
    driver_loaded=True,
    kernel=(6, 8),
    open_kernel_module=True,
    peermem_loaded=False,
    cuda=(12, 4),
)


@pytest.mark.parametrize(
    ("changes", "mode", "reason_has"),
    [
        ({}, "dmabuf", "dma-buf"),
        ({"kernel": (5, 12)}, "dmabuf", "5.12"),
        ({"cuda": None}, "dmabuf", "dma-buf"),  # unknown CUDA is not held against dma-buf
        ({"kernel": (5, 11)}, "none", "Linux 5.11 is older than 5.12"),
        ({"kernel": None}, "none", "kernel version is unknown"),
        ({"cuda": (11, 6)}, "none", "CUDA driver 11.6 is older than 11.7"),
        ({"open_kernel_module": False}, "none", "proprietary kernel module"),
        ({"open_kernel_module": False, "peermem_loaded": True}, "peermem", "nvidia-peermem"),
        ({"kernel": (5, 4), "peermem_loaded": True}, "peermem", "older than 5.12"),
        ({"peermem_loaded": True}, "dmabuf", "dma-buf"),  # dma-buf preferred when both work
        ({"gpu_count": 0}, "none", "no NVIDIA GPU"),
        ({"driver_loaded": False}, "none", "driver is not loaded"),
        ({"rdma_nic_count": 0}, "none", "no RDMA NIC"),
    ],
)
def test_decide_gpudirect(changes: dict[str, object], mode: str, reason_has: str) -> None:
    facts = GpuDirectFacts(**{**FACTS.__dict__, **changes})
    decided_mode, reason = decide_gpudirect(facts)
    assert decided_mode == mode
    assert reason_has in reason


@pytest.mark.parametrize(
    "fixture",
    ["h100-hgx", "no-rdma", "old-kernel", "proprietary-no-peermem", "single-gpu-vm"],
)
def test_gpudirect_mode_recomputed_from_facts_matches_the_scan(fixture: str) -> None:
    topology = scan_fixture(fixture)
    assert gpudirect_mode(topology) == (topology.gpudirect, topology.gpudirect_reason)


def test_none_reason_says_how_to_fix() -> None:
    _, reason = gpudirect_mode(scan_fixture("proprietary-no-peermem"))
    assert "driver.kernelModuleType=open" in reason
    assert "modprobe nvidia-peermem" in reason
