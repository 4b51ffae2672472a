"""Status of a PDDeployment this operator cannot read (pure).

The API server checks every PDDeployment against the CRD's schema and CEL rules, so a spec
the operator's models refuse got past them some other way: most often a CRD newer than the
operator (a field this operator does not know), or a CRD applied without its rules. The
object is then Stalled (kstatus: the object failed; Flux and `kubectl wait` stop waiting) and
not Ready, with the field and the fix in the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import Condition
from pdd_operator.status.conditions import set_condition

REASON = reasons.INVALID_SPEC
# Conditions an unreadable spec sets; the others keep what the last readable one observed
# (their observedGeneration says which generation that was).
NOT_TRUE = (condition_types.READY, condition_types.PROGRESSING, condition_types.RECONCILING)

_ROOTS = {"PDDeploymentSpec": "spec", "PDDeploymentStatus": "status"}


def invalid_spec_message(model: str, errors: Sequence[Mapping[str, Any]]) -> str:
    """The first error (a pydantic error of `model`), where it is and what to do about it."""
    if not errors:
        return f"{_ROOTS.get(model, model)}: not readable by this operator"
    first = errors[0]
    where = ".".join([_ROOTS.get(model, model), *(str(part) for part in first["loc"])])
    if first["type"] == "extra_forbidden":
        text = (
            f"{where}: this operator does not know the field (is the CRD newer than the "
            "operator?); remove the field, or upgrade the operator to the CRD's version"
        )
    elif model == "PDDeploymentStatus":
        text = (
            f"{where}: {first['msg']} (status written by another version of the operator?); "
            "run the operator version that matches the CRD"
        )
    else:
        text = f"{where}: {first['msg']}; fix the field and apply again"
    more = len(errors) - 1
    return text + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def invalid_spec_conditions(
    previous: Sequence[Condition], generation: int, message: str, now: str
) -> list[Condition]:
    """Stalled=True and Ready/Progressing/Reconciling=False, reason InvalidSpec, at this
    generation; every other condition as it was. Order: the previous one, new types last."""
    updated = {
        type_: set_condition(previous, type_, False, REASON, message, generation, now)
        for type_ in NOT_TRUE
    }
    updated[condition_types.STALLED] = set_condition(
        previous, condition_types.STALLED, True, REASON, message, generation, now
    )
    result = [updated.pop(c.type, c) for c in previous]
    return result + [updated[t] for t in (*NOT_TRUE, condition_types.STALLED) if t in updated]
