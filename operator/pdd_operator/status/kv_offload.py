"""KVCacheOffloaded: whether the prefill engines got spec.kvCache.offload's CPU tier (pure).

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
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.kv_offload import OFFLOAD_ROLE, rendered_tier
from pdd_operator.status.conditions import set_condition

CONDITION = condition_types.KV_CACHE_OFFLOADED


def kv_offload_condition(
    previous: Sequence[Condition], spec: PDDeploymentSpec, gen: int, now: str
) -> list[Condition]:
    tier = rendered_tier(spec, adapter_for(spec.engine.type), OFFLOAD_ROLE)
    if tier is None:
        return []
    size, verdict = spec.kvCache.offload.cpu, tier.verdict
    reason = reasons.OFFLOAD_RENDERED if verdict.rendered else reasons.OFFLOAD_NOT_RENDERED
    message = f"spec.kvCache.offload.cpu {size}: {verdict.message}"
    return [set_condition(previous, CONDITION, verdict.rendered, reason, message, gen, now)]
