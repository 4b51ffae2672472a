"""Where a PCI function sits in the PCIe tree, and nvidia-smi's distance class between two.

A device's resolved sysfs path spells its place in the tree, e.g.
`/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/0000:1b:00.0`:
host bridge `pci0000:17`, root port `17:01.0`, then one PCIe switch (upstream port `18:00.0`,
downstream port `19:01.0`), then the device `1b:00.0`.

nvidia-smi counts PCIe *switches*, not bridge functions: a switch shows up in sysfs as two
bridges (its upstream port and one of its downstream ports), so below the root port the
bridges pair up into switches. NCCL reads sysfs the same way (it steps up two path levels
per switch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from pdd_node.topology.model import DistanceClass

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciePath:
    """A PCI function's host bridge and the chain of functions from the root port down to it."""

    host_bridge: str
    chain: tuple[str, ...]

    @classmethod
    def from_sysfs_path(cls, path: str | PurePath) -> PciePath | None:
        """Parse a resolved `/sys/devices/pci.../...` path; None if it is not under a host bridge
        (a virtual device such as a soft-RoCE rxe0)."""
        parts = [part.lower() for part in PurePath(path).parts]
        roots = [i for i, part in enumerate(parts) if _HOST_BRIDGE.match(part)]
        if not roots:
            return None
        start = roots[-1]
        chain: list[str] = []
        for part in parts[start + 1 :]:
            if not _BDF.match(part):
                break  # e.g. ".../0000:1a:00.0/infiniband/mlx5_0": the device ends here
            chain.append(part)
        if not chain:
            return None
        return cls(host_bridge=parts[start], chain=tuple(chain))

    @property
    def address(self) -> str:
        return self.chain[-1]

    @property
    def switches(self) -> tuple[tuple[str, ...], ...]:
        """The PCIe switches above the device, outermost first, each named by the path down to
        its upstream port (unique in the tree)."""
        bridges = self.chain[:-1]
        # bridges[0] is the root port, part of the host bridge; then (upstream, downstream)
        # pairs, one per switch.
        upstream_positions = range(1, len(bridges), 2)
        return tuple(self.chain[: position + 1] for position in upstream_positions)


def distance_class(
    a: PciePath | None, a_numa: int | None, b: PciePath | None, b_numa: int | None
) -> DistanceClass:
    """nvidia-smi `topo -m`'s class for two PCI devices. Unknown placement is SYS (farthest):
    choosing a NIC on a guess is worse than saying it may be far."""
    if a is not None and b is not None and a.host_bridge == b.host_bridge:
        return _class_under_one_host_bridge(a, b)
    if a_numa is not None and a_numa == b_numa:
        return "NODE"
    return "SYS"


def _class_under_one_host_bridge(a: PciePath, b: PciePath) -> DistanceClass:
    shared = _common_prefix_length(a.switches, b.switches)
    if shared == 0:
        return "PHB"
    # The path goes up from a to the lowest shared switch and down to b.
    switches_traversed = (len(a.switches) - shared) + (len(b.switches) - shared) + 1
    return "PIX" if switches_traversed == 1 else "PXB"


def _common_prefix_length(a: tuple[tuple[str, ...], ...], b: tuple[tuple[str, ...], ...]) -> int:
    length = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        length += 1
    return length
