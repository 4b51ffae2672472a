"""`pdd-operator render`: every child the operator would create for a PDDeployment, without a
cluster — for a GitOps review, a diff between operator versions, or a look at what a field does.

The same plan and render the reconciler runs. Placement needs the cluster's Nodes: with a nodes
file (``kubectl get nodes -o yaml``) the slice is placed as the operator would place it on an
empty fleet; without one the children carry no placement. The sidecar token Secret is left out
(its value is made at apply time), and so are owner references: offline there is no
PDDeployment uid to name (see `_without_placeholder_owner`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.planning.node_facts import node_facts
from pdd_operator.planning.placement import Placement, plan_placement
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

KIND = "PDDeployment"
# Owner references need a uid; the API server assigns the real one when the object is created.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


class RenderError(ValueError):
    """A document that is not a valid PDDeployment; the message says which and why."""


@dataclass(frozen=True)
class Rendered:
    name: str
    placement: str  # what the planner decided, in words
    children: list[dict[str, Any]]


def render_documents(
    documents: Iterable[Any], nodes: Iterable[Mapping[str, Any]] | None = None
) -> list[Rendered]:
    """Render each PDDeployment among ``documents`` (other kinds are skipped)."""
    facts = node_facts(_items(nodes)) if nodes is not None else None
    out = []
    for index, document in enumerate(documents):
        if not isinstance(document, Mapping) or document.get("kind") != KIND:
            continue
        pdd = _parse(document, index)
        out.append(_render_one(pdd, facts))
    if not out:
        raise RenderError(f"no {KIND} in the input: give a file with `kind: {KIND}`")
    return out


def _parse(document: Mapping[str, Any], index: int) -> PDDeployment:
    metadata = dict(document.get("metadata") or {})
    name = metadata.get("name") or f"document {index + 1}"
    metadata.setdefault("namespace", "default")
    metadata.setdefault("uid", PLACEHOLDER_UID)
    metadata.setdefault("generation", 1)
    try:
        return PDDeployment.from_body({**document, "metadata": metadata})
    except ValidationError as err:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise RenderError(f"{KIND} {name}: {problems}") from err


def _render_one(pdd: PDDeployment, facts: list[Any] | None) -> Rendered:
    if facts is None:
        return Rendered(pdd.name, "not planned: no nodes given (--nodes)", _children(pdd))
    result = plan_placement(pdd.spec, facts, pdd.status.placement)
    words = f"{result.reason}: {result.message}"
    return Rendered(pdd.name, words, _children(pdd, result.placement))


def _children(pdd: PDDeployment, placement: Placement | None = None) -> list[dict[str, Any]]:
    ctx = RenderContext(placement=placement) if placement is not None else RenderContext()
    return [_without_placeholder_owner(child) for child in render_children(pdd, ctx)]


def _without_placeholder_owner(child: dict[str, Any]) -> dict[str, Any]:
    """Drops the owner reference to the placeholder uid. Applied as it is, it would do harm
    either way: where no object has that uid the garbage collector deletes the child as an
    orphan, and where the operator already owns the child a second controller reference is
    refused (`Only one reference can have Controller set to true`). The operator writes the
    real reference when it reconciles the PDDeployment."""
    metadata = child.get("metadata") or {}
    kept = [
        ref for ref in metadata.get("ownerReferences") or [] if ref.get("uid") != PLACEHOLDER_UID
    ]
    if kept:
        return {**child, "metadata": {**metadata, "ownerReferences": kept}}
    return {**child, "metadata": {k: v for k, v in metadata.items() if k != "ownerReferences"}}


def _items(nodes: Iterable[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    """Nodes from a NodeList (``kubectl get nodes -o yaml``) or from single Node documents."""
    out: list[Mapping[str, Any]] = []
    for document in nodes or ():
        if document.get("kind") == "NodeList" or "items" in document:
            out += list(document.get("items") or [])
        elif document.get("kind") == "Node":
            out.append(document)
    return out
