"""The whole desired state of one PDDeployment: every child object, owned and fingerprinted."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import API_VERSION, KIND, PDDeployment
from pdd_operator.rendering import (
    disruption,
    dra,
    gang,
    network_policy,
    roles,
    router,
    sidecar,
    slices,
)
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.kinds import ChildPart, Kind, Stage

ChildKey = tuple[str, str, str]  # (apiVersion, kind, name)

# The parts that render children, in the order their children are listed (within one apply
# wave, reconcile.children.apply_waves keeps it).
PARTS: tuple[ChildPart, ...] = (
    sidecar.ACCESS_PART,
    network_policy.PART,
    dra.PART,
    gang.PART,
    roles.PART,
    slices.PART,
    router.PART,
    disruption.PART,
)
CHILD_KINDS: tuple[Kind, ...] = tuple(dict.fromkeys(kind for part in PARTS for kind in part.kinds))
# The kinds with a pod template: applied last (reconcile.children), and what runs against the
# other children (rendering.dependencies).
WORKLOAD_KINDS = frozenset(k.kind for k in CHILD_KINDS if k.stage is Stage.MAKES_PODS)


def render_children(pdd: PDDeployment, ctx: RenderContext) -> list[dict[str, Any]]:
    """Every part's children, owned and fingerprinted."""
    objects = [obj for part in PARTS for obj in part.render(pdd, ctx)]
    return [_owned(pdd, _fingerprinted(obj)) for obj in objects]


def child_key(obj: dict[str, Any]) -> ChildKey:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def owner_reference(pdd: PDDeployment) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": pdd.name,
        "uid": pdd.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _fingerprinted(obj: dict[str, Any]) -> dict[str, Any]:
    """Stamp a hash of the rendered object so an unchanged child is never re-sent.

    Server-side apply of identical content is a no-op for the object but still a write
    request; comparing fingerprints lets a resync of an unchanged PDDeployment make none.
    """
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    meta = obj["metadata"]
    return {
        **obj,
        "metadata": {
            **meta,
            "annotations": {**meta.get("annotations", {}), names.ANNOTATION_APPLIED_HASH: digest},
        },
    }


def _owned(pdd: PDDeployment, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {**obj, "metadata": {**meta, "ownerReferences": [owner_reference(pdd)]}}
