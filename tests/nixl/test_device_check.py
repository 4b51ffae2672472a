"""The preflight's KV-path check: which link it measures, and a real run with NIXL here."""

from __future__ import annotations

import os

import pytest

from pdd_probe.device_check import (
    HOST_BLOCK_SIZES,
    LINK_BLOCK_SIZES,
    plan_device_check,
    run_device_check,
    without_cuda_ipc,
)


@pytest.mark.parametrize(
    ("gpus", "nics", "tls", "path", "probe_tls", "last"),
    [
        (8, "mlx5_0:1", "rc_x,cuda_copy,cuda_ipc", "rdma", "rc_x,cuda_copy", 7),
        (2, "", "", "nvlink", "", 1),
        (2, "all", "rc,cuda_ipc", "nvlink", "rc,cuda_ipc", 1),
        (1, "", "", "gpu", "", 0),
        (1, "mlx5_2:1", "", "rdma", "^cuda_ipc", 0),
        (0, "", "", "host", "", 0),
    ],
)
def test_the_check_takes_the_path_the_kv_will_take(
    gpus: int, nics: str, tls: str, path: str, probe_tls: str, last: int
) -> None:
    check = plan_device_check(gpus, nics, tls, 64 * 1024)
    assert check.path == path
    assert check.ucx_tls == probe_tls
    assert check.spec.dst_device == last
    link_sizes = HOST_BLOCK_SIZES if path == "host" else LINK_BLOCK_SIZES
    assert check.spec.block_sizes == list(link_sizes)
    assert check.engine is not None and check.engine.block_sizes == [64 * 1024]
    check.spec.validate()
    check.engine.validate()


def test_the_engines_descriptors_move_in_the_engines_own_pattern() -> None:
    """The link with several requests in flight; the engine's size as the engine moves it:
    one request, its NIXL threads, NIXL's split of the request between them."""
    check = plan_device_check(1, "", "", 512 * 1024, "READ", "host-pid", 4, 0)
    assert check.spec.concurrency > 1 and check.spec.nixl_threads == 0
    assert check.engine is not None
    assert (check.engine.concurrency, check.engine.nixl_threads) == (1, 4)
    assert check.engine.nixl_split_batch == 0
    assert (check.engine.operation, check.engine.peer_boundary) == ("READ", "host-pid")


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        ("", "^cuda_ipc"),
        ("all", "^cuda_ipc"),
        ("^tcp", "^tcp,cuda_ipc"),
        ("^cuda_ipc,tcp", "^cuda_ipc,tcp"),
        ("rc_x,cuda_ipc,cuda_copy", "rc_x,cuda_copy"),
    ],
)
def test_without_cuda_ipc(tls: str, expected: str) -> None:
    assert without_cuda_ipc(tls) == expected


def test_unknown_descriptor_size_measures_the_link_sizes_only() -> None:
    check = plan_device_check(2, "", "", None)
    assert check.spec.block_sizes == list(LINK_BLOCK_SIZES) and check.engine is None


def test_a_real_check_on_this_machine_moves_and_verifies_bytes() -> None:
    """No GPU here: the same code path between two processes over host memory, real NIXL,
    the engine's size with NIXL's thread pool as vLLM 0.33 runs it."""
    check = plan_device_check(0, "", "", 256 * 1024, nixl_threads=4)
    result = run_device_check(check, 256 * 1024, dict(os.environ))
    assert result.error is None, result.error
    assert result.verified
    assert (result.engine_nixl_threads, result.engine_split_batch) == (4, 0)
    assert result.measured_by == "preflight" and result.link == "host"
    assert {b.block_size for b in result.per_block_size} == {256 * 1024, *HOST_BLOCK_SIZES}
    assert all(b.gbps > 0 for b in result.per_block_size)


def test_the_verdict_figure_is_the_links_not_the_small_descriptors() -> None:
    check = plan_device_check(0, "", "", 4 * 1024)
    result = run_device_check(check, 4 * 1024, dict(os.environ))
    link = max(b.gbps for b in result.per_block_size if b.block_size in HOST_BLOCK_SIZES)
    assert result.gbps == link
