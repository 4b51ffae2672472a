"""Read which UCX transport really carried a transfer, from UCX's ``UCX_PROTO_INFO=y`` tables.

UCX prints one table per endpoint configuration and operation, e.g.::

    | A intra-node cfg#1                                       |
    | remote memory write by ucp_put* from host memory to host |
    | 0..inf | zero-copy   | cma/memory                        |

Newer UCX versions put the title and the operation in one row, ranges use ``K``/``M``/``G``
suffixes and configs can name several lanes (``52% on tcp/lo and 48% on tcp/eth0``,
``rc_mlx5/mlx5_0:1 50% on path0 and 50% on path1``). The parser is tolerant of all of these:
it only needs the ``| ... |`` cells. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Classes the operator reasons about, from fastest-when-right to the fallback it must flag.
RDMA, NVLINK, CUDA_COPY, SHM, TCP, UNKNOWN = "rdma", "nvlink", "cuda_copy", "shm", "tcp", "unknown"

_CELLS = re.compile(r"\|(.*)\|\s*$")
_TITLE = re.compile(r"cfg#\d+|cfg\[\d+\]")
_LANE = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:\[\]\-]+)")
_WORD = re.compile(r"\b([a-z][a-z0-9_]*)\b")
_RANGE = re.compile(r"^\s*(\d+[KMGT]?)\s*(?:\.\.\s*(\d+[KMGT]?|inf))?\s*$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

_SHM_TLS = {"cma", "posix", "sysv", "xpmem", "knem"}
_RDMA_PREFIXES = ("rc_", "dc_", "ud_", "srd", "gga")
_KNOWN_TLS = _SHM_TLS | {"tcp", "cuda_ipc", "cuda_copy", "gdr_copy", "rocm_copy", "rocm_ipc"}


@dataclass
class ProtoTable:
    """One UCX protocol table: which lanes serve which message sizes for one operation."""

    title: str
    operation: str = ""
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (range, description, config)

    @property
    def is_self(self) -> bool:
        # "self" tables describe an endpoint to the own worker, not the peer under test.
        return " self " in f" {self.title} "


@dataclass(frozen=True)
class TransportReport:
    """The verdict on one transfer: its class, the UCX lanes and the network devices used."""

    transport: str
    transports: tuple[str, ...]
    lanes: tuple[str, ...]
    devices: tuple[str, ...]
    # A row said "emulation": UCX moved the bytes through the CPU over its active-message
    # lane (e.g. a READ of GPU memory, or cuda_ipc refused across PID namespaces).
    emulated: bool = False


def parse_proto_tables(text: str) -> list[ProtoTable]:
    """Parse every protocol table in a UCX log (other log lines are ignored)."""
    tables: list[ProtoTable] = []
    current: ProtoTable | None = None
    for line in text.splitlines():
        match = _CELLS.search(line)
        if not match:
            continue
        cells = [cell.strip() for cell in match.group(1).split("|")]
        if len(cells) <= 2 and _TITLE.search(cells[0]):
            current = ProtoTable(title=cells[0], operation=cells[1] if len(cells) == 2 else "")
            tables.append(current)
        elif current is None:
            continue
        elif len(cells) == 1 and not current.operation:
            current.operation = cells[0]
        elif len(cells) == 3 and cells[0] != "Range" and _RANGE.match(cells[0]):
            current.rows.append((cells[0], cells[1], cells[2]))
    return tables


def parse_range(text: str) -> tuple[int, float]:
    """``"16516..inf"`` -> (16516, inf); ``"0..2K"`` -> (0, 2048); ``"0"`` -> (0, 0)."""
    match = _RANGE.match(text)
    if not match:
        raise ValueError(f"not a UCX size range: {text!r}")
    low = _size(match.group(1))
    high_text = match.group(2)
    if high_text is None:
        return low, low
    return low, float("inf") if high_text == "inf" else _size(high_text)


def classify_tl(tl: str) -> str:
    """Map one UCX transport name (``rc_mlx5``, ``cuda_ipc``, ``tcp``...) to a class."""
    if tl.startswith(_RDMA_PREFIXES):
        return RDMA
    if tl == "cuda_ipc" or tl == "rocm_ipc":
        return NVLINK
    if tl in ("cuda_copy", "gdr_copy", "rocm_copy", "rocm_gdr"):
        return CUDA_COPY
    if tl in _SHM_TLS:
        return SHM
    if tl == "tcp":
        return TCP
    return UNKNOWN


def overall_class(classes: Iterable[str]) -> str:
    """One class for a transfer that used several lanes.

    The slowest network class wins (a TCP lane caps the transfer, so it is what must be
    reported), then RDMA (a cuda_copy beside it only stages through host memory), then the
    same-node classes.
    """
    found = set(classes)
    for cls in (TCP, RDMA, NVLINK, SHM, CUDA_COPY):
        if cls in found:
            return cls
    return UNKNOWN


_UCX_MEMORY = {"DRAM": "host", "VRAM": "cuda"}


def report_for_transfer(
    text: str,
    block_sizes: Iterable[int],
    operation: str = "remote memory write",
    src_mem: str | None = None,
    dst_mem: str | None = None,
) -> TransportReport:
    """The transport that served ``operation`` to a peer for the given message sizes.

    With the memory types given, only the tables for that source and destination count: a
    VRAM->VRAM probe also sends small host-memory messages (notifications, wire-up) over
    other lanes, such as tcp, that carry none of the KV bytes.
    """
    sizes = list(block_sizes)
    lanes: list[str] = []
    emulated = False
    tables = [
        t for t in parse_proto_tables(text) if not t.is_self and t.operation.startswith(operation)
    ]
    matching = [t for t in tables if _moves_between(t, src_mem, dst_mem)]
    for table in matching or tables:
        for range_text, description, config in table.rows:
            low, high = parse_range(range_text)
            if any(low <= size <= high for size in sizes):
                lanes.extend(_lanes(f"{description} {config}"))
                emulated = emulated or "emulation" in f"{description} {config}".lower()
    unique = tuple(dict.fromkeys(lanes))
    tls = tuple(dict.fromkeys(lane.split("/", 1)[0] for lane in unique))
    classes = tuple(dict.fromkeys(classify_tl(tl) for tl in tls))
    devices = tuple(
        dict.fromkeys(
            lane.split("/", 2)[1]
            for lane in unique
            if "/" in lane and classify_tl(lane.split("/", 1)[0]) in (RDMA, TCP)
        )
    )
    return TransportReport(overall_class(classes), classes, unique, devices, emulated)


def _moves_between(table: ProtoTable, src_mem: str | None, dst_mem: str | None) -> bool:
    """Whether the table is for this local/remote memory (``from cuda memory to cuda``,
    ``from host memory to cuda/dev[0]``, with NIXL's scatter-gather offload ``from sgl
    cuda/GPU0 to cuda/dev[3]``, and for a READ ``into cuda/GPU0 from cuda``); true when the
    memory types are not given."""
    if src_mem is None or dst_mem is None:
        return True
    text = table.operation
    src, dst = _UCX_MEMORY.get(src_mem, ""), _UCX_MEMORY.get(dst_mem, "")
    if " into " in text:  # a READ: ``into cuda/GPU0 from cuda`` (local, then remote memory)
        return (f"into {src}" in text or f"into sgl {src}" in text) and f"from {dst}" in text
    from_src = f"from {src}" in text or f"from sgl {src}" in text
    return from_src and f" to {dst}" in text


def _lanes(text: str) -> list[str]:
    """``tl/device`` tokens, plus bare transport names (``copy-in gdr_copy``)."""
    lanes = [f"{tl}/{dev}" for tl, dev in _LANE.findall(text)]
    named = {lane.split("/", 1)[0] for lane in lanes}
    lanes += [word for word in _WORD.findall(text) if word in _KNOWN_TLS and word not in named]
    return lanes


def _size(text: str) -> int:
    unit = text[-1] if text[-1] in _UNITS and not text[-1].isdigit() else ""
    return int(text[: len(text) - len(unit)]) * _UNITS[unit]
