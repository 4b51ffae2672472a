"""A child kind is one part (issue 42): every object a part renders is of a kind that part
declares, so its RBAC rule, informer, apply wave and prerequisite gate (all read from the
declared kinds) cannot miss it; and the stages give the apply order the pass relies on."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from helpers.multinode import multinode
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.resources import CHILD_KINDS, kind_of
from pdd_operator.planning.slices import Slice
from pdd_operator.reconcile.children import POD_MAKERS, apply_waves
from pdd_operator.rendering.children import PARTS, render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.kinds import Stage

AUTOSCALED = {"decode": {"minReplicas": 0, "maxReplicas": 16}, "follower": "prefill"}
SECOND_SLICE = Slice(1, "nvidia.com/gpu.clique", "clique-1", 1, 2)


def samples() -> list[tuple[str, PDDeployment, RenderContext]]:
    """Deployments that between them make every child kind."""
    return [
        ("sample", make_pdd(), RenderContext()),
        ("dra", make_pdd({"topology": {"dra": {"enabled": True}}}), RenderContext()),
        ("gang native", multinode(scheduling={"gang": "native"}), RenderContext()),
        ("gang volcano", multinode(scheduling={"gang": "volcano"}), RenderContext()),
        ("slices", make_pdd({"autoscaling": AUTOSCALED}), RenderContext(slices=(SECOND_SLICE,))),
    ]


@pytest.mark.parametrize("name", [name for name, _, _ in samples()])
def test_each_part_renders_only_the_kinds_it_declares(name: str) -> None:
    _, pdd, ctx = next(sample for sample in samples() if sample[0] == name)
    for part in PARTS:
        declared = {(kind.api_version, kind.kind) for kind in part.kinds}
        made = {(obj["apiVersion"], obj["kind"]) for obj in part.render(pdd, ctx)}
        assert made <= declared, f"part {part.name!r} renders undeclared kinds {made - declared}"


def test_the_samples_make_every_declared_kind() -> None:
    made = {
        (o["apiVersion"], o["kind"]) for _, pdd, ctx in samples() for o in render_children(pdd, ctx)
    }
    assert made == {(kind.api_version, kind.kind) for kind in CHILD_KINDS}


def test_every_child_kind_has_a_stage_and_a_reason_for_its_rbac_rule() -> None:
    for kind in CHILD_KINDS:
        assert kind.stage is not None and kind.why, kind.kind
        assert kind_of(kind.api_version, kind.kind) is kind


def test_waves_follow_the_stages() -> None:
    objects: list[dict[str, Any]] = []
    for _, pdd, ctx in samples():
        objects += render_children(pdd, ctx)
    waves = apply_waves(objects)
    stages = [{kind_of(o["apiVersion"], o["kind"]).stage for o in wave} for wave in waves]
    assert stages == [{Stage.REFERENCED}, {Stage.USED, Stage.ADMITS_PODS}, {Stage.MAKES_PODS}]
    assert {"StatefulSet", "Deployment", "Workload", "PodGroup"} == POD_MAKERS
