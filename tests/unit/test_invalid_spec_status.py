"""Status of a PDDeployment whose spec the operator cannot read: the message and conditions."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from helpers.factories import BASE_BODY
from pdd_operator.api.v1alpha1 import Condition, PDDeploymentSpec, PDDeploymentStatus
from pdd_operator.status.invalid import invalid_spec_conditions, invalid_spec_message

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def spec_error(**changes: Any) -> ValidationError:
    spec = copy.deepcopy(BASE_BODY["spec"])
    spec.update(changes)
    with pytest.raises(ValidationError) as caught:
        PDDeploymentSpec.model_validate(spec)
    return caught.value


def message_of(err: ValidationError) -> str:
    return invalid_spec_message(err.title, err.errors(include_url=False))


MESSAGE_CASES = [
    (
        "a field this operator does not know",
        lambda: spec_error(futureField="x"),
        "spec.futureField: this operator does not know the field (is the CRD newer than the "
        "operator?); remove the field, or upgrade the operator to the CRD's version",
    ),
    (
        "a value the model refuses, nested",
        lambda: spec_error(model={"name": ""}),
        "spec.model.name: String should have at least 1 character; fix the field and apply again",
    ),
    (
        "several errors: the first, and how many more",
        lambda: spec_error(futureField="x", otherField=1, thirdField=2),
        "spec.futureField: this operator does not know the field (is the CRD newer than the "
        "operator?); remove the field, or upgrade the operator to the CRD's version "
        "(and 2 more errors)",
    ),
]


@pytest.mark.parametrize(
    ("make", "expected"), [c[1:] for c in MESSAGE_CASES], ids=[c[0] for c in MESSAGE_CASES]
)
def test_message_names_the_field_and_the_fix(make: Any, expected: str) -> None:
    assert message_of(make()) == expected


def test_a_status_error_is_not_called_a_spec_error() -> None:
    with pytest.raises(ValidationError) as caught:
        PDDeploymentStatus.model_validate({"observedGeneration": "many"})
    message = message_of(caught.value)
    assert message.startswith("status.observedGeneration: ")
    assert "run the operator version that matches the CRD" in message


def cond(type_: str, status: str, reason: str, gen: int = 2, at: str = T0) -> Condition:
    return Condition(
        type=type_,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        message="m",
        observedGeneration=gen,
        lastTransitionTime=at,
    )


PREVIOUS = [
    cond("Ready", "True", "AllReplicasReady"),
    cond("Progressing", "False", "Complete"),
    cond("Degraded", "False", "AsExpected"),
    cond("Reconciling", "False", "Complete"),
    cond("Stalled", "False", "NotStalled"),
    cond("Placed", "True", "Placed"),
]


def test_stalled_and_not_ready_at_this_generation_the_rest_kept() -> None:
    result = invalid_spec_conditions(PREVIOUS, 3, "fix it", T1)
    assert [c.type for c in result] == [c.type for c in PREVIOUS]
    by_type = {c.type: c for c in result}
    assert by_type["Stalled"] == Condition(
        type="Stalled",
        status="True",
        reason="InvalidSpec",
        message="fix it",
        observedGeneration=3,
        lastTransitionTime=T1,
    )
    assert by_type["Ready"].model_dump() == {
        **by_type["Stalled"].model_dump(),
        "type": "Ready",
        "status": "False",
    }
    # Already False: the transition time stays; the reason and generation move.
    assert by_type["Progressing"].lastTransitionTime == T0
    assert (by_type["Progressing"].reason, by_type["Progressing"].observedGeneration) == (
        "InvalidSpec",
        3,
    )
    # What the last readable generation observed stays as it was, with its generation.
    assert by_type["Degraded"] == PREVIOUS[2] and by_type["Placed"] == PREVIOUS[5]


def test_the_same_invalid_spec_again_gives_the_same_conditions() -> None:
    first = invalid_spec_conditions(PREVIOUS, 3, "fix it", T0)
    assert invalid_spec_conditions(first, 3, "fix it", T1) == first


def test_a_fresh_object_gets_the_four_conditions() -> None:
    result = invalid_spec_conditions([], 1, "fix it", T0)
    assert [(c.type, c.status) for c in result] == [
        ("Ready", "False"),
        ("Progressing", "False"),
        ("Reconciling", "False"),
        ("Stalled", "True"),
    ]
