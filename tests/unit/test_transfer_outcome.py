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


def outcome(probe: dict[str, Any], patch: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    out = transfer_outcome(make_pdd(patch), replace(PROBER, probe_result=probe))
    assert out is not None
    return out


def test_a_preflight_result_reports_the_link_and_the_engines_descriptor_figure() -> None:
    out = outcome(result(), {"engine": {"kvBlockSize": 16}})
    assert out.ok is True
    status = out.status
    assert (status.measuredBy, status.link) == ("preflight", "nvlink")
    assert (status.engineDescriptorBytes, status.engineGBps) == (64 * KIB, 12.2)
    assert "measured with the engine's devices (nvlink link)" in status.message
    assert "at the engine's 64 KiB KV descriptors 12.2 GB/s (3% of the link's 352.8)" in (
        status.message
    )
    assert "spec.engine.kvBlockSize" in status.message


def test_no_block_hint_where_the_operator_chose_the_block() -> None:
    status = outcome(result()).status
    assert "(3% of the link's 352.8)" in status.message
    assert "kvBlockSize" not in status.message


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


def test_the_status_says_what_a_prompts_kv_costs_at_the_measured_rate() -> None:
    """make_pdd is Llama-3.1-8B at TP 2 with vLLM's 16-token blocks: 4,096 tokens x 32 layers
    x 4 KV heads per rank x 128 x 2 bytes x (K and V) = 268 MB per rank, at the engine's
    descriptor rate (12.2 GB/s) 22.0 ms."""
    status = outcome(result()).status
    per_rank = 4096 * 32 * 4 * 128 * 2 * 2
    assert status.promptKVSeconds == round(per_rank / 12.2e9, 4)
    assert "a 4,096-token prompt's KV (0.27 GB per engine rank) takes 22.0 ms" in status.message
    # Without the engine's own figure, the link's rate prices it.
    link_only = outcome(result(per_block_size=[])).status
    assert link_only.promptKVSeconds == round(per_rank / 352.8e9, 4)
