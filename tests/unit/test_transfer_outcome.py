"""status.transfer from a probe result: the link's figure, who measured it, and the engine's
own descriptor size beside it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from helpers.factories import make_pdd
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.transfer import transfer_outcome

PROBER = PodSummary(
    name="llama-prefill-0", uid="u0", role="prefill", node="gpu-a-00",
    ready=True, revision="r1", problem=None,
)  # fmt: skip
KIB, MIB = 1 << 10, 1 << 20


def result(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "path": "VRAM->VRAM", "transport": "nvlink", "gbps": 352.8, "verified": True,
        "measured_by": "preflight", "link": "nvlink", "engine_descriptor_bytes": 64 * KIB,
        "per_block_size": [
            {"block_size": 64 * KIB, "blocks": 4096, "bytes": 1, "seconds": 1.0, "gbps": 12.2},
            {"block_size": 16 * MIB, "blocks": 16, "bytes": 1, "seconds": 1.0, "gbps": 352.8},
        ],
    }  # fmt: skip
    return {**base, **fields}


def outcome(probe: dict[str, Any]):  # type: ignore[no-untyped-def]
    out = transfer_outcome(make_pdd(), replace(PROBER, probe_result=probe))
    assert out is not None
    return out


def test_a_preflight_result_reports_the_link_and_the_engines_descriptor_figure() -> None:
    out = outcome(result())
    assert out.ok is True
    status = out.status
    assert (status.measuredBy, status.link) == ("preflight", "nvlink")
    assert (status.engineDescriptorBytes, status.engineGBps) == (64 * KIB, 12.2)
    assert "measured with the engine's devices (nvlink link)" in status.message
    assert "at the engine's 64 KiB KV descriptors 12.2 GB/s (3% of the link's 352.8)" in (
        status.message
    )
    assert "spec.engine.kvBlockSize" in status.message


def test_no_hint_when_the_engines_descriptors_reach_the_link() -> None:
    rows = [{"block_size": 64 * KIB, "blocks": 1, "bytes": 1, "seconds": 1.0, "gbps": 300.0}]
    status = outcome(result(per_block_size=rows)).status
    assert status.engineGBps == 300.0
    assert "kvBlockSize" not in status.message


def test_a_sidecar_result_says_it_was_measured_without_the_engines_gpus() -> None:
    status = outcome(result(measured_by="", link="", engine_descriptor_bytes=0)).status
    assert status.measuredBy == "sidecar"
    assert "without the engine's GPUs" in status.message
    assert (status.engineDescriptorBytes, status.engineGBps) == (0, 0.0)
