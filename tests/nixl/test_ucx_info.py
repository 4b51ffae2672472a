"""Reading the transport UCX used from its UCX_PROTO_INFO tables (pure, no NIXL needed)."""

from __future__ import annotations

import pytest

from pdd_probe.ucx_info import (
    classify_tl,
    overall_class,
    parse_proto_tables,
    parse_range,
    report_for_transfer,
)

PREFIX = "[1795940343.954176] [vm:9328 :0]   "

# As nixl-cu12 1.5.1's UCX prints it on this machine: title and operation on separate rows.
SEPARATE_ROWS = "\n".join(
    PREFIX + line
    for line in [
        "+--------+-------------+-----------------------------------+",
        "| A self cfg#0                                             |",
        "| remote memory write by ucp_put* from host memory to host |",
        "+--------+-------------+-----------------------------------+",
        "| Range  | Description |              Config               |",
        "+--------+-------------+-----------------------------------+",
        "| 0..inf | zero-copy   | tcp/lo                            |",
        "+--------+-------------+-----------------------------------+",
        "| A intra-node cfg#1                                       |",
        "| remote memory write by ucp_put* from host memory to host |",
        "+--------+-------------+-----------------------------------+",
        "| Range  | Description |              Config               |",
        "+--------+-------------+-----------------------------------+",
        "| 0..inf | zero-copy   | cma/memory                        |",
        "+--------+-------------+-----------------------------------+",
    ]
)

# Newer UCX: title and operation in one row, K suffixes, multi-path lanes (from a NIXL issue).
ONE_ROW_RDMA = "\n".join(
    PREFIX + line
    for line in [
        "| ucp_context_0 intra-node cfg#1 | remote memory write by ucp_put*(fast-completion) "
        "from host memory to cuda/dev[0] |",
        "|                          0..2K | short     | rc_mlx5/mlx5_0:1/path0      |",
        "|                     2049..9383 | copy-in   | rc_mlx5/mlx5_0:1/path0      |",
        "|  9384..inf | zero-copy | rc_mlx5/mlx5_0:1 50% on path0 and 50% on path1 |",
        "| ucp_context_0 intra-node cfg#2 | active message by ucp_am_send* from cuda/GPU0 |",
        "|                         1..inf | multi-frag copy-in gdr_copy | tcp/eth0 |",
    ]
)


def _table(config: str, title: str = "ctx inter-node cfg#3") -> str:
    return "\n".join(
        [
            f"| {title} |",
            "| remote memory write by ucp_put* from cuda memory to cuda |",
            f"| 0..inf | zero-copy | {config} |",
        ]
    )


@pytest.mark.parametrize(
    ("text", "transport", "lanes", "devices"),
    [
        (SEPARATE_ROWS, "shm", ("cma/memory",), ()),
        (ONE_ROW_RDMA, "rdma", ("rc_mlx5/mlx5_0:1",), ("mlx5_0:1",)),
        (
            _table("52% on tcp/lo and 48% on tcp/eth0"),
            "tcp",
            ("tcp/lo", "tcp/eth0"),
            ("lo", "eth0"),
        ),
        (_table("cuda_ipc/cuda"), "nvlink", ("cuda_ipc/cuda",), ()),
        (_table("cuda_copy/cuda"), "cuda_copy", ("cuda_copy/cuda",), ()),
        (_table("rc_mlx5/mlx5_3:1, cuda_copy/cuda"), "rdma", None, ("mlx5_3:1",)),
        (_table("dc_mlx5/mlx5_1:1"), "rdma", ("dc_mlx5/mlx5_1:1",), ("mlx5_1:1",)),
        (_table("tcp/eth0", title="ctx self cfg#0"), "unknown", (), ()),
        ("no tables at all\n", "unknown", (), ()),
    ],
)
def test_report_for_transfer(
    text: str, transport: str, lanes: tuple[str, ...] | None, devices: tuple[str, ...]
) -> None:
    report = report_for_transfer(text, [256 << 10, 16 << 20])
    assert report.transport == transport
    if lanes is not None:
        assert report.lanes == lanes
    assert report.devices == devices


def test_only_rows_covering_the_block_sizes_count() -> None:
    text = "\n".join(
        [
            "| ctx inter-node cfg#1 |",
            "| remote memory write by ucp_put* from host memory to host |",
            "| 0..8K | short | tcp/eth0 |",
            "| 8193..inf | zero-copy | rc_mlx5/mlx5_0:1 |",
        ]
    )
    assert report_for_transfer(text, [1 << 20]).transport == "rdma"
    assert report_for_transfer(text, [4096]).transport == "tcp"


def test_parse_tables_keeps_title_and_operation() -> None:
    tables = parse_proto_tables(SEPARATE_ROWS)
    assert [(t.title, t.is_self) for t in tables] == [
        ("A self cfg#0", True),
        ("A intra-node cfg#1", False),
    ]
    assert tables[1].operation.startswith("remote memory write")
    assert tables[1].rows == [("0..inf", "zero-copy", "cma/memory")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0..inf", (0, float("inf"))),
        ("16516..inf", (16516, float("inf"))),
        ("0..2K", (0, 2048)),
        ("0", (0, 0)),
        ("1M..4G", (1 << 20, 4 << 30)),
    ],
)
def test_parse_range(text: str, expected: tuple[int, float]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize(
    ("tl", "cls"),
    [
        ("rc_mlx5", "rdma"),
        ("rc_verbs", "rdma"),
        ("dc_mlx5", "rdma"),
        ("ud_verbs", "rdma"),
        ("srd", "rdma"),
        ("cuda_ipc", "nvlink"),
        ("cuda_copy", "cuda_copy"),
        ("gdr_copy", "cuda_copy"),
        ("cma", "shm"),
        ("posix", "shm"),
        ("sysv", "shm"),
        ("xpmem", "shm"),
        ("tcp", "tcp"),
        ("self", "unknown"),
    ],
)
def test_classify_tl(tl: str, cls: str) -> None:
    assert classify_tl(tl) == cls


def test_tcp_lane_dominates() -> None:
    assert overall_class(["rdma", "tcp"]) == "tcp"
    assert overall_class(["cuda_copy", "rdma"]) == "rdma"
    assert overall_class(["shm", "cuda_copy"]) == "shm"
    assert overall_class([]) == "unknown"


# Shape of a VRAM->VRAM probe on one H200 (nixl-cu13 1.5.1): host-memory tables for the
# notifications beside the cuda-memory table that carried the KV bytes.
MIXED_MEMORY = "\n".join(
    [
        "| ctx intra-node cfg#1 |",
        "| remote memory write by ucp_put* from host memory to host |",
        "| 0..inf | zero-copy | cma/memory |",
        "| ctx inter-node cfg#2 |",
        "| remote memory write by ucp_put* from host memory to host |",
        "| 0..inf | zero-copy | tcp/lo |",
        "| ctx intra-node cfg#3 |",
        "| remote memory write by ucp_put* from cuda memory to cuda |",
        "| 0..inf | zero-copy | cuda_ipc/cuda |",
    ]
)


@pytest.mark.parametrize(
    "src,dst,expected",
    [("VRAM", "VRAM", "nvlink"), ("DRAM", "DRAM", "tcp"), (None, None, "tcp")],
)
def test_only_the_tables_of_the_probed_memory_types_count(
    src: str | None, dst: str | None, expected: str
) -> None:
    report = report_for_transfer(MIXED_MEMORY, [16 << 20], src_mem=src, dst_mem=dst)
    assert report.transport == expected


# With NIXL_UCX_SGL_ENABLE=y (two H200): the KV moves by a scatter-gather put whose table
# names the source as "sgl cuda/GPU0"; the host tables beside it carry only notifications.
SGL_TABLES = "\n".join(
    [
        "| ctx inter-node cfg#2 |",
        "| remote memory write by ucp_put* from host memory to cuda/dev[2] |",
        "| 0..inf | software emulation | tcp/lo |",
        "| ctx intra-node cfg#7 |",
        "| remote memory write by ucp_put* from sgl cuda/GPU0 to cuda/dev[3] |",
        "| 0..inf | sgl | cuda_ipc/cuda |",
    ]
)


def test_a_scatter_gather_put_counts_as_the_cuda_table() -> None:
    report = report_for_transfer(SGL_TABLES, [64 << 10], src_mem="VRAM", dst_mem="VRAM")
    assert report.transport == "nvlink"


# UCX 1.23.0 (nixl-cu13 1.5.1) on one H200, a READ from a peer beyond a pod boundary
# (bench/results/issue35-kv-boundary-h200/ucx-tables.txt): a READ's table says "into LOCAL
# from REMOTE", and the lane is software emulation over TCP.
READ_EMULATED = "\n".join(
    PREFIX + line
    for line in [
        "+--------+--------------------+----------------------------------+",
        "| B intra-node cfg#2                                             |",
        "| remote memory read by ucp_get*(multi) into host from host       |",
        "+--------+--------------------+----------------------------------+",
        "| Range  |    Description     |              Config              |",
        "+--------+--------------------+----------------------------------+",
        "| 0..inf | zero-copy          | cma/memory                       |",
        "+--------+--------------------+----------------------------------+",
        "| B intra-node cfg#2                                             |",
        "| remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda |",
        "+--------+--------------------+----------------------------------+",
        "| Range  |    Description     |              Config              |",
        "+--------+--------------------+----------------------------------+",
        "| 0..inf | software emulation | tcp/lo                           |",
        "+--------+--------------------+----------------------------------+",
    ]
)


def test_a_read_is_read_from_its_own_table_and_emulation_is_flagged() -> None:
    report = report_for_transfer(
        READ_EMULATED, [65536], operation="remote memory read", src_mem="VRAM", dst_mem="VRAM"
    )
    assert report.transport == "tcp" and report.lanes == ("tcp/lo",)
    assert report.emulated
    host = report_for_transfer(
        READ_EMULATED, [65536], operation="remote memory read", src_mem="DRAM", dst_mem="DRAM"
    )
    assert host.lanes == ("cma/memory",) and not host.emulated
