"""ParallelismSupported: whether the model can be split the way each role is laid out (pure).

False where the model's shape is known and a role's layout does not divide what the engine
splits (planning.parallelism_fit): every engine pod would fail at start, after it took its
GPUs and loaded the weights. Waiting does not help, so the deployment is Stalled and not
Ready with the sizes that fit in the message, and its engine workloads are neither created
nor changed until the spec fits (the reconcile pass holds them, as for a missing model Secret).
A shape from spec.model.kvCache gets there only past the CRD's rules, which refuse it at
admission; the operator's table of known models is the usual source.

Unknown, without an event, where the shape is not known or lacks a count: there is nothing
to check against, and the message says which field would make it checked. A custom engine's
parallelism is its own: no condition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import Condition, PDDeploymentSpec
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.kv_layout import model_shape, shape_source
from pdd_operator.planning.parallelism_fit import (
    ATTENTION_HEADS,
    EXPERTS,
    KV_HEADS,
    NODE_GPUS,
    RoleFit,
    Split,
    fitting_attention_ranks,
    parallelism_fit,
    role_splits,
    tensor_setting,
)
from pdd_operator.status.conditions import set_condition

CONDITION = condition_types.PARALLELISM_SUPPORTED
FITS = reasons.FITS_MODEL
SHAPE_UNKNOWN = reasons.MODEL_SHAPE_UNKNOWN
SHAPE_INCOMPLETE = reasons.MODEL_SHAPE_INCOMPLETE
NOT_DIVISIBLE = {
    ATTENTION_HEADS: reasons.ATTENTION_HEADS_NOT_DIVISIBLE,
    KV_HEADS: reasons.KV_HEADS_NOT_DIVISIBLE,
    EXPERTS: reasons.EXPERTS_NOT_DIVISIBLE,
}
# The spec.model.kvCache field that gives each count.
COUNT_FIELDS = {ATTENTION_HEADS: "attentionHeads", EXPERTS: "experts"}


@dataclass(frozen=True)
class ParallelismVerdict:
    """The condition's status (None: not checked), reason and message."""

    fits: bool | None
    reason: str
    message: str

    @property
    def refused(self) -> bool:
        return self.fits is False


def parallelism_verdict(spec: PDDeploymentSpec) -> ParallelismVerdict | None:
    """None for an engine whose parallelism is not the operator's (custom)."""
    fits = parallelism_fit(spec)
    if fits == ():
        return None
    if fits is None:
        return ParallelismVerdict(None, SHAPE_UNKNOWN, unknown_message(spec))
    uneven = [fit for fit in fits if fit.uneven]
    if uneven:
        return ParallelismVerdict(
            False, NOT_DIVISIBLE[uneven[0].uneven[0].parts], refusal(spec, uneven)
        )
    missing = sorted({count for fit in fits for count in fit.unchecked})
    if missing:
        return ParallelismVerdict(None, SHAPE_INCOMPLETE, incomplete_message(spec, missing))
    return ParallelismVerdict(True, FITS, fitting_message(spec, fits))


def engines_held_by(verdict: ParallelismVerdict | None) -> bool:
    """Whether the engine workloads wait for the spec: only on a layout the model's known
    shape cannot be split by."""
    return verdict is not None and verdict.refused


def parallelism_condition(
    previous: Sequence[Condition], verdict: ParallelismVerdict | None, gen: int, now: str
) -> list[Condition]:
    if verdict is None:
        return []
    reason, message = verdict.reason, verdict.message
    return [set_condition(previous, CONDITION, verdict.fits, reason, message, gen, now)]


def refusal(spec: PDDeploymentSpec, uneven: Sequence[RoleFit]) -> str:
    """The first role's first uneven split, what the engine does with it and the sizes that
    fit; the engines wait for the fix."""
    first = uneven[0]
    others = [f"spec.{fit.role}" for fit in uneven[1:]]
    also = f" ({' and '.join(others)} does not fit either)" if others else ""
    engine = adapter_for(spec.engine.type).display_name
    return (
        f"spec.{first.role}: {_uneven_split(spec, first, first.uneven[0])}: {engine} fails "
        f"at start with it; {_fix(spec, first, first.uneven[0])}{also}; the engine pods are "
        "neither started nor changed until it fits"
    )


def _uneven_split(spec: PDDeploymentSpec, fit: RoleFit, split: Split) -> str:
    model = f"{spec.model.name} (from {shape_source(spec.model)})"
    if split.parts == EXPERTS:
        return (
            f"spec.{fit.role}.parallelism.expert {split.ranks} does not divide the "
            f"{split.count} routed experts of {model}"
        )
    size = f"tensor-parallel size {split.ranks} ({tensor_setting(spec, fit.role, fit.layout)})"
    if split.parts == KV_HEADS:
        return f"{size} and the {split.count} KV heads of {model} do not divide one another"
    return f"{size} does not divide the {split.count} attention heads of {model}"


def _fix(spec: PDDeploymentSpec, fit: RoleFit, split: Split) -> str:
    if split.parts == EXPERTS:
        return f"set spec.{fit.role}.parallelism.expert to a divisor of {split.count}"
    shape = model_shape(spec.model)
    assert shape is not None  # an uneven split was found in it
    sizes = fitting_attention_ranks(shape, max(NODE_GPUS, split.ranks))
    return f"use a tensor-parallel size of {_listed([str(n) for n in sizes], 'or')}"


def _listed(words: Sequence[str], last: str) -> str:
    """ "a", "a or b", "a, b or c" (``last``: "or", "and")."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def fitting_message(spec: PDDeploymentSpec, fits: Sequence[RoleFit]) -> str:
    shape = model_shape(spec.model)
    assert shape is not None  # fits were found for it
    counts: dict[str, int] = {}
    for fit in fits:
        for split in role_splits(shape, spec.engine.type, fit.layout):
            counts.setdefault(split.parts, split.count)
    parts = _listed([f"{count} {parts}" for parts, count in counts.items()], "and")
    return (
        f"{spec.model.name} (from {shape_source(spec.model)}): its {parts} split evenly over "
        "both roles' parallel ranks"
    )


def unknown_message(spec: PDDeploymentSpec) -> str:
    return (
        f"the shape of {spec.model.name} is not known to the operator: the parallelism is not "
        "checked against the heads and experts the engine splits; set spec.model.kvCache, "
        "with attentionHeads (and experts for a mixture of experts), to have it checked"
    )


def incomplete_message(spec: PDDeploymentSpec, missing: Sequence[str]) -> str:
    fields = " and ".join(f"spec.model.kvCache.{COUNT_FIELDS[count]}" for count in missing)
    return (
        f"{spec.model.name} (from spec.model.kvCache): the {' and '.join(missing)} are not "
        f"checked against the parallelism; set {fields} to have them checked"
    )
