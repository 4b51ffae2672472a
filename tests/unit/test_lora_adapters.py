"""spec.model.adapters: LoRA adapters both roles' engines load at start, mounted like the
model, named in status with the request fields that select each, and claimed like the model's
own claim. The command lines pass each release's parser (tests/unit/engines/
test_engine_parsers.py, case "lora"); the reference engine reads them as the engines do, and
tests/integration/test_refengine_routers.py sends requests for an adapter through the real
routers."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.status.compute import adapter_statuses
from pdd_operator.status.model import model_references
from pdd_refengine.cli import UsageError, parse_args
from pdd_refengine.openai_api import BadRequest, ModelNotFound, requested_adapter

HUB = {"name": "sql", "source": {"huggingFace": {"repo": "org/llama-sql-lora"}}}
CLAIM = {"name": "chat-v2", "source": {"pvc": {"claimName": "adapters", "subPath": "chat/v2"}}}
IMAGE = {"name": "ner", "source": {"image": {"reference": "registry.example/ner:1"}}}


def pdd(engine: str, *adapters: dict[str, Any]) -> PDDeployment:
    model = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"}
    return make_pdd({"engine": {"type": engine}, "model": {**model, "adapters": list(adapters)}})


def engine_pods(obj: PDDeployment) -> dict[str, dict[str, Any]]:
    return {
        child["metadata"]["labels"]["pdd.dev/role"]: child["spec"]["template"]["spec"]
        for child in render_children(obj, RenderContext())
        if child["kind"] == "StatefulSet"
    }


def engine(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == "engine")


@pytest.mark.parametrize(
    ("engine_type", "flag"), [("vllm", "--lora-modules"), ("sglang", "--lora-paths")]
)
def test_both_roles_load_every_adapter_by_name(engine_type: str, flag: str) -> None:
    for role, pod in engine_pods(pdd(engine_type, HUB, CLAIM, IMAGE)).items():
        args = engine(pod)["args"]
        at = args.index("--enable-lora")
        assert args[at + 1 : at + 5] == [
            flag,
            "sql=org/llama-sql-lora",  # a Hub repo id: the engine downloads it into HF_HOME
            "chat-v2=/models/adapters/chat-v2",
            "ner=/models/adapters/ner",
        ], role


def test_adapters_on_volumes_are_mounted_read_only_where_the_flags_say() -> None:
    pod = engine_pods(pdd("vllm", HUB, CLAIM, IMAGE))["decode"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["lora-1"]["persistentVolumeClaim"] == {"claimName": "adapters", "readOnly": True}
    assert volumes["lora-2"]["image"] == {"reference": "registry.example/ner:1"}
    assert "lora-0" not in volumes  # the Hub adapter has none
    mounts = {m["name"]: m for m in engine(pod)["volumeMounts"]}
    assert mounts["lora-1"] == {
        "name": "lora-1",
        "mountPath": "/models/adapters/chat-v2",
        "readOnly": True,
        "subPath": "chat/v2",
    }
    assert mounts["lora-2"]["mountPath"] == "/models/adapters/ner"


def test_no_adapters_no_lora_flags_or_volumes() -> None:
    pod = engine_pods(pdd("vllm"))["prefill"]
    assert "--enable-lora" not in engine(pod)["args"]
    assert not [v for v in pod["volumes"] if v["name"].startswith("lora-")]


def test_status_names_each_adapter_with_the_fields_that_select_it() -> None:
    vllm = adapter_statuses(pdd("vllm", HUB).spec)
    assert [(a.name, a.requestFields) for a in vllm] == [("sql", {"model": "sql"})]
    sglang = adapter_statuses(pdd("sglang", HUB).spec)
    assert [a.requestFields for a in sglang] == [{"model": "llama", "lora_path": "sql"}]


def test_an_adapters_claim_is_checked_like_the_models() -> None:
    claims = model_references(pdd("vllm", HUB, CLAIM).spec).claims
    assert [(c.name, c.field, c.written) for c in claims] == [
        ("adapters", "spec.model.adapters[1].source.pvc.claimName", False)
    ]


def test_the_reference_engine_reads_the_rendered_lora_flags() -> None:
    for engine_type in ("vllm", "sglang"):
        obj = pdd(engine_type, HUB, CLAIM)
        config = parse_args(engine(engine_pods(obj)["prefill"])["args"])  # "vllm serve ..."
        assert config.adapters == (
            ("sql", "org/llama-sql-lora"),
            ("chat-v2", "/models/adapters/chat-v2"),
        ), engine_type


def test_vllm_lora_modules_without_enable_lora_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(UsageError, match="--lora-modules needs --enable-lora"):
        parse_args(["vllm", "serve", "m", "--lora-modules", "a=/x"])


@pytest.mark.parametrize(
    ("engine_type", "body", "adapter"),
    [
        ("vllm", {"model": "sql"}, "sql"),
        ("vllm", {"model": "llama"}, ""),
        ("vllm", {}, ""),
        ("sglang", {"model": "llama", "lora_path": "sql"}, "sql"),
        ("sglang", {"model": "llama:sql"}, "sql"),
        ("sglang", {"model": "sql"}, ""),  # SGLang runs the base model for a bare name
    ],
)
def test_requests_select_an_adapter_as_each_engine_reads_them(
    engine_type: str, body: dict[str, str], adapter: str
) -> None:
    assert requested_adapter(engine_type, body, "llama", ["sql"]) == adapter


def test_an_adapter_not_loaded_is_refused_as_each_engine_refuses_it() -> None:
    with pytest.raises(ModelNotFound, match="The model `nope` does not exist"):
        requested_adapter("vllm", {"model": "nope"}, "llama", ["sql"])
    with pytest.raises(BadRequest, match="adapters are not loaded: nope"):
        requested_adapter("sglang", {"model": "llama", "lora_path": "nope"}, "llama", ["sql"])


def test_adapters_on_one_claim_share_its_volume_and_are_checked_once() -> None:
    first = {"name": "a", "source": {"pvc": {"claimName": "adapters", "subPath": "a"}}}
    second = {"name": "b", "source": {"pvc": {"claimName": "adapters", "subPath": "b"}}}
    obj = pdd("vllm", first, second)
    pod = engine_pods(obj)["prefill"]
    assert [v["name"] for v in pod["volumes"] if v["name"].startswith("lora-")] == ["lora-0"]
    mounts = [m for m in engine(pod)["volumeMounts"] if m["name"] == "lora-0"]
    assert [(m["mountPath"], m["subPath"]) for m in mounts] == [
        ("/models/adapters/a", "a"),
        ("/models/adapters/b", "b"),
    ]
    assert [c.name for c in model_references(obj.spec).claims] == ["adapters"]


def test_an_adapter_on_the_models_own_claim_mounts_the_models_volume_again() -> None:
    model = {"name": "llama", "source": {"pvc": {"claimName": "weights", "subPath": "base"}}}
    lora = {"name": "sql", "source": {"pvc": {"claimName": "weights", "subPath": "lora/sql"}}}
    obj = make_pdd({"model": {**model, "adapters": [lora]}})
    pod = engine_pods(obj)["decode"]
    assert not [v for v in pod["volumes"] if v["name"].startswith("lora-")]
    mounts = [m for m in engine(pod)["volumeMounts"] if m["name"] == "model"]
    assert [(m["mountPath"], m["subPath"]) for m in mounts] == [
        ("/models/model", "base"),
        ("/models/adapters/sql", "lora/sql"),
    ]
    assert [c.name for c in model_references(obj.spec).claims] == ["weights"]
