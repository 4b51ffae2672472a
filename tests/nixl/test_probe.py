"""The transfer probe with real NIXL over loopback: it moves and verifies the bytes, names the
transport UCX really used, and its verdict flags TCP against an RDMA-sized expectation."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from nixl_harness import REPO, Processes, child_env, free_port, http, wait_until

from pdd_contract.probe_result import REASON_TCP, REASON_VERIFIED, classify_probe
from pdd_probe.probe import ProbeSpec, block_plan, run_local_probe

pytestmark = pytest.mark.nixl

KIB, MIB = 1 << 10, 1 << 20
SPEC = ProbeSpec(bytes_per_size=4 * MIB, iterations=2, timeout_s=60)


def test_loopback_probe_over_tcp_is_a_tcp_fallback() -> None:
    result = run_local_probe(SPEC, env=child_env(UCX_TLS="tcp"))

    assert result.error is None, result.error
    assert result.verified
    assert result.transport == "tcp"
    assert "tcp/lo" in result.lanes
    assert result.path == "DRAM->DRAM"
    assert result.block_sizes == [256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB]
    plan = block_plan(SPEC.block_sizes, SPEC.bytes_per_size)
    assert result.bytes == sum(slot.nbytes for slot in plan) * SPEC.iterations
    assert result.blocks == sum(slot.count for slot in plan) * SPEC.iterations
    assert [b.blocks for b in result.per_block_size] == [16, 4, 1, 1]
    assert result.gbps > 0 and all(b.gbps > 0 for b in result.per_block_size)
    assert result.ucx_tls == "tcp" and result.ucx_net_devices == "lo"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", result.started_at)
    assert result.duration_s > 0

    ok, reason, message = classify_probe(result, expected_link_gbps=40, min_fraction=1.0)
    assert (ok, reason) == (False, REASON_TCP)
    lanes = ", ".join(result.lanes)
    assert message.startswith(
        f"tcp fallback: {result.gbps:.1f} GB/s on {lanes}, expected ≥ 40 GB/s over lo"
    )
    assert classify_probe(result.to_dict(), 0.001, 1.0)[:2] == (True, REASON_VERIFIED)


def test_loopback_probe_default_transports() -> None:
    """Without UCX_TLS, two processes on one host use shared memory (cma) or TCP."""
    env = child_env()
    env.pop("UCX_TLS", None)
    result = run_local_probe(SPEC, env=env)
    assert result.error is None, result.error
    assert result.verified
    assert result.transport in ("shm", "tcp"), result.lanes


def test_probe_through_the_sidecars(procs: Processes) -> None:
    pa, pb = free_port("127.0.0.2"), free_port("127.0.0.3")
    source = f"static:prefill=127.0.0.2:{pa},decode=127.0.0.3:{pb}"
    env = child_env(UCX_TLS="tcp")
    procs.sidecar(host="127.0.0.2", port=pa, role="prefill", pod="demo-prefill-0", uid="ua",
                  peer_source=source, env=env)  # fmt: skip
    decode = procs.sidecar(host="127.0.0.3", port=pb, role="decode", pod="demo-decode-0",
                           uid="ub", peer_source=source, env=env)  # fmt: skip

    def prefill_seen() -> bool:
        return [p["pod_uid"] for p in decode.get_json("/v1/peers")["pods"]] == ["ua"]

    wait_until(prefill_seen, 15, "decode to see the prefill sidecar")

    body = json.dumps({"peer": "demo-prefill-0", **SPEC.to_dict()}).encode()
    status, raw, _ = http("POST", f"{decode.url}/v1/probe", body=body, timeout=120)
    assert status == 200, raw
    result = json.loads(raw)
    assert result["error"] is None, result["error"]
    assert result["verified"] is True
    assert result["transport"] == "tcp"
    assert (result["src_role"], result["dst_role"], result["peer"]) == (
        "decode", "prefill", "demo-prefill-0"
    )  # fmt: skip
    for key in ("path", "gbps", "bytes", "blocks", "block_sizes", "ucx_tls", "ucx_net_devices",
                "started_at", "duration_s"):  # fmt: skip
        assert key in result
    gauge = decode.metric(
        "pdd_sidecar_transfer_bandwidth_bytes_per_second",
        src_role="decode", dst_role="prefill", path="DRAM->DRAM",
    )  # fmt: skip
    assert gauge == pytest.approx(result["gbps"] * 1e9)
    assert decode.get_json("/v1/status")["last_probe"]["verified"] is True

    missing = json.dumps({"peer": "nobody"}).encode()
    assert http("POST", f"{decode.url}/v1/probe", body=missing)[0] == 404
    bad = json.dumps({"peer": "demo-prefill-0", "src_mem": "HBM"}).encode()
    assert http("POST", f"{decode.url}/v1/probe", body=bad)[0] == 400


def test_probe_cli_loopback_and_classify() -> None:
    env = child_env(UCX_TLS="tcp")
    args = ["--bytes-per-size", str(1 * MIB), "--iterations", "1", "--timeout", "60"]
    probe = subprocess.run(
        [sys.executable, "-m", "pdd_sidecar", "probe", "loopback", *args],
        capture_output=True, env=env, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr.decode()[-2000:]
    result = json.loads(probe.stdout)
    assert result["verified"] and result["transport"] == "tcp"

    verdict = subprocess.run(
        [sys.executable, "-m", "pdd_sidecar", "probe", "classify", "--expected-gbps", "40"],
        input=probe.stdout, capture_output=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert verdict.returncode == 1
    document = json.loads(verdict.stdout)
    assert document["ok"] is False and document["reason"] == REASON_TCP
    assert document["message"].startswith("tcp fallback:")
