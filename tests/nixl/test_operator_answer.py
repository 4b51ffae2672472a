"""What the prober sidecar hands the operator: the preflight's check with the engine's devices,
once the peer is reachable; its own probe otherwise."""

from __future__ import annotations

import json
from pathlib import Path

from pdd_contract.probe_result import ProbeResult
from pdd_sidecar.prober import operator_answer, read_kv_path_check

PEER = ProbeResult(
    path="DRAM->DRAM", transport="tcp", gbps=0.4, verified=True, measured_by="sidecar",
    src_role="prefill", dst_role="decode", peer="llama-decode-0",
)  # fmt: skip
DEVICE = ProbeResult(
    path="VRAM->VRAM", transport="nvlink", gbps=379.2, verified=True, measured_by="preflight",
    link="nvlink", engine_descriptor_bytes=65536,
)  # fmt: skip


def test_the_engines_devices_answer_once_the_peer_is_reachable() -> None:
    answer = operator_answer(PEER, DEVICE)
    assert (answer.transport, answer.gbps, answer.measured_by) == ("nvlink", 379.2, "preflight")
    assert (answer.src_role, answer.dst_role, answer.peer) == (
        "prefill",
        "decode",
        "llama-decode-0",
    )


def test_an_unreachable_peer_fails_the_answer_whatever_the_devices_did() -> None:
    unreachable = ProbeResult(src_role="prefill", dst_role="decode", error="connection refused")
    assert operator_answer(unreachable, DEVICE) is unreachable


def test_without_a_preflight_check_the_sidecars_probe_answers() -> None:
    assert operator_answer(PEER, None) is PEER


def test_reading_the_check_file(tmp_path: Path) -> None:
    path = tmp_path / "kv-path.json"
    assert read_kv_path_check(path) is None  # the preflight did not run
    path.write_text("{not json")
    assert read_kv_path_check(path) is None
    path.write_text(json.dumps(DEVICE.to_dict()))
    assert read_kv_path_check(path) == DEVICE
