"""Whether each role's layout divides what the engine splits of the model: the rules, worked
out by hand from the engines' checks and the models' config.json."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.base import Layout
from pdd_operator.planning.kv_layout import KvCacheShape, known_shape
from pdd_operator.planning.parallelism_fit import (
    ATTENTION_HEADS,
    EXPERTS,
    KV_HEADS,
    Split,
    attention_ranks,
    fitting_attention_ranks,
    parallelism_fit,
    role_fit,
    tensor_setting,
)

LLAMA_70B = KvCacheShape(layers=80, kv_heads=8, head_dim=128, attention_heads=64, experts=0)
QWEN3_MOE = KvCacheShape(layers=94, kv_heads=4, head_dim=128, attention_heads=64, experts=128)
DEEPSEEK_V3 = KvCacheShape(
    layers=61, kv_heads=1, head_dim=576, latent=True, attention_heads=128, experts=256
)
SGLANG = {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"}


@pytest.mark.parametrize(
    ("split", "even"),
    [
        (Split(ATTENTION_HEADS, 64, 8), True),
        (Split(ATTENTION_HEADS, 64, 3), False),  # vLLM: "(64) must be divisible by ... (3)"
        (Split(ATTENTION_HEADS, 28, 8), False),  # Qwen2.5-7B at TP 8
        (Split(ATTENTION_HEADS, 28, 4), True),
        (Split(KV_HEADS, 8, 4, copies=True), True),  # two KV heads per rank
        (Split(KV_HEADS, 8, 16, copies=True), True),  # each KV head on two ranks
        (Split(KV_HEADS, 8, 12, copies=True), False),  # 12 ranks cannot share 8 heads evenly
        (Split(KV_HEADS, 8, 6, copies=True), False),
        (Split(KV_HEADS, 4, 8, copies=True), True),
        (Split(EXPERTS, 128, 8), True),
        (Split(EXPERTS, 8, 16), False),  # experts are never copied
        (Split(EXPERTS, 256, 24), False),
    ],
)
def test_a_split_is_even_where_the_ranks_divide_the_parts(split: Split, even: bool) -> None:
    assert split.even is even


@pytest.mark.parametrize(
    ("name", "heads", "kv_heads", "experts"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 0),
        ("meta-llama/Llama-3.1-70B-Instruct", 64, 8, 0),
        ("meta-llama/Llama-3.3-70B-Instruct", 64, 8, 0),
        ("meta-llama/Llama-3.1-405B-Instruct", 128, 8, 0),
        ("Qwen/Qwen2.5-7B-Instruct", 28, 4, 0),
        ("Qwen/Qwen2.5-72B-Instruct", 64, 8, 0),
        ("Qwen/Qwen3-32B", 64, 8, 0),
        ("Qwen/Qwen3-235B-A22B", 64, 4, 128),
        ("mistralai/Mistral-7B-Instruct-v0.3", 32, 8, 0),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 32, 8, 8),
        ("deepseek-ai/DeepSeek-R1", 128, 1, 256),
    ],
)
def test_known_models_carry_their_heads_and_experts(
    name: str, heads: int, kv_heads: int, experts: int
) -> None:
    shape = known_shape(name)
    assert shape is not None
    assert (shape.attention_heads, shape.kv_heads, shape.experts) == (heads, kv_heads, experts)


@pytest.mark.parametrize(
    ("engine", "layout", "ranks"),
    [
        ("vllm", Layout(8), 8),
        ("vllm", Layout(4, data=2), 4),  # vLLM's DP ranks are whole replicas
        ("sglang", Layout(16), 16),
        ("sglang", Layout(16, data=4), 4),  # DP attention: groups of tensor / data ranks
        ("sglang", Layout(16, data=16), 1),
    ],
)
def test_attention_ranks(engine: str, layout: Layout, ranks: int) -> None:
    assert attention_ranks(engine, layout) == ranks


@pytest.mark.parametrize(
    ("shape", "engine", "layout", "uneven"),
    [
        (LLAMA_70B, "vllm", Layout(8), []),
        (LLAMA_70B, "vllm", Layout(3), [ATTENTION_HEADS, KV_HEADS]),
        (LLAMA_70B, "vllm", Layout(16), []),  # each KV head on two ranks
        (LLAMA_70B, "vllm", Layout(12), [ATTENTION_HEADS, KV_HEADS]),
        (LLAMA_70B, "vllm", Layout(2, pipeline=3), []),  # PP splits layers, not heads
        (LLAMA_70B, "sglang", Layout(24, data=3), []),  # attention groups of 8
        (LLAMA_70B, "sglang", Layout(24, data=8), [ATTENTION_HEADS, KV_HEADS]),  # groups of 3
        (QWEN3_MOE, "sglang", Layout(16, expert=16), []),
        (QWEN3_MOE, "sglang", Layout(24, data=3, expert=24), [EXPERTS]),
        (QWEN3_MOE, "vllm", Layout(8, data=3, expert=24), []),  # vLLM spreads them unevenly
        (DEEPSEEK_V3, "vllm", Layout(8), []),  # one latent: only the attention heads count
        (DEEPSEEK_V3, "vllm", Layout(6), [ATTENTION_HEADS]),
        (DEEPSEEK_V3, "sglang", Layout(16, data=16, expert=16), []),
        (DEEPSEEK_V3, "sglang", Layout(24, expert=24), [ATTENTION_HEADS, EXPERTS]),
    ],
)
def test_the_uneven_splits_of_a_role(
    shape: KvCacheShape, engine: str, layout: Layout, uneven: list[str]
) -> None:
    fit = role_fit(shape, engine, "prefill", layout)
    assert [split.parts for split in fit.uneven] == uneven
    assert fit.unchecked == ()


@pytest.mark.parametrize(
    ("shape", "engine", "layout", "unchecked"),
    [
        (KvCacheShape(layers=1, kv_heads=8, head_dim=128), "vllm", Layout(8), [ATTENTION_HEADS]),
        (
            KvCacheShape(layers=1, kv_heads=8, head_dim=128, attention_heads=64),
            "sglang",
            Layout(8, expert=8),
            [EXPERTS],
        ),
        (
            KvCacheShape(layers=1, kv_heads=8, head_dim=128, attention_heads=64),
            "vllm",
            Layout(8, expert=8),
            [],  # vLLM has no rule for the experts to lack
        ),
    ],
)
def test_counts_a_given_shape_leaves_out_are_not_checked(
    shape: KvCacheShape, engine: str, layout: Layout, unchecked: list[str]
) -> None:
    assert list(role_fit(shape, engine, "decode", layout).unchecked) == unchecked


@pytest.mark.parametrize(
    ("patch", "uneven"),
    [
        # 3 ranks divide neither the 64 attention heads nor the 8 KV heads
        ({"prefill": {"gpusPerInstance": 3}, "decode": {"gpusPerInstance": 3}}, [2, 2]),
        ({"prefill": {"gpusPerInstance": 8}, "decode": {"gpusPerInstance": 8}}, [0, 0]),
        # vLLM over two nodes: TP 8 per node, one data-parallel rank each
        ({"prefill": {"gpusPerInstance": 8, "nodesPerInstance": 2}}, [0, 0]),
        # SGLang's TP spans the nodes: 3 x 8 = 24 ranks, 64 heads do not split over them (each
        # of the 8 KV heads goes to 3 ranks)
        ({"engine": SGLANG, "prefill": {"gpusPerInstance": 8, "nodesPerInstance": 3}}, [1, 0]),
    ],
)
def test_the_fit_follows_the_layout_the_adapter_renders(
    patch: dict[str, Any], uneven: list[int]
) -> None:
    spec = make_pdd({"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, **patch}).spec
    fits = parallelism_fit(spec)
    assert fits is not None
    assert [fit.role for fit in fits] == ["prefill", "decode"]
    assert [len(fit.uneven) for fit in fits] == uneven


def test_an_unknown_model_has_no_fit_and_a_custom_engine_none_to_check() -> None:
    assert parallelism_fit(make_pdd({"model": {"name": "my-org/finetune-v2"}}).spec) is None
    custom = {"type": "custom", "image": "example.com/engine:1"}
    assert parallelism_fit(make_pdd({"engine": custom}).spec) == ()


def test_a_shape_from_the_spec_wins_over_the_table() -> None:
    kv_cache = {"layers": 80, "kvHeads": 8, "headDim": 128, "attentionHeads": 48}
    model = {"name": "meta-llama/Llama-3.1-70B-Instruct", "kvCache": kv_cache}
    fits = parallelism_fit(make_pdd({"model": model, "prefill": {"gpusPerInstance": 3}}).spec)
    assert fits is not None
    assert [s.parts for s in fits[0].uneven] == [KV_HEADS]  # 48 heads split over 3 ranks


@pytest.mark.parametrize(
    ("shape", "most", "sizes"),
    [
        (LLAMA_70B, 8, (1, 2, 4, 8)),
        (LLAMA_70B, 16, (1, 2, 4, 8, 16)),
        (known_shape("Qwen/Qwen2.5-7B"), 8, (1, 2, 4)),
        (DEEPSEEK_V3, 8, (1, 2, 4, 8)),
    ],
)
def test_the_sizes_a_fix_offers(shape: KvCacheShape, most: int, sizes: tuple[int, ...]) -> None:
    assert fitting_attention_ranks(shape, most) == sizes


@pytest.mark.parametrize(
    ("patch", "setting"),
    [
        ({}, "spec.prefill.gpusPerInstance"),
        (
            {"prefill": {"gpusPerInstance": 4, "parallelism": {"tensor": 2, "data": 2}}},
            "spec.prefill.parallelism.tensor",
        ),
        (
            {"engine": SGLANG, "prefill": {"gpusPerInstance": 8, "nodesPerInstance": 2}},
            "spec.prefill.gpusPerInstance x nodesPerInstance",
        ),
        (
            {
                "engine": SGLANG,
                "prefill": {"gpusPerInstance": 8, "parallelism": {"tensor": 8, "data": 2}},
            },
            "spec.prefill.parallelism.tensor / data",
        ),
    ],
)
def test_the_field_a_message_names(patch: dict[str, Any], setting: str) -> None:
    spec = make_pdd(patch).spec
    fits = parallelism_fit(spec)
    assert fits is not None
    assert tensor_setting(spec, "prefill", fits[0].layout) == setting
