"""The events a status write posts: one per condition that flipped, worded for the user."""

from __future__ import annotations

import pytest

from pdd_operator.api.v1alpha1 import Condition
from pdd_operator.status.conditions import Event, event_for, transition_events

T0 = "2026-01-01T00:00:00Z"


def c(type_: str, status: str, reason: str, message: str = "") -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observedGeneration=1,
        lastTransitionTime=T0,
    )


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (c("Ready", "True", "AllReplicasReady", "all 6 ready"), ("Normal", "Ready", "all 6 ready")),
        (c("Ready", "False", "ApplyFailed", "denied"), ("Normal", "NotReady", "denied")),
        (c("Ready", "False", "ReplicasNotReady", "0/2"), ("Normal", "NotReady", "0/2")),
        # a deployment just created: nothing worth an event yet
        (c("Ready", "False", "ReplicasNotReady"), None),
        (
            c("Degraded", "True", "CrashLoopBackOff", "pod x"),
            ("Warning", "CrashLoopBackOff", "pod x"),
        ),
        (c("Degraded", "False", "AsExpected"), None),
        (c("Stalled", "True", "PreflightFailed", "fix"), ("Warning", "PreflightFailed", "fix")),
        (c("Stalled", "False", "NotStalled"), None),
        (c("Placed", "True", "Placed", "in c1"), ("Normal", "Placed", "in c1")),
        (c("Placed", "False", "NoEligibleNodes", "none"), ("Warning", "NoEligibleNodes", "none")),
        (c("KVTransferVerified", "True", "Verified", "ok"), ("Normal", "Verified", "ok")),
        (c("KVTransferVerified", "False", "Slow", "2 GB/s"), ("Warning", "Slow", "2 GB/s")),
        (c("Progressing", "True", "RollingOut", "r2"), None),
        (c("Reconciling", "True", "Scaling", "x"), None),
    ],
)
def test_the_event_a_condition_is_worth(
    cond: Condition, expected: tuple[str, str, str] | None
) -> None:
    assert event_for(cond) == (Event(*expected) if expected else None)


READY = c("Ready", "True", "AllReplicasReady", "ready")
NOT_READY = c("Ready", "False", "RolloutInProgress", "rolling")
DEGRADED = c("Degraded", "True", "CrashLoopBackOff", "pod x")
DEGRADED_OTHER = c("Degraded", "True", "ImagePullBackOff", "pod y")
HEALTHY = c("Degraded", "False", "AsExpected")


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        pytest.param([], [READY, HEALTHY], [("Normal", "Ready", "ready")], id="first-status"),
        pytest.param(
            [], [c("Ready", "False", "ReplicasNotReady", "prefill 0/2 ready")], [], id="created"
        ),
        pytest.param(
            [c("Ready", "True", "AllReplicasReady", "ready")],
            [c("Ready", "False", "ReplicasNotReady", "prefill 1/2 ready")],
            [("Normal", "NotReady", "prefill 1/2 ready")],
            id="not-ready-again-is-told",
        ),
        pytest.param([READY], [READY], [], id="unchanged"),
        pytest.param(
            [READY],
            [c("Ready", "True", "AllReplicasReady", "another message")],
            [],
            id="only-the-message-changed",
        ),
        pytest.param(
            [READY, HEALTHY],
            [NOT_READY, DEGRADED],
            [("Normal", "NotReady", "rolling"), ("Warning", "CrashLoopBackOff", "pod x")],
            id="two-flips-two-events-in-condition-order",
        ),
        pytest.param(
            [DEGRADED],
            [DEGRADED_OTHER],
            [("Warning", "ImagePullBackOff", "pod y")],
            id="new-reason",
        ),
        pytest.param([DEGRADED], [HEALTHY], [], id="recovered-says-nothing-of-degraded"),
    ],
)
def test_transition_events(
    before: list[Condition], after: list[Condition], expected: list[tuple[str, str, str]]
) -> None:
    assert transition_events(before, after) == [Event(*e) for e in expected]
