"""`pdd-operator render`: what the operator would create, from files, without a cluster."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.factories import BASE_BODY
from pdd_operator.cli import main
from pdd_operator.offline import RenderError, render_documents

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def body(**spec_patch: Any) -> dict[str, Any]:
    document = copy.deepcopy(BASE_BODY)
    document.update(apiVersion="pdd.dev/v1alpha1", kind="PDDeployment")
    document["spec"].update(spec_patch)
    return document


def node(name: str, clique: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.clique": clique}},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_renders_every_child_without_placement_when_no_nodes_are_given() -> None:
    (rendered,) = render_documents([body()])
    kinds = {(c["kind"], c["metadata"]["name"]) for c in rendered.children}
    assert {("StatefulSet", "llama-prefill"), ("StatefulSet", "llama-decode")} <= kinds
    assert "no nodes given" in rendered.placement
    prefill = next(c for c in rendered.children if c["metadata"]["name"] == "llama-prefill")
    assert "affinity" not in prefill["spec"]["template"]["spec"]


PDD_EXAMPLES = sorted(p for p in EXAMPLES.rglob("*.yaml") if "kind: PDDeployment" in p.read_text())


@pytest.mark.parametrize("example", PDD_EXAMPLES, ids=lambda p: p.name)
def test_no_child_names_an_owner_that_does_not_exist(example: Path) -> None:
    """Offline there is no PDDeployment uid: a reference to a made-up one would get the child
    garbage collected, or refused beside the operator's own reference."""
    documents = list(yaml.safe_load_all(example.read_text()))
    for rendered in render_documents(documents):
        for child in rendered.children:
            assert "ownerReferences" not in child["metadata"], child["metadata"]["name"]


def test_with_nodes_the_slice_is_placed_in_one_domain() -> None:
    # 2P + 4D at TP 2 = 12 GPUs: clique b (two 8-GPU nodes) fits, clique a (one node) does not
    nodes = [{"kind": "NodeList", "items": [node("a-0", "a"), node("b-0", "b"), node("b-1", "b")]}]
    (rendered,) = render_documents([body()], nodes)
    assert rendered.placement.startswith("Placed: ")
    assert "nvidia.com/gpu.clique=b" in rendered.placement
    prefill = next(c for c in rendered.children if c["metadata"]["name"] == "llama-prefill")
    preferred = prefill["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    expression = preferred[0]["preference"]["matchExpressions"][0]
    assert (expression["key"], expression["values"]) == ("nvidia.com/gpu.clique", ["b"])


def test_other_kinds_are_skipped_and_an_input_without_a_pdddeployment_is_an_error() -> None:
    (rendered,) = render_documents([{"kind": "ConfigMap"}, body()])
    assert rendered.name == "llama"
    with pytest.raises(RenderError, match="no PDDeployment in the input"):
        render_documents([{"kind": "ConfigMap"}])


def test_an_invalid_spec_names_the_field() -> None:
    with pytest.raises(RenderError, match=r"PDDeployment llama: spec\.prefill\.replicas"):
        render_documents([body(prefill={"replicas": "many"})])


def test_the_command_prints_yaml_and_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["render", "-f", str(EXAMPLES / "vllm-2p4d.yaml")]) == 0
    children = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert {"StatefulSet", "Service", "Deployment"} <= {c["kind"] for c in children}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(body(prefill={"replicas": "many"})))
    assert main(["render", "-f", str(bad)]) == 2
    assert "spec.prefill.replicas" in capsys.readouterr().err
    assert main(["render", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("example", "router", "pd_flag"),
    [
        ("vllm-2p4d.yaml", ["vllm-router"], "--vllm-pd-disaggregation"),
        ("sglang-1p2d.yaml", ["smg"], "--pd-disaggregation"),
    ],
)
def test_each_example_renders_its_upstream_router_pairing_one_revision(
    example: str, router: list[str], pd_flag: str
) -> None:
    (rendered,) = render_documents(list(yaml.safe_load_all((EXAMPLES / example).read_text())))
    revisions = {
        c["spec"]["template"]["metadata"]["labels"]["pdd.dev/revision"]
        for c in rendered.children
        if c["kind"] == "StatefulSet"
    }
    (deployment,) = [c for c in rendered.children if c["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert container["command"] == router and pd_flag in args and "--service-discovery" in args
    (revision,) = revisions  # prefill and decode of one engine revision
    for role_flag, role in (("--prefill-selector", "prefill"), ("--decode-selector", "decode")):
        selector = args[args.index(role_flag) + 1 : args.index(role_flag) + 4]
        assert f"pdd.dev/revision={revision}" in selector and f"pdd.dev/role={role}" in selector


def test_the_autoscaling_examples_target_the_scale_target_the_operator_creates() -> None:
    from pdd_operator.api.v1alpha1 import PDDeployment
    from pdd_operator.planning.autoscaling import scale_target_roles
    from pdd_operator.rendering.scalers import render_scaler

    folder = EXAMPLES / "autoscaling"
    (document,) = yaml.safe_load_all((folder / "vllm-decode-leads.yaml").read_text())
    assert render_documents([document])  # a valid PDDeployment that renders
    pdd = PDDeployment.from_body({**document, "metadata": {**document["metadata"], "uid": "u"}})
    targets = {
        (s["apiVersion"], s["kind"], s["metadata"]["name"])
        for s in (render_scaler(pdd, role) for role in scale_target_roles(pdd.spec))
    }
    for name in ("hpa-prometheus-adapter.yaml", "keda-scaledobject.yaml"):
        (autoscaler,) = yaml.safe_load_all((folder / name).read_text())
        ref = autoscaler["spec"]["scaleTargetRef"]
        assert {(ref["apiVersion"], ref["kind"], ref["name"])} == targets, name


def test_the_multinode_example_renders_ranked_instances_in_one_domain() -> None:
    # Two 2-node instances of 8 GPUs: rack b (four nodes) holds all four ranks, rack a
    # (three nodes) does not; every rank is required into the chosen rack.
    racks = [node(f"a-{i}", "a") for i in range(3)] + [node(f"b-{i}", "b") for i in range(4)]
    nodes = [{"kind": "NodeList", "items": racks}]
    documents = list(yaml.safe_load_all((EXAMPLES / "sglang-deepseek-multinode.yaml").read_text()))
    (rendered,) = render_documents(documents, nodes)
    assert "nvidia.com/gpu.clique=b" in rendered.placement
    by_key = {(c["kind"], c["metadata"]["name"]): c for c in rendered.children}
    for role in ("prefill", "decode"):
        assert by_key[("Workload", f"deepseek-r1-{role}")]["spec"]["podGroups"][0]["policy"] == {
            "gang": {"minCount": 2}
        }
        sts = by_key[("StatefulSet", f"deepseek-r1-{role}-0")]
        assert sts["spec"]["replicas"] == 2
        pod = sts["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        expression = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert (expression["key"], expression["values"]) == ("nvidia.com/gpu.clique", ["b"])
        engine = next(c for c in pod["containers"] if c["name"] == "engine")
        assert "--nnodes" in engine["args"] and "--node-rank" in engine["command"][2]
    (router,) = [c for c in rendered.children if c["kind"] == "Deployment"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "apps.kubernetes.io/pod-index=0" in args
