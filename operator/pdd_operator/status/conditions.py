"""Conditions by the Kubernetes API conventions, with lastTransitionTime kept while unchanged."""

from __future__ import annotations

from collections.abc import Sequence

from pdd_operator.api.v1alpha1 import Condition


def set_condition(
    previous: Sequence[Condition],
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> Condition:
    """The new condition; its transition time moves only when its status flips."""
    value = "Unknown" if status is None else ("True" if status else "False")
    old = next((c for c in previous if c.type == type_), None)
    changed = old is None or old.status != value
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        observedGeneration=generation,
        lastTransitionTime=now if changed or not old else old.lastTransitionTime,
    )


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
