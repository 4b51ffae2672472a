"""The KV-path check across a pod boundary, with real NIXL on the CPU.

Two processes in one PID namespace move host memory over UCX's `cma` lane; put the target in
PID, IPC and mount namespaces of its own (`pdd_probe.boundary`, as the peer pod's engine is)
and `cma` cannot reach it: UCX falls back to TCP. That is the CPU twin of what the boundary
does to `cuda_ipc` between two GPU pods on one node, and the check must report it, in the
engine's direction, as a TCPFallback whose message says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nixl_harness import child_env

from pdd_contract.probe_result import REASON_TCP, classify_probe
from pdd_node.kv_path import KvPathRequest, check_kv_path
from pdd_probe.probe import MIB, ProbeSpec, run_local_probe

# cma is the lane a pod boundary breaks for host memory; tcp is what is left.
FORCED_TLS = "cma,tcp,self"


def spec(operation: str, boundary: str) -> ProbeSpec:
    return ProbeSpec(
        src_mem="DRAM", dst_mem="DRAM", block_sizes=[64 * 1024, 4 * MIB], bytes_per_size=8 * MIB,
        iterations=1, timeout_s=60, operation=operation, peer_boundary=boundary,
    )  # fmt: skip


@pytest.mark.parametrize("operation", ["WRITE", "READ"])
def test_within_one_pid_namespace_the_bytes_take_cma(operation: str) -> None:
    result = run_local_probe(spec(operation, "none"), env=child_env(UCX_TLS=FORCED_TLS))
    assert result.error is None and result.verified, result
    assert (result.operation, result.peer_boundary) == (operation, "none")
    assert result.transport == "shm" and result.lanes == ["cma/memory"], result.lanes


@pytest.mark.parametrize("operation", ["WRITE", "READ"])
def test_two_host_pid_pods_need_host_ipc_too_for_cma(operation: str) -> None:
    """Two pods with hostPID share the PID namespace but not their IPC namespaces: UCX's
    shared-memory transports (cma among them) carry the IPC namespace in their address and
    reach no peer outside it, so the bytes go by TCP. With hostIPC too, cma reaches."""
    result = run_local_probe(spec(operation, "host-pid"), env=child_env(UCX_TLS=FORCED_TLS))
    assert result.error is None and result.verified, result
    assert (result.operation, result.peer_boundary) == (operation, "host-pid")
    assert result.transport == "tcp" and "cma/memory" not in result.lanes, result.lanes

    result = run_local_probe(spec(operation, "host-pid-ipc"), env=child_env(UCX_TLS=FORCED_TLS))
    assert result.error is None and result.verified, result
    assert result.transport == "shm" and result.lanes == ["cma/memory"], result.lanes


@pytest.mark.parametrize("operation", ["WRITE", "READ"])
def test_across_a_pod_boundary_cma_cannot_reach_and_the_check_says_tcp_fallback(
    operation: str,
) -> None:
    result = run_local_probe(spec(operation, "pod"), env=child_env(UCX_TLS=FORCED_TLS))
    assert result.error is None and result.verified, result
    assert (result.operation, result.peer_boundary) == (operation, "pod")
    assert result.transport == "tcp" and "tcp/lo" in result.lanes, result.lanes
    assert "cma/memory" not in result.lanes

    result.link = "host"  # what the preflight sets for a pod without GPUs
    ok, reason, message = classify_probe(result, expected_link_gbps=50, min_fraction=0.5)
    assert (ok, reason) == (False, REASON_TCP)
    assert "separate pods without a shared PID namespace" in message, message
    assert "tcp/lo" in message


def test_a_read_across_the_boundary_pulls_exactly_the_blocks_the_target_laid_out() -> None:
    """A READ is verified where the bytes arrive: the pulled blocks equal the pattern the
    target laid out, and the target's source is unchanged."""
    result = run_local_probe(spec("READ", "pod"), env=child_env(UCX_TLS="tcp"))
    assert result.verified and result.bytes > 0, result


def test_the_preflight_check_follows_the_operators_direction_and_boundary(
    tmp_path: Path,
) -> None:
    out = tmp_path / "kv-path.json"
    request = KvPathRequest(gpus=0, descriptor_bytes=64 * 1024, operation="READ")
    result = check_kv_path(request, child_env(UCX_TLS=FORCED_TLS), out)
    written = json.loads(out.read_text())
    assert written["operation"] == "READ" and written["peer_boundary"] == "pod"
    assert written["link"] == "host" and written["measured_by"] == "preflight"
    assert result.transport == "tcp", result.lanes
