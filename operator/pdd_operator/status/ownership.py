"""Whose object holds a child's name (pure): the operator writes only objects it controls.

Server-side apply with force would take over any object of a child's name: merge the render
into its spec, add nothing else of the operator's, and leave it for the garbage collector to
delete with the PDDeployment. So before a child that the indexes do not list as this
deployment's is applied, the object of that name (if any) is read; one whose controller
reference is not this PDDeployment's uid is a name conflict, reported and left alone, unless
it proves to be this deployment's child that lost its owner reference (`adoptable`): then
the apply puts the reference back. Where the chart's name-guard admission policy is in force,
the API server refuses a takeover itself (and admits the same proof), and the object is read
only then, to name its holder, or where the watch saw it lose its reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import names

REASON = reasons.NAME_CONFLICT


@dataclass(frozen=True)
class NameConflict:
    """An object that holds a child's name and is not this deployment's."""

    kind: str
    name: str
    holder: str  # "PDDeployment other", "Deployment web", or "no owner"

    def describe(self) -> str:
        return f"{self.kind} {self.name} (owned by {self.holder})"


def holder(owner_references: Sequence[Mapping[str, Any]]) -> str:
    """Who controls an object, as a user finds it: kind and name of the controller reference,
    else of the first owner reference, else "no owner"."""
    refs = list(owner_references)
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return "no owner"
    return f"{ref.get('kind', '?')} {ref.get('name', '?')}"


def name_conflict(
    kind: str, name: str, owner_references: Sequence[Mapping[str, Any]], pdd_uid: str
) -> NameConflict | None:
    """None when the object is this PDDeployment's (its controller reference names the uid)."""
    for ref in owner_references:
        if ref.get("controller") and ref.get("uid") == pdd_uid:
            return None
    return NameConflict(kind, name, holder(owner_references))


def adoptable(meta: Mapping[str, Any], pdd_name: str, field_manager: str) -> bool:
    """Whether an object without a controller is this deployment's child that lost its owner
    reference (a re-applied export, a restore, a `kubectl replace`): it carries the
    deployment's identity label and name annotation, and its managed fields show an apply by
    the operator's field manager. The chart's name-guard policy admits the same proof."""
    if any(ref.get("controller") for ref in meta.get("ownerReferences") or []):
        return False
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    applied = any(
        entry.get("manager") == field_manager and entry.get("operation") == "Apply"
        for entry in meta.get("managedFields") or []
    )
    return (
        labels.get(names.LABEL_DEPLOYMENT) == names.instance_id(pdd_name)
        and annotations.get(names.ANNOTATION_OWNER_NAME) == pdd_name
        and applied
    )


def adoption_message(kind: str, name: str) -> str:
    """The DriftCorrected event's message for a child whose owner reference was put back."""
    return (
        f"{kind} {name} had lost its owner reference; put back (it carries this PDDeployment's "
        "labels and fields the operator applied for it)"
    )


def conflict_message(conflicts: Sequence[NameConflict], held: Sequence[str] = ()) -> str:
    """The condition's message: which objects, whose, what is held (`held`: "Kind name" of the
    other children that would run against them), and what to do."""
    listed = "; ".join(c.describe() for c in conflicts)
    these, it = ("that child", "it") if len(conflicts) == 1 else ("those children", "them")
    holds = f"{these} only (nothing runs against {it})"
    if held:
        holds = f"{these} and what runs against {it}, {', '.join(held)}"
    return (
        f"the name of a child is taken by an object this PDDeployment does not own: {listed}. "
        "The operator does not take over, change or delete it. Held until the name is free "
        f"(neither created nor changed): {holds}; every other child is kept as the spec says. "
        "To free the name: delete or rename that object, or rename this PDDeployment (child "
        "names derive from it)"
    )


def scaler_conflict_message(conflict: NameConflict, role: str) -> str:
    """The condition's message for a scale target's name held by another object: the
    deployment runs, but nothing can scale that role until the name is free."""
    return (
        f"the name of the {role} scale target is taken by an object this PDDeployment does "
        f"not own: {conflict.describe()}. The operator leaves it alone; {role} runs its "
        f"starting count and no HPA or KEDA can scale it meanwhile: delete or rename that "
        "object, or rename this PDDeployment (child names derive from it)"
    )


TOKEN_REASON = reasons.TOKEN_SECRET_CONFLICT
