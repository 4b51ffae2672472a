"""Conditions by the Kubernetes API conventions, with lastTransitionTime kept while unchanged,
and the events that tell a user when one of them flipped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
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


class Event(NamedTuple):
    type: str  # Normal | Warning
    reason: str
    message: str


def transition_events(before: Sequence[Condition], after: Sequence[Condition]) -> list[Event]:
    """One event per condition whose status or reason changed, for the user to read in
    `kubectl describe`; posted only after the status write that made the change succeeded.
    Conditions that say the same thing (Ready, Stalled and ModelReady about a missing
    Secret) make one event, a Warning where one of them is."""
    events: dict[str, Event] = {}  # by message (by condition where it has none)
    for cond in after:
        old = find(before, cond.type)
        if old is not None and old.status == cond.status and old.reason == cond.reason:
            continue
        if old is None and _just_created(cond):
            continue
        event = event_for(cond)
        if event is None:
            continue
        key = event.message or f"{cond.type}/{event.reason}"
        said = events.get(key)
        if said is None or (said.type == "Normal" and event.type == "Warning"):
            events[key] = event
    return list(events.values())


def _just_created(cond: Condition) -> bool:
    """Replicas not ready in a deployment's first status: it was just created, and its
    `kubectl describe` would open with a NotReady event that says nothing new."""
    return (
        cond.type == condition_types.READY
        and cond.status != "True"
        and cond.reason == reasons.REPLICAS_NOT_READY
    )


def event_for(cond: Condition) -> Event | None:
    """The event a condition's new state is worth; None for those a user need not be told."""
    if cond.type == condition_types.READY:
        if cond.status == "True":
            return Event("Normal", reasons.READY, cond.message)
        if cond.reason == reasons.REPLICAS_NOT_READY and not cond.message:
            return None
        return Event("Normal", reasons.NOT_READY, cond.message)
    if cond.type in condition_types.WARN_WHEN_FALSE:
        return Event("Warning", cond.reason, cond.message) if cond.status == "False" else None
    if cond.type in (condition_types.DEGRADED, condition_types.STALLED):
        return Event("Warning", cond.reason, cond.message) if cond.status == "True" else None
    if (
        cond.type == condition_types.SCALED_TO_ZERO
    ):  # scaling up again is told by Ready's own events
        return Event("Normal", cond.reason, cond.message) if cond.status == "True" else None
    if cond.type == condition_types.SCALING_HELD:  # resuming is told by the scale step itself
        return Event("Warning", cond.reason, cond.message) if cond.status == "True" else None
    if cond.type in (
        condition_types.PLACED,
        condition_types.KV_TRANSFER_VERIFIED,
        condition_types.MODEL_READY,
    ):
        return Event("Normal" if cond.status == "True" else "Warning", cond.reason, cond.message)
    return None
