"""The whole desired state of one PDDeployment: every child object, owned and fingerprinted."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import API_VERSION, KIND, PDDeployment
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.disruption import render_disruption_budgets
from pdd_operator.rendering.dra import render_claim_templates
from pdd_operator.rendering.gang import render_gang_objects
from pdd_operator.rendering.network_policy import render_network_policies
from pdd_operator.rendering.roles import render_role
from pdd_operator.rendering.router import render_router
from pdd_operator.rendering.sidecar import render_sidecar_access
from pdd_operator.rendering.slices import render_slices

ChildKey = tuple[str, str, str]  # (apiVersion, kind, name)


def render_children(pdd: PDDeployment, ctx: RenderContext) -> list[dict[str, Any]]:
    """Children in apply order: access objects and claim templates before the pods using them."""
    objects = [
        *render_sidecar_access(pdd, ctx.slices),
        *render_network_policies(pdd, ctx),
        *render_claim_templates(pdd),
        *render_gang_objects(pdd),
        *[obj for role in names.ROLES for obj in render_role(pdd, role, ctx)],
        *render_slices(pdd, ctx),
        *render_router(pdd, ctx),
        *render_disruption_budgets(pdd),
    ]
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
