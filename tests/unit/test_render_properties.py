"""For every valid spec, parsing and rendering never raise and the output is well formed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.specs import names, valid_specs
from pdd_operator.api import names as child_names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext


def body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": "u", "generation": 1},
        "spec": spec,
    }


@settings(max_examples=300, deadline=None)
@given(
    name=names,
    spec=valid_specs(),
    partitions=st.dictionaries(st.sampled_from(["prefill", "decode"]), st.integers(0, 16)),
)
def test_rendering_never_raises_and_children_are_well_formed(
    name: str, spec: dict[str, Any], partitions: dict[str, int]
) -> None:
    pdd = PDDeployment.from_body(body(name, spec))
    children = render_children(pdd, RenderContext(partitions=partitions))
    keys = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(keys) == len(set(keys)), "two children with one name"
    for child in children:
        meta = child["metadata"]
        assert len(meta["name"]) <= 63
        assert all(len(v) <= 63 for v in meta["labels"].values())
        assert meta["labels"][child_names.LABEL_DEPLOYMENT] == child_names.instance_id(name)
    statefulsets = [c for c in children if c["kind"] == "StatefulSet"]
    assert {s["metadata"]["name"] for s in statefulsets} == {
        child_names.role_name(name, "prefill"),
        child_names.role_name(name, "decode"),
    }
