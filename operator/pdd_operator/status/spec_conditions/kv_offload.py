"""KVCacheOffloaded: whether the prefill engines got spec.kvCache.offload's tiers (pure).

Present only where the spec asks for a tier. False is a Warning, not a stop: the engines serve
without it (as before the field was set), and the message names what to set. The adapter
decides (planning.kv_offload sizes the tier, each adapter spells it), so the condition and the
rendered command line cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import Condition, PDDeploymentSpec
from pdd_operator.engines.base import TierVerdict
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.kv_offload import OFFLOAD_ROLE, rendered_disk_tier, rendered_tier
from pdd_operator.status.conditions import set_condition

CONDITION = condition_types.KV_CACHE_OFFLOADED


def condition(
    previous: Sequence[Condition], spec: PDDeploymentSpec, gen: int, now: str
) -> list[Condition]:
    """True where every tier the spec asks for is rendered; the message has a part per tier."""
    adapter = adapter_for(spec.engine.type)
    offload = spec.kvCache.offload
    verdicts: list[tuple[str, TierVerdict]] = []
    if (cpu := rendered_tier(spec, adapter, OFFLOAD_ROLE)) is not None:
        verdicts.append((f"spec.kvCache.offload.cpu {offload.cpu}", cpu.verdict))
    if (disk := rendered_disk_tier(spec, adapter, OFFLOAD_ROLE)) is not None:
        size = offload.disk.size if offload.disk is not None else ""
        verdicts.append((f"spec.kvCache.offload.disk {size}", disk.verdict))
    if not verdicts:
        return []
    rendered = all(verdict.rendered for _, verdict in verdicts)
    reason = reasons.OFFLOAD_RENDERED if rendered else reasons.OFFLOAD_NOT_RENDERED
    message = "; ".join(f"{field}: {verdict.message}" for field, verdict in verdicts)
    return [set_condition(previous, CONDITION, rendered, reason, message, gen, now)]
