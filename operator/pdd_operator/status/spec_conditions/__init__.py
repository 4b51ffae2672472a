"""Conditions that follow from the spec alone (pure): each module of this package is one,
found by listing the package, so adding such a condition is adding its module here and its
type and reasons to the API's constants (api/condition_types.py, api/condition_reasons.py).

Each module defines ``CONDITION`` (its type) and ``condition(previous, spec, generation,
now)``, which returns the condition, or nothing where the spec asks for nothing it judges.
Their events follow api/condition_types.WARN_WHEN_FALSE: what they judge is a setting the
pods run without, which waiting will not change, so False is a Warning and never a stop.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdd_operator.api.v1alpha1 import Condition, PDDeploymentSpec

Compute = Callable[[Sequence[Condition], PDDeploymentSpec, int, str], list[Condition]]


@dataclass(frozen=True)
class SpecCondition:
    type: str
    compute: Compute


def _discover() -> tuple[SpecCondition, ...]:
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.append(SpecCondition(module.CONDITION, module.condition))
    return tuple(found)


PARTS = _discover()


def spec_conditions(
    previous: Sequence[Condition], spec: PDDeploymentSpec, generation: int, now: str
) -> list[Condition]:
    """Every spec-derived condition the spec calls for, in the package's order."""
    return [c for part in PARTS for c in part.compute(previous, spec, generation, now)]
