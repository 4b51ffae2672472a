"""The prefill pods' CPU and disk tiers of the KV cache (pure): spec.kvCache.offload divided
the way each engine sizes it.

The user gives one figure, host memory per prefill pod, because that is what a node's memory
is planned in. The engines size the tier per process: vLLM 0.33 per engine (all the TP and
PP workers of one data-parallel rank, in bytes), vLLM 0.11 per engine in KV blocks, SGLang per
GPU rank in decimal gigabytes. This module works out the pod's shares; each adapter spells
them (``EngineAdapter.cpu_tier_verdict``, ``disk_tier_verdict`` and their launches).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import CpuTier, DiskTier, EngineAdapter, TierVerdict
from pdd_operator.planning.kv_layout import (
    KvCacheShape,
    block_tokens,
    descriptor_bytes,
    kv_heads_per_rank,
    model_shape,
)
from pdd_operator.planning.node_facts import quantity_count

OFFLOAD_ROLE = "prefill"


def cpu_tier(spec: PDDeploymentSpec, adapter: EngineAdapter) -> CpuTier | None:
    """The prefill pods' tier, or None where spec.kvCache.offload.cpu is unset."""
    size = spec.kvCache.offload.cpu
    if size is None:
        return None
    layout = adapter.layout(spec, OFFLOAD_ROLE)
    return CpuTier(
        pod_bytes=quantity_count(size),
        ranks=spec.prefill.gpusPerInstance,
        block_tokens=block_tokens(spec, adapter),
        engine_bytes_per_token=_engine_kv_bytes_per_token(spec, layout.tensor),
    )


def _engine_kv_bytes_per_token(spec: PDDeploymentSpec, tp: int) -> int | None:
    """KV bytes one token takes over all the ranks of one engine (its TP group, all layers
    over its pipeline stages); None where the model's shape is unknown. Tensor parallelism
    splits the KV heads, or copies one to each rank where there are more ranks than heads;
    a latent (MLA) is copied to every rank."""
    shape = model_shape(spec.model)
    if shape is None:
        return None
    per_layer = kv_heads_per_rank(shape, tp) * shape.head_dim * shape.dtype_bytes
    return shape.layers * per_layer * (1 if shape.latent else 2) * tp


class RenderedTier(NamedTuple):
    tier: CpuTier
    verdict: TierVerdict


def rendered_tier(spec: PDDeploymentSpec, adapter: EngineAdapter, role: str) -> RenderedTier | None:
    """The role's tier and the adapter's verdict on it, where the role has one (prefill, with
    spec.kvCache.offload.cpu set), else None."""
    tier = cpu_tier(spec, adapter) if role == OFFLOAD_ROLE else None
    if tier is None:
        return None
    return RenderedTier(tier, adapter.cpu_tier_verdict(spec, tier))


class RenderedDiskTier(NamedTuple):
    tier: DiskTier
    verdict: TierVerdict


def rendered_disk_tier(
    spec: PDDeploymentSpec, adapter: EngineAdapter, role: str
) -> RenderedDiskTier | None:
    """The role's disk tier and the adapter's verdict on it, where the role has one
    (prefill, with spec.kvCache.offload.disk set), else None."""
    disk = spec.kvCache.offload.disk
    if disk is None or role != OFFLOAD_ROLE:
        return None
    cpu = rendered_tier(spec, adapter, role)
    shape = model_shape(spec.model)
    tier = DiskTier(
        pod_bytes=quantity_count(disk.size),
        ranks=spec.prefill.gpusPerInstance,
        storage_class=disk.storageClassName,
        with_cpu_tier=cpu is not None and cpu.verdict.rendered,
        latent=shape is not None and shape.latent,
        page_aligned=shape is not None and _page_aligned(spec, adapter, shape),
    )
    return RenderedDiskTier(tier, adapter.disk_tier_verdict(spec, tier))


PAGE_BYTES = 4096
KV_CACHE_DTYPE_FLAG = "--kv-cache-dtype"


def _page_aligned(spec: PDDeploymentSpec, adapter: EngineAdapter, shape: KvCacheShape) -> bool:
    """Whether every block region a prefill rank keeps (one layer's K or V, or both, of one
    block) is whole 4 KiB pages. A KV cache dtype in the args may be an 8-bit one, which
    halves the regions: they are counted at one byte."""
    args = (*spec.engine.args, *spec.prefill.args)
    if any(a == KV_CACHE_DTYPE_FLAG or a.startswith(f"{KV_CACHE_DTYPE_FLAG}=") for a in args):
        shape = replace(shape, dtype_bytes=1)
    tp = adapter.layout(spec, OFFLOAD_ROLE).tensor
    smallest = descriptor_bytes(shape, block_tokens(spec, adapter), tp, packed=False)
    return smallest % PAGE_BYTES == 0


def raised_quantity(quantity: str | None, extra_bytes: int) -> str:
    """``quantity`` (a request or limit of memory or storage; None: none set) plus
    ``extra_bytes``, spelled in the largest binary unit that keeps it whole."""
    total = (quantity_count(quantity) if quantity else 0) + extra_bytes
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if total % unit == 0:
            return f"{total // unit}{suffix}"
    return str(total)
