"""Which RDMA port each GPU should use, and what UCX should be told.

UCX's own NIC choice can pick a far NIC and halve the bandwidth, so the operator pins, per
GPU, the nearest ACTIVE port: by distance class (PIX < PXB < PHB < NODE < SYS), then the
fastest, then the NIC fewest GPUs already use (spreading load), then by name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdd_contract.labels import GpuDirectMode
from pdd_node.topology.gpudirect import decide_gpudirect, facts_from_topology
from pdd_node.topology.model import (
    DISTANCE_CLASSES,
    DistanceClass,
    NodeTopology,
    nic_sort_key,
)

_DISTANCE_RANK: dict[DistanceClass, int] = {
    name: rank for rank, name in enumerate(DISTANCE_CLASSES)
}


@dataclass(frozen=True)
class PortChoice:
    """One candidate (or chosen) RDMA port for one GPU."""

    gpu: int
    nic: str
    port: int
    distance: DistanceClass
    rate_gbps: float | None

    @property
    def ucx_device(self) -> str:
        """The UCX_NET_DEVICES spelling, e.g. mlx5_3:1."""
        return f"{self.nic}:{self.port}"

    @property
    def link_limit_gbytes_per_s(self) -> float | None:
        return None if self.rate_gbps is None else link_limit_gbytes_per_s(self.rate_gbps)


def link_limit_gbytes_per_s(rate_gbps: float) -> float:
    """A link's ceiling in GB/s from its rate in Gb/s: 400 Gb/s -> 50 GB/s."""
    return rate_gbps / 8


def active_port_candidates(topology: NodeTopology, gpu: int) -> list[PortChoice]:
    """Every ACTIVE port a GPU could use, nearest and fastest first."""
    topology.gpu(gpu)  # raises KeyError naming the node's GPUs when the index is unknown
    candidates = [
        PortChoice(
            gpu=gpu,
            nic=nic.name,
            port=port.port,
            distance=topology.distance(gpu, nic.name) or "SYS",
            rate_gbps=port.rate_gbps,
        )
        for nic in topology.nics
        for port in nic.active_ports
    ]
    return sorted(candidates, key=_preference)


def choose_ports(topology: NodeTopology, gpu_indices: Iterable[int]) -> dict[int, PortChoice]:
    """The port per GPU, in the order given (duplicates dropped). A GPU without any ACTIVE port
    is left out of the result."""
    order = list(dict.fromkeys(gpu_indices))
    best = {gpu: _best_candidates(active_port_candidates(topology, gpu)) for gpu in order}
    # GPUs with fewer equally good ports choose first, so a GPU with one nearest NIC is not
    # crowded off it by a GPU that had alternatives.
    choosing_order = sorted(
        (gpu for gpu in order if best[gpu]), key=lambda gpu: (len(best[gpu]), order.index(gpu))
    )
    nic_users: Counter[str] = Counter()
    port_users: Counter[str] = Counter()
    chosen: dict[int, PortChoice] = {}
    for gpu in choosing_order:
        pick = min(
            best[gpu],
            key=lambda c: (nic_users[c.nic], port_users[c.ucx_device], nic_sort_key(c.nic), c.port),
        )
        nic_users[pick.nic] += 1
        port_users[pick.ucx_device] += 1
        chosen[gpu] = pick
    return {gpu: chosen[gpu] for gpu in order if gpu in chosen}


def select_nics(topology: NodeTopology, gpu_indices: Iterable[int]) -> dict[int, str]:
    """GPU index -> UCX device (`mlx5_3:1`) of its nearest ACTIVE port."""
    return {gpu: choice.ucx_device for gpu, choice in choose_ports(topology, gpu_indices).items()}


def ucx_net_devices(topology: NodeTopology, gpu_indices: Iterable[int]) -> str:
    """UCX_NET_DEVICES for a process driving these GPUs: their ports, deduplicated, in GPU
    order. Empty when no GPU has an ACTIVE port."""
    devices = select_nics(topology, gpu_indices).values()
    return ",".join(dict.fromkeys(devices))


def nearest_nics(topology: NodeTopology, gpu: int) -> tuple[DistanceClass | None, list[str]]:
    """The nearest distance class to any NIC, whatever its port state, and the NICs at it.
    Tells the preflight when a GPU had to fall back to a farther NIC."""
    distances = [(topology.distance(gpu, nic.name) or "SYS", nic.name) for nic in topology.nics]
    if not distances:
        return None, []
    nearest = min((distance for distance, _ in distances), key=_DISTANCE_RANK.__getitem__)
    return nearest, [name for distance, name in distances if distance == nearest]


def gpudirect_mode(topology: NodeTopology) -> tuple[GpuDirectMode, str]:
    """Decide the GPUDirect RDMA mode from the topology's facts (not from its stored verdict,
    so an operator with newer rules re-decides an older agent's annotation)."""
    return decide_gpudirect(facts_from_topology(topology))


def distance_rank(distance: DistanceClass) -> int:
    """0 for PIX (nearest) up to 4 for SYS."""
    return _DISTANCE_RANK[distance]


def _best_candidates(candidates: Sequence[PortChoice]) -> list[PortChoice]:
    if not candidates:
        return []
    best = _preference(candidates[0])
    return [candidate for candidate in candidates if _preference(candidate) == best]


def _preference(choice: PortChoice) -> tuple[int, float]:
    return (_DISTANCE_RANK[choice.distance], -(choice.rate_gbps or 0.0))
