"""Small helpers that attach Kubernetes schema extensions to pydantic fields."""

from __future__ import annotations

from typing import Any

from pydantic import Field


def cel(rules: str | list[tuple[str, str]], message: str = "") -> dict[str, Any]:
    """`x-kubernetes-validations` for a field: one (rule, message) or a list of them."""
    pairs = [(rules, message)] if isinstance(rules, str) else rules
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in pairs]}


def free_form() -> Any:
    """An object the API server keeps as given (pod template fragments, valueFrom)."""
    return Field(json_schema_extra={"type": "object", "x-kubernetes-preserve-unknown-fields": True})


def quantity_at_least(field: str, example: str, minimum: str, why: str = "") -> dict[str, Any]:
    """CEL for a quantity field of at least ``minimum`` (``why``, if given, says why), each
    failure in words of its own."""
    least = f"{field} must be at least {minimum}" + (f" ({why})" if why else "")
    return cel(
        [
            ("isQuantity(self)", f"{field} must be a quantity such as {example}"),
            (f"!isQuantity(self) || quantity(self).compareTo(quantity('{minimum}')) >= 0", least),
        ]
    )


def quantity(field: str) -> Any:
    """A resource quantity ('16Gi', '500m'), checked by CEL's isQuantity.

    The rule sits on the (length-bounded) value, never on a map's keys: CEL's cost estimate
    for iterating unbounded keys exceeds the API server's budget.
    """
    return Field(
        max_length=64,
        json_schema_extra=cel(
            "isQuantity(self)", f"{field} must be a quantity such as 16Gi, 500m or 32"
        ),
    )
