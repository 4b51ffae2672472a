"""The plain-words hints KVTransferVerified gives where a setting the user chose costs the KV
transfer more than twice the operator's default (factors from docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.registry import adapter_for
from pdd_operator.status.costly_settings import costly_settings

LLAMA_70B = {"name": "meta-llama/Llama-3.1-70B-Instruct"}
HOST_PID = {"podTemplate": {"spec": {"hostPID": True}}}
SHARED = {
    "prefill": {"gpusPerInstance": 1, **HOST_PID},
    "decode": {"gpusPerInstance": 1, **HOST_PID},
}
V033 = "vllm/vllm-openai:v0.33.0"


def hints(patch: dict[str, Any]) -> list[str]:
    spec = make_pdd({"model": LLAMA_70B, **patch}).spec
    return costly_settings(spec, adapter_for(spec.engine.type))


def test_the_defaults_cost_nothing_extra() -> None:
    assert hints({"engine": {"image": V033}, **SHARED}) == []
    assert hints({"engine": {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"}, **SHARED}) == []


def test_a_small_block_names_the_size_and_the_factor() -> None:
    (hint,) = hints({"engine": {"image": V033, "kvBlockSize": 16}, **SHARED})
    assert "spec.engine.kvBlockSize 16 makes 64 KiB KV descriptors" in hint
    assert "(256 tokens, 1 MiB)" in hint and "about 16x faster" in hint


def test_a_block_within_twice_the_default_is_not_flagged() -> None:
    assert hints({"engine": {"image": V033, "kvBlockSize": 128}, **SHARED}) == []


def test_pulling_where_pushing_was_measured_faster() -> None:
    (hint,) = hints(
        {"engine": {"image": V033}, "kvTransfer": {"connector": "NixlConnector"}, **SHARED}
    )
    assert "spec.kvTransfer.connector NixlConnector" in hint and "set it to auto" in hint
    # Separate pods: the pull connector is the default there, nothing to say.
    assert hints({"engine": {"image": V033}, "kvTransfer": {"connector": "NixlConnector"}}) == []


@pytest.mark.parametrize(
    "engine", [{"image": V033}, {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"}]
)
def test_scatter_gather_off_on_a_lane_that_carries_it(engine: dict[str, str]) -> None:
    kv = {"kvTransfer": {"ucx": {"scatterGather": False}}}
    (hint,) = hints({"engine": engine, **kv, **SHARED})
    assert hint.startswith("spec.kvTransfer.ucx.scatterGather false")
    # Over TCP emulation the operator turns the offload off itself.
    assert hints({"engine": engine, **kv}) == []
