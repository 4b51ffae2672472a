"""The engines' KV-cache layout (pure): how many bytes one NIXL descriptor moves.

An engine does not move a prompt's KV cache as one region: it registers its paged KV cache
with NIXL and transfers one descriptor per layer and block (vLLM 0.33 packs K and V of a block
into one descriptor, SGLang 0.5 moves them as two: each engine's adapter says which, and its
default block size, in its ``kv_layout``). NIXL merges the descriptors of blocks that
happen to be adjacent in memory, so one block is the smallest descriptor a request can get:
the size on a fragmented cache. What the link reaches at that size can be far below its
large-block figure (docs/benchmarks.md has the curve), so the operator works the size out from
the model's shape, the engine's block size and the tensor-parallel degree, has the transfer
check measure at that size, and reports it beside the link's figure.

The model's shape comes from ``spec.model.kvCache`` or, for a few well-known model families,
from the table below (values from each model's published config.json). The attention-head and
expert counts are not the KV cache's, but they are what the engines split over their
tensor- and expert-parallel ranks: planning.parallelism_fit checks the layout against them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pdd_operator.api.v1alpha1 import ModelSpec, PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter
from pdd_operator.engines.registry import adapter_for

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float8": 1}


@dataclass(frozen=True)
class KvCacheShape:
    """Per layer: ``kv_heads`` heads of ``head_dim`` values for K and again for V; with
    ``latent`` (multi-head latent attention, DeepSeek-V3) one vector of ``head_dim`` values
    per token, the same on every tensor-parallel rank. ``attention_heads`` (query heads,
    num_attention_heads) and ``experts`` (routed experts of a mixture of experts; 0: a dense
    model) are None where not known."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    latent: bool = False
    attention_heads: int | None = None
    experts: int | None = None

    def bytes_per_token(self) -> int:
        """KV bytes one token adds over all layers and all ranks."""
        per_layer = self.head_dim * self.dtype_bytes * (1 if self.latent else 2 * self.kv_heads)
        return self.layers * per_layer


@dataclass(frozen=True)
class DescriptorPlan:
    """What one engine rank moves for a prompt: descriptor size and count."""

    descriptor_bytes: int
    descriptors: int

    @property
    def total_bytes(self) -> int:
        return self.descriptor_bytes * self.descriptors


def _gqa(layers: int, kv_heads: int, heads: int, experts: int = 0) -> KvCacheShape:
    """A table entry with grouped-query attention and 128 values per head (all but MLA)."""
    return KvCacheShape(
        layers=layers, kv_heads=kv_heads, head_dim=128, attention_heads=heads, experts=experts
    )


# Matched against the lower-cased model name (a Hugging Face id or a path ending in one).
# From each model's config.json on the Hugging Face Hub: num_hidden_layers, num_key_value_heads,
# head_dim (else hidden_size / num_attention_heads), num_attention_heads, and the routed experts
# (Mixtral num_local_experts, Qwen3-MoE num_experts, DeepSeek n_routed_experts; 0: dense).
KNOWN_MODELS: tuple[tuple[re.Pattern[str], KvCacheShape], ...] = tuple(
    (re.compile(pattern), shape)
    for pattern, shape in (
        # meta-llama/Llama-3.1-8B (Meta-Llama-3-8B alike): hidden 4096, 32 heads, 8 KV heads.
        (r"llama-3(\.[0-9])?-8b", _gqa(layers=32, kv_heads=8, heads=32)),
        # meta-llama/Llama-3.1-70B (3-70B, 3.3-70B alike): hidden 8192, 64 heads, 8 KV heads.
        (r"llama-3(\.[0-9])?-70b", _gqa(layers=80, kv_heads=8, heads=64)),
        # meta-llama/Llama-3.1-405B: hidden 16384, 128 heads, 8 KV heads.
        (r"llama-3(\.[0-9])?-405b", _gqa(layers=126, kv_heads=8, heads=128)),
        # Qwen/Qwen2.5-7B: hidden 3584, 28 heads (TP 8 does not divide them), 4 KV heads.
        (r"qwen2\.5-7b", _gqa(layers=28, kv_heads=4, heads=28)),
        # Qwen/Qwen2.5-72B: hidden 8192, 64 heads, 8 KV heads.
        (r"qwen2\.5-72b", _gqa(layers=80, kv_heads=8, heads=64)),
        # Qwen/Qwen3-32B: 64 heads, 8 KV heads, head_dim 128.
        (r"qwen3-32b", _gqa(layers=64, kv_heads=8, heads=64)),
        # Qwen/Qwen3-235B-A22B: 64 heads, 4 KV heads, head_dim 128, 128 experts (8 active).
        (r"qwen3-235b-a22b", _gqa(layers=94, kv_heads=4, heads=64, experts=128)),
        # mistralai/Mistral-7B-v0.1 (and the Instruct releases): hidden 4096, 32 heads.
        (r"mistral-7b", _gqa(layers=32, kv_heads=8, heads=32)),
        # mistralai/Mixtral-8x7B-v0.1: 32 heads, 8 KV heads, 8 local experts (2 active).
        (r"mixtral-8x7b", _gqa(layers=32, kv_heads=8, heads=32, experts=8)),
        # deepseek-ai/DeepSeek-V3 and -R1: MLA, kv_lora_rank 512 + qk_rope_head_dim 64 per
        # token and layer; 128 attention heads; 256 routed experts (n_routed_experts, plus one
        # shared expert that is not split).
        (
            r"deepseek-(v3|r1)",
            KvCacheShape(
                layers=61, kv_heads=1, head_dim=576, latent=True, attention_heads=128, experts=256
            ),
        ),
    )
)


def known_shape(model_name: str) -> KvCacheShape | None:
    name = model_name.lower()
    return next((shape for pattern, shape in KNOWN_MODELS if pattern.search(name)), None)


def kv_heads_per_rank(shape: KvCacheShape, tp: int) -> int:
    """Tensor parallelism splits the KV heads; with fewer heads than ranks each rank keeps a
    copy of one head (the engines replicate rather than split a head)."""
    if shape.latent:
        return 1
    return max(1, shape.kv_heads // max(1, tp))


def descriptor_bytes(shape: KvCacheShape, block_tokens: int, tp: int, packed: bool) -> int:
    """One descriptor: one block of tokens of one layer on one rank, K and V together when
    ``packed``, else K or V alone (an MLA latent has no separate V)."""
    per_token = kv_heads_per_rank(shape, tp) * shape.head_dim * shape.dtype_bytes
    together = 2 if packed and not shape.latent else 1
    return block_tokens * per_token * together


def prompt_plan(
    shape: KvCacheShape, block_tokens: int, tp: int, tokens: int, packed: bool
) -> DescriptorPlan:
    """The descriptors one rank moves for a prompt of ``tokens`` tokens, none merged."""
    blocks = -(-tokens // block_tokens)
    per_block = shape.layers * (1 if packed or shape.latent else 2)
    return DescriptorPlan(descriptor_bytes(shape, block_tokens, tp, packed), blocks * per_block)


def model_shape(model: ModelSpec) -> KvCacheShape | None:
    """The shape the PDDeployment gives, else the known family its name belongs to."""
    given = model.kvCache
    if given is None:
        return known_shape(model.name)
    return KvCacheShape(
        layers=given.layers,
        kv_heads=given.kvHeads,
        head_dim=given.headDim,
        dtype_bytes=DTYPE_BYTES[given.dtype],
        latent=given.latent,
        attention_heads=given.attentionHeads,
        experts=given.experts,
    )


def shape_source(model: ModelSpec) -> str:
    """Where ``model_shape`` found the shape, in the words a status message uses."""
    if model.kvCache is not None:
        return "spec.model.kvCache"
    return "the operator's table of known models" if known_shape(model.name) else ""


# The prompt status.transfer prices: a long prompt of today's chat and RAG traffic.
PRICED_PROMPT_TOKENS = 4096


def block_tokens(spec: PDDeploymentSpec, adapter: EngineAdapter | None = None) -> int:
    """The KV block (page) size the deployment's engines run with (``adapter``: the
    engine's, unless given)."""
    adapter = adapter or adapter_for(spec.engine.type)
    chosen = spec.engine.kvBlockSize or chosen_block_tokens(spec, adapter)
    return chosen or adapter.kv_layout.default_block_tokens


def chosen_block_tokens(spec: PDDeploymentSpec, adapter: EngineAdapter) -> int | None:
    """The block size the operator renders when spec.engine.kvBlockSize is unset: the
    smallest power-of-two multiple of the engine's default whose descriptor reaches the
    adapter's ``transfer_descriptor_bytes`` (where the engine's own NIXL pattern moves 100 GB/s
    or more over a same-node lane, docs/benchmarks.md; the engine's default 16-token block of
    a 70B model at TP 1 is 64 KiB, 15-17 GB/s), at most the release's ceiling (engines.base
    MAX_CHOSEN_BLOCK_TOKENS or lower). None (the engine's own default) for an engine whose
    blocks the operator does not set, where the model's shape is unknown, or for multi-head
    latent attention, whose kernels fix the block (vLLM's FlashMLA takes 64 tokens only)."""
    shape = model_shape(spec.model)
    layout, ceiling = adapter.kv_layout, adapter.max_block_tokens(spec)
    target = adapter.transfer_descriptor_bytes(spec)
    if spec.engine.kvBlockSize or shape is None or shape.latent or not ceiling:
        return None
    tp = max(spec.prefill.gpusPerInstance, spec.decode.gpusPerInstance)
    tokens = layout.default_block_tokens
    while descriptor_bytes(shape, tokens, tp, layout.packed) < target and tokens * 2 <= ceiling:
        tokens *= 2
    return tokens if tokens != layout.default_block_tokens else None


def prompt_kv_bytes(spec: PDDeploymentSpec, tokens: int = PRICED_PROMPT_TOKENS) -> int | None:
    """What one engine rank moves for a prompt of ``tokens`` tokens (None: shape unknown)."""
    shape = model_shape(spec.model)
    if shape is None:
        return None
    adapter = adapter_for(spec.engine.type)
    tp = max(spec.prefill.gpusPerInstance, spec.decode.gpusPerInstance)
    plan = prompt_plan(shape, block_tokens(spec, adapter), tp, tokens, adapter.kv_layout.packed)
    return plan.total_bytes


def engine_descriptor_bytes(
    spec: PDDeploymentSpec, adapter: EngineAdapter | None = None
) -> int | None:
    """The descriptor size the deployment's engines move KV in, or None when the model's
    shape is unknown. ``adapter`` is the engine's (spec.engine.type's, unless given). With different
    TP degrees per role the larger one sets the (smaller) descriptor: that is the side that
    limits the transfer."""
    shape = model_shape(spec.model)
    if shape is None:
        return None
    adapter = adapter or adapter_for(spec.engine.type)
    tp = max(spec.prefill.gpusPerInstance, spec.decode.gpusPerInstance)
    return descriptor_bytes(shape, block_tokens(spec, adapter), tp, adapter.kv_layout.packed)
