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
