"""Render the slices beyond the home domain (planning.slices): per slice k >= 1 a StatefulSet
per role, pinned to the slice's domain, and a router that pairs only the slice's pods.

The home slice (0) is the role StatefulSets of rendering.roles, unchanged. A slice's pods
are the role's pods with two labels more (`pdd.dev/slice`, their own
`app.kubernetes.io/instance`) and node affinity for the slice's domain instead of the home's:
they share the role's headless Service, PodDisruptionBudget, NetworkPolicy and scale target
selector. A slice's template does not depend on its counts, so opening, growing or emptying
a slice changes no running pod.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.planning.slices import Slice
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.kinds import STATEFUL_SET, ChildPart
from pdd_operator.rendering.roles import child_metadata, render_pod_template
from pdd_operator.rendering.router import DEPLOYMENT, render_router_deployment, slice_pod_labels


def render_slices(pdd: PDDeployment, ctx: RenderContext) -> list[dict[str, Any]]:
    """The children of every slice after the home one, in ctx.slices."""
    objects: list[dict[str, Any]] = []
    for piece in ctx.slices:
        if piece.index == 0:
            continue
        objects += [render_slice_statefulset(pdd, role, piece, ctx) for role in names.ROLES]
        if pdd.spec.router.enabled:
            objects.append(render_router_deployment(pdd, _in_slice(ctx, piece), piece.index))
    return objects


def render_slice_statefulset(
    pdd: PDDeployment, role: str, piece: Slice, ctx: RenderContext
) -> dict[str, Any]:
    template = render_pod_template(pdd, role, _in_slice(ctx, piece))
    template["metadata"]["labels"].update(slice_pod_labels(pdd, piece.index))
    selector = {**names.selector_labels(pdd.name, role), names.LABEL_SLICE: str(piece.index)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": child_metadata(pdd, names.slice_name(pdd.name, role, piece.index), role),
        "spec": {
            "replicas": piece.replicas(role),
            # The role's headless Service names these pods too (it selects every slice's).
            "serviceName": names.role_name(pdd.name, role),
            "podManagementPolicy": "Parallel",
            # Not part of the coordinated rollout of the home slice: the slice's router pairs
            # one revision, so a slice rolling on its own never pairs across revisions.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }


def _in_slice(ctx: RenderContext, piece: Slice) -> RenderContext:
    """The context with the slice's domain as the placement its pods are pinned to."""
    placement = replace(ctx.placement, level=piece.level, domain=piece.domain)
    return replace(ctx, placement=placement, partitions={})


PART = ChildPart("slices", (STATEFUL_SET, DEPLOYMENT), render_slices)
