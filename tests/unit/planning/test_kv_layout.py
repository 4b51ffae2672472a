"""The engines' KV descriptor sizes, worked out by hand from the models' config.json."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.kv_layout import (
    KvCacheShape,
    block_tokens,
    chosen_block_tokens,
    descriptor_bytes,
    engine_descriptor_bytes,
    known_shape,
    prompt_plan,
)

LLAMA_70B = KvCacheShape(layers=80, kv_heads=8, head_dim=128)
DEEPSEEK_V3 = KvCacheShape(layers=61, kv_heads=1, head_dim=576, latent=True)


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", 80, 8),
        ("meta-llama/Meta-Llama-3-8B", 32, 8),
        ("/models/Llama-3.3-70B-Instruct", 80, 8),
        ("Qwen/Qwen2.5-7B-Instruct", 28, 4),
        ("deepseek-ai/DeepSeek-R1", 61, 1),
    ],
)
def test_known_models_by_name(name: str, layers: int, kv_heads: int) -> None:
    shape = known_shape(name)
    assert shape is not None
    assert (shape.layers, shape.kv_heads) == (layers, kv_heads)


def test_unknown_model_has_no_shape() -> None:
    assert known_shape("my-org/finetune-v2") is None


def test_bytes_per_token_70b() -> None:
    # 80 layers x (K + V) x 8 heads x 128 values x 2 bytes
    assert LLAMA_70B.bytes_per_token() == 327_680


@pytest.mark.parametrize(
    ("block_tokens", "tp", "packed", "expected"),
    [
        (16, 1, True, 64 * 1024),  # vLLM's default block, K and V in one descriptor
        (16, 8, True, 8 * 1024),
        (16, 16, True, 8 * 1024),  # more ranks than KV heads: each keeps one whole head
        (128, 1, True, 512 * 1024),
        (16, 1, False, 32 * 1024),  # K and V apart (SGLang)
        (1, 1, False, 2 * 1024),  # SGLang's default page of one token
        (1, 8, False, 256),
    ],
)
def test_descriptor_bytes_gqa(block_tokens: int, tp: int, packed: bool, expected: int) -> None:
    assert descriptor_bytes(LLAMA_70B, block_tokens, tp, packed) == expected


@pytest.mark.parametrize(("tp", "packed"), [(1, True), (8, True), (16, False)])
def test_latent_cache_is_the_same_on_every_rank(tp: int, packed: bool) -> None:
    assert descriptor_bytes(DEEPSEEK_V3, 64, tp, packed) == 64 * 576 * 2


@pytest.mark.parametrize(("packed", "descriptors"), [(True, 256 * 80), (False, 256 * 80 * 2)])
def test_prompt_plan_matches_the_prompts_kv_bytes(packed: bool, descriptors: int) -> None:
    plan = prompt_plan(LLAMA_70B, block_tokens=16, tp=1, tokens=4096, packed=packed)
    assert plan.descriptors == descriptors
    assert plan.total_bytes == 4096 * LLAMA_70B.bytes_per_token() == 1_342_177_280


def test_prompt_plan_rounds_up_to_whole_blocks() -> None:
    plan = prompt_plan(LLAMA_70B, block_tokens=16, tp=1, tokens=17, packed=True)
    assert plan.descriptors == 2 * 80


def test_engine_descriptor_from_the_known_model_and_the_larger_tp() -> None:
    # Llama-3.1-8B: 8 KV heads; TP 2 on both roles, K+V packed; vLLM 0.11.0's largest block
    # (128 tokens) is the operator's choice: 2 KiB a token would want 256 for 512 KiB
    spec = make_pdd().spec
    assert engine_descriptor_bytes(spec) == 128 * 4 * 128 * 2 * 2
    spec = make_pdd({"decode": {"gpusPerInstance": 8}}).spec
    assert engine_descriptor_bytes(spec) == 128 * 1 * 128 * 2 * 2


V033 = {"image": "vllm/vllm-openai:v0.33.0"}
LLAMA_70B_NAME = "meta-llama/Llama-3.1-70B-Instruct"


SGLANG = "lmsysorg/sglang:v0.5"


@pytest.mark.parametrize(
    ("engine", "tp", "tokens", "descriptor"),
    [
        # vLLM aims at 1 MiB. 70B, TP 1: 4 KiB a token (K and V of 8 heads) -> 256 tokens
        (V033, 1, 256, 1 << 20),
        # TP 8: 512 B a token; 2,048 tokens would reach 1 MiB, the cap is 256
        (V033, 8, 256, 128 << 10),
        # vLLM 0.11.0 offers blocks up to 128 tokens
        ({"image": "vllm/vllm-openai:v0.11.0"}, 1, 128, 512 << 10),
        ({"image": "vllm/vllm-openai:v0.11.0"}, 8, 128, 64 << 10),
        # SGLang moves K and V apart (2 KiB a token at TP 1) from one-token pages: 512 KiB
        ({"type": "sglang", "image": SGLANG + ".23"}, 1, 256, 512 << 10),
        ({"type": "sglang", "image": SGLANG + ".23"}, 8, 256, 64 << 10),
        ({"type": "sglang", "image": SGLANG + ".4"}, 1, 256, 512 << 10),
    ],
)
def test_the_operator_chooses_blocks_whose_descriptors_reach_the_engines_target(
    engine: dict[str, str], tp: int, tokens: int, descriptor: int
) -> None:
    spec = make_pdd(
        {
            "model": {"name": LLAMA_70B_NAME},
            "engine": engine,
            "prefill": {"gpusPerInstance": tp},
            "decode": {"gpusPerInstance": tp},
        }
    ).spec
    assert chosen_block_tokens(spec, adapter_for(spec.engine.type)) == tokens
    assert block_tokens(spec) == tokens
    assert engine_descriptor_bytes(spec) == descriptor


@pytest.mark.parametrize(
    "patch",
    [
        {"engine": {"kvBlockSize": 32}},  # the user's block wins
        {"model": {"name": "my-org/finetune"}},  # shape unknown: the engine's default
        {"model": {"name": "deepseek-ai/DeepSeek-V3"}},  # MLA: its kernels fix the block
        {"engine": {"type": "custom", "image": "example.com/engine:1"}},  # not our flags
    ],
)
def test_the_operator_chooses_no_block_where_it_should_not(patch: dict[str, Any]) -> None:
    spec = make_pdd(patch).spec
    assert chosen_block_tokens(spec, adapter_for(spec.engine.type)) is None


def test_engine_descriptor_follows_block_size_and_given_shape() -> None:
    spec = make_pdd(
        {
            "model": {
                "name": "my-org/finetune",
                "kvCache": {"layers": 40, "kvHeads": 16, "headDim": 64, "dtype": "float8"},
            },
            "engine": {"kvBlockSize": 128},
        }
    ).spec
    assert engine_descriptor_bytes(spec) == 128 * 8 * 64 * 1 * 2


def test_engine_descriptor_unknown_model() -> None:
    assert engine_descriptor_bytes(make_pdd({"model": {"name": "my-org/finetune"}}).spec) is None


def test_sglang_pages_without_a_choice_are_one_token() -> None:
    spec = make_pdd({"engine": {"type": "sglang"}, "model": {"name": "my-org/finetune"}}).spec
    assert block_tokens(spec) == 1
    spec = make_pdd({"engine": {"type": "sglang", "kvBlockSize": 1}}).spec
    assert engine_descriptor_bytes(spec) == 1 * 4 * 128 * 2
