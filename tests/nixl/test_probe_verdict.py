"""classify_probe: the KVTransferVerified verdict the operator derives from a probe result."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_contract.probe_result import (
    REASON_CORRUPT,
    REASON_FAILED,
    REASON_SLOW,
    REASON_TCP,
    REASON_VERIFIED,
    ProbeResult,
    classify_probe,
)


def _result(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "path": "VRAM->VRAM",
        "transport": "rdma",
        "gbps": 48.0,
        "verified": True,
        "ucx_net_devices": "mlx5_3:1",
        "error": None,
    }
    return {**base, **overrides}


@pytest.mark.parametrize(
    ("result", "ok", "reason", "message"),
    [
        (
            _result(),
            True,
            REASON_VERIFIED,
            "rdma: 48.0 GB/s on VRAM->VRAM (expected ≥ 40 GB/s), bytes verified",
        ),
        (
            _result(transport="tcp", gbps=0.5),
            False,
            REASON_TCP,
            "tcp fallback: 0.5 GB/s, expected ≥ 40 GB/s over mlx5_3:1: check the RDMA resource, "
            "memlock, UCX_NET_DEVICES",
        ),
        (
            _result(transport="tcp", gbps=0.5, ucx_net_devices=""),
            False,
            REASON_TCP,
            "tcp fallback: 0.5 GB/s, expected ≥ 40 GB/s: check the RDMA resource, memlock, "
            "UCX_NET_DEVICES",
        ),
        (_result(gbps=21.0), False, REASON_SLOW, "rdma: 21.0 GB/s, expected ≥ 40 GB/s over"),
        (_result(transport="cuda_copy", gbps=9.0), False, REASON_SLOW, "cuda_copy: 9.0 GB/s"),
        (_result(verified=False), False, REASON_CORRUPT, "rdma: 48.0 GB/s but the bytes"),
        (
            _result(error="NIXL refused to post the transfer", verified=False),
            False,
            REASON_FAILED,
            "transfer probe failed on VRAM->VRAM: NIXL refused to post the transfer",
        ),
    ],
)
def test_classify_probe(result: dict[str, Any], ok: bool, reason: str, message: str) -> None:
    got_ok, got_reason, got_message = classify_probe(result, 50.0, 0.8)
    assert (got_ok, got_reason) == (ok, reason)
    assert got_message.startswith(message), got_message


def test_threshold_is_inclusive_and_accepts_the_dataclass() -> None:
    result = ProbeResult.from_dict(_result(gbps=40.0))
    assert classify_probe(result, 50.0, 0.8)[0] is True
    assert classify_probe(result, 50.0, 0.81)[0] is False


def test_result_round_trips_through_json_shape() -> None:
    document = ProbeResult(
        path="DRAM->DRAM",
        per_block_size=[],
        block_sizes=[262144],
    ).to_dict()
    for key in ("path", "transport", "gbps", "bytes", "blocks", "block_sizes", "verified",
                "ucx_tls", "ucx_net_devices", "started_at", "duration_s", "error"):  # fmt: skip
        assert key in document
    assert ProbeResult.from_dict({**document, "unknown_field": 1}).path == "DRAM->DRAM"


@pytest.mark.parametrize(
    ("overrides", "cause"),
    [
        # Two pods on one node, no shared PID namespace: cuda_ipc refused, TCP emulation.
        (
            {"transport": "tcp", "gbps": 0.5, "link": "gpu", "peer_boundary": "pod",
             "operation": "READ", "emulated": True, "lanes": ["tcp/lo"]},
            "separate pods without a shared PID namespace",
        ),
        # Emulated even within one namespace: vLLM's READ where get_zcopy is off.
        (
            {"transport": "cuda_copy", "gbps": 400.0, "link": "gpu", "peer_boundary": "none",
             "operation": "READ", "emulated": True},
            "an engine that WRITEs",
        ),
        # Across nodes over a NIC that fell back: the RDMA checklist.
        (
            {"transport": "tcp", "gbps": 1.0, "link": "rdma", "peer_boundary": "pod"},
            "check the RDMA resource",
        ),
    ],
)  # fmt: skip
def test_a_tcp_or_emulated_lane_is_a_tcp_fallback_with_its_cause(
    overrides: dict[str, Any], cause: str
) -> None:
    ok, reason, message = classify_probe(_result(**overrides), 50.0, 0.5)
    assert (ok, reason) == (False, REASON_TCP), message
    assert cause in message, message


def test_a_read_whose_pulled_bytes_differ_is_not_verified() -> None:
    from pdd_probe.probe import merge_results

    pulled_wrong = {**_result(), "operation": "READ", "read_verified": False}
    assert not merge_results(pulled_wrong, {"verified": True}).verified
    pulled_right = {**pulled_wrong, "read_verified": True}
    assert merge_results(pulled_right, {"verified": True}).verified
    # The target found its source changed: a READ must not write.
    assert not merge_results(pulled_right, {"verified": False}).verified
