"""Whether the model can be split the way each role is laid out (pure).

An engine splits each layer's attention heads over its tensor-parallel ranks, the KV heads
too (or copies each KV head to a whole number of ranks where there are more ranks than KV
heads), and, with expert parallelism, the routed experts over the expert-parallel ranks. A
count the ranks do not divide makes the engine fail at start, after the pods got their GPUs
and loaded the weights. The rules, from the engines' sources:

- vLLM (read in its sources of the 0.11 line; 0.33.0 not read): ModelConfig's
  `verify_with_parallel_config` (vllm/config/model.py) raises "Total number of attention
  heads (64) must be divisible by tensor parallel size (3)"; `QKVParallelLinear`
  (model_executor/layers/linear.py) takes `divide(tp_size, kv_heads)` where tp_size >=
  kv_heads, else `divide(kv_heads, tp_size)`, and `divide` asserts. Its data parallelism runs
  whole replicas, each with its own TP group. Its expert parallelism gives the first
  `experts % ep` ranks one expert more (fused_moe `determine_expert_map`), so the experts need
  not divide (only its EPLB, which the operator does not turn on, asks for that).
- SGLang 0.5.23: the attention layers assert `num_heads % attn_tp_size == 0` and the same KV
  rule (models/qwen3.py, qwen3_moe.py, deepseek_v2.py); with DP attention the attention TP
  group is tensor / data (runtime_context.py `derive_attn_tp_size`). Llama, Qwen2 and Mixtral
  assert against the whole TP size, a stricter rule only where DP attention is on, which this
  check does not apply. The routed experts must split evenly over the EP ranks
  (layers/moe/fused_moe_triton/layer.py: `assert self._num_global_routed % storage_ep_size
  == 0`).
- Multi-head latent attention (DeepSeek-V3) keeps one latent per token, no KV heads to split:
  only the attention heads count.

The counts come from the model's shape (planning.kv_layout): spec.model.kvCache, where the
CRD's rules (api/v1alpha1.py `_shape_rules`, engines/sglang.py `_experts_rule`) refuse a
layout that does not fit at admission, or the operator's table of known models, where
status/parallelism.py makes the verdict a condition.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import Layout, role_spec
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.kv_layout import KvCacheShape, model_shape

ATTENTION_HEADS, KV_HEADS, EXPERTS = "attention heads", "KV heads", "routed experts"
ENGINE_ROLES = ("prefill", "decode")
# Engines whose expert parallelism needs the routed experts to divide evenly (see above).
EVEN_EXPERTS = frozenset({"sglang"})
# Engines whose parallelism the operator lays out (a custom engine's is its own).
CHECKED_ENGINES = frozenset({"vllm", "sglang"})
# The largest attention TP size a fix suggests without asking for more: one node's GPUs.
NODE_GPUS = 8


@dataclass(frozen=True)
class Split:
    """``count`` of the model's ``parts`` over ``ranks`` ranks; with ``copies`` fewer parts
    than ranks are copied, each to ranks / count of them (the KV heads)."""

    parts: str
    count: int
    ranks: int
    copies: bool = False

    @property
    def even(self) -> bool:
        if self.copies and self.ranks >= self.count:
            return self.ranks % self.count == 0
        return self.count % self.ranks == 0


@dataclass(frozen=True)
class RoleFit:
    """One role's splits that are not even, and the counts the shape lacks to check all."""

    role: str
    layout: Layout
    uneven: tuple[Split, ...]
    unchecked: tuple[str, ...]


def attention_ranks(engine: str, layout: Layout) -> int:
    """The ranks one layer's attention heads are split over: SGLang's DP attention makes
    ``data`` groups of tensor / data ranks; vLLM's data-parallel ranks are whole replicas."""
    if engine == "sglang":
        return max(1, layout.tensor // max(1, layout.data))
    return layout.tensor


def head_splits(shape: KvCacheShape, ranks: int) -> tuple[Split, ...]:
    """The heads over ``ranks`` attention ranks, as far as the shape knows them."""
    splits = []
    if shape.attention_heads:
        splits.append(Split(ATTENTION_HEADS, shape.attention_heads, ranks))
    if not shape.latent:
        splits.append(Split(KV_HEADS, shape.kv_heads, ranks, copies=True))
    return tuple(splits)


def role_splits(shape: KvCacheShape, engine: str, layout: Layout) -> tuple[Split, ...]:
    """What the engine splits over one role's ranks, of what the shape knows."""
    splits = head_splits(shape, attention_ranks(engine, layout))
    if engine in EVEN_EXPERTS and layout.expert > 1 and shape.experts:
        splits += (Split(EXPERTS, shape.experts, layout.expert),)
    return splits


def unknown_counts(shape: KvCacheShape, engine: str, layout: Layout) -> tuple[str, ...]:
    """The counts a split needs that the shape does not give (spec.model.kvCache may leave
    them out)."""
    missing = [ATTENTION_HEADS] if shape.attention_heads is None else []
    if engine in EVEN_EXPERTS and layout.expert > 1 and shape.experts is None:
        missing.append(EXPERTS)
    return tuple(missing)


def role_fit(shape: KvCacheShape, engine: str, role: str, layout: Layout) -> RoleFit:
    uneven = tuple(s for s in role_splits(shape, engine, layout) if not s.even)
    return RoleFit(role, layout, uneven, unknown_counts(shape, engine, layout))


def parallelism_fit(spec: PDDeploymentSpec) -> tuple[RoleFit, ...] | None:
    """Each engine role's fit, from the layout its adapter renders; None where there is
    nothing to check against (the model's shape is unknown); none for an engine whose
    parallelism is not the operator's (custom)."""
    shape = model_shape(spec.model)
    engine = spec.engine.type
    if engine not in CHECKED_ENGINES:
        return ()
    if shape is None:
        return None
    adapter = adapter_for(engine)
    return tuple(role_fit(shape, engine, role, adapter.layout(spec, role)) for role in ENGINE_ROLES)


def fitting_attention_ranks(shape: KvCacheShape, most: int) -> tuple[int, ...]:
    """The attention TP sizes up to ``most`` that split the shape's heads evenly: the fix a
    message offers."""
    return tuple(n for n in range(1, most + 1) if all(s.even for s in head_splits(shape, n)))


def tensor_setting(spec: PDDeploymentSpec, role: str, layout: Layout) -> str:
    """The field(s) that set the role's attention TP size, as a message names them."""
    rspec = role_spec(spec, role)
    engine = spec.engine.type
    if rspec.parallelism is not None:
        data = engine == "sglang" and layout.data > 1
        return f"spec.{role}.parallelism.tensor" + (" / data" if data else "")
    if engine == "sglang" and rspec.nodesPerInstance > 1:
        return f"spec.{role}.gpusPerInstance x nodesPerInstance"
    return f"spec.{role}.gpusPerInstance"
