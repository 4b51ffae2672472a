"""The KV-path check across a pod boundary, with real NIXL on the CPU.

Two processes in one PID namespace move host memory over UCX's `cma` lane; put the target in
PID, IPC and mount namespaces of its own (`pdd_probe.boundary`, as the peer pod's engine is)
and `cma` cannot reach it: UCX falls back to TCP. That is the CPU twin of what the boundary
does to `cuda_ipc` between two GPU pods on one node, and the check must report it, in the
engine's direction, as a TCPFallback whose message says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


NO_UNSHARE = Path(__file__).resolve().parents[1] / "helpers" / "no_unshare.py"


def tls_env(tls: str) -> dict[str, str]:
    """The probe's environment with UCX_TLS set to `tls`, or unset where it is empty."""
    env = child_env()
    env.pop("UCX_TLS", None)
    return {**env, "UCX_TLS": tls} if tls else env


def check_without_namespaces(
    boundary: str, operation: str, tls: str = FORCED_TLS
) -> dict[str, object]:
    """The preflight's check (`pdd_probe.device_check`, host memory) where `unshare` is refused,
    as in a pod that drops every capability under the runtime's default seccomp profile."""
    argv = [
        sys.executable, str(NO_UNSHARE), "--", sys.executable, "-m", "pdd_probe.device_check",
        "--gpus", "0", "--operation", operation, "--peer-boundary", boundary,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=tls_env(tls))
    assert done.stdout, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("operation", ["WRITE", "READ"])
@pytest.mark.parametrize("boundary", ["pod", "host-pid", "host-pid-ipc"])
def test_where_namespaces_are_refused_the_boundary_is_emulated_and_takes_the_same_lanes(
    boundary: str, operation: str
) -> None:
    """Refused namespaces do not fail the check: the peer runs in this pod on the transports
    that cross the boundary, and UCX takes the lanes it takes across the real boundary
    (made here, as root, by `pdd_probe.boundary`)."""
    real = run_local_probe(spec(operation, boundary), env=child_env(UCX_TLS=FORCED_TLS))
    assert real.error is None and real.verified and not real.boundary_emulation, real

    emulated = check_without_namespaces(boundary, operation)
    assert emulated["error"] is None and emulated["verified"], emulated
    assert emulated["peer_boundary"] == boundary
    assert (emulated["transport"], emulated["lanes"]) == (real.transport, real.lanes)
    emulation = str(emulated["boundary_emulation"])
    assert "namespaces refused" in emulation and "EPERM" in emulation, emulation
    if boundary == "host-pid-ipc":
        assert emulation.startswith(f"UCX_TLS={FORCED_TLS} "), emulation  # nothing stopped
    else:
        assert emulation.startswith("UCX_TLS=tcp,self "), emulation  # cma taken out


def test_with_nothing_to_take_out_the_engines_transports_are_left_as_they_are() -> None:
    """Between two hostPID+hostIPC pods no transport is stopped: an unset UCX_TLS stays unset
    (UCX refuses an empty one)."""
    emulated = check_without_namespaces("host-pid-ipc", "WRITE", tls="")
    assert emulated["error"] is None and emulated["verified"], emulated
    assert str(emulated["boundary_emulation"]).startswith("UCX_TLS=all (nothing stopped)")
