"""KVAwareRouting: whether the prefill engines publish the KV events the router routes by (pure).

Present only where spec.router.prefillPolicy is kv_aware. False is a Warning, not a stop: the
router still routes every request, choosing the prefill by load alone, and the message names
what to change. The adapter decides (its verdict also gates the rendered flags), so the
condition and the command line cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import Condition, PDDeploymentSpec
from pdd_operator.engines.registry import adapter_for
from pdd_operator.status.conditions import set_condition

CONDITION = condition_types.KV_AWARE_ROUTING


def condition(
    previous: Sequence[Condition], spec: PDDeploymentSpec, gen: int, now: str
) -> list[Condition]:
    verdict = adapter_for(spec.engine.type).kv_events_verdict(spec)
    if verdict is None:
        return []
    reason = reasons.KV_EVENTS_PUBLISHED if verdict.rendered else reasons.KV_EVENTS_NOT_PUBLISHED
    message = f"spec.router.prefillPolicy kv_aware: {verdict.message}"
    return [set_condition(previous, CONDITION, verdict.rendered, reason, message, gen, now)]
