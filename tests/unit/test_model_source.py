"""spec.model.source rendered into the engine pods, per source and per engine: the volume,
its mount, the Hugging Face environment, how the engine is told the model, and the startup
probe's budget; and the API's one-of rule."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from helpers.factories import make_pdd
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
TOKEN = {"tokenSecretRef": {"name": "hf-token"}}
DIGEST = "@sha256:" + "b" * 64

# (id, spec.model.source, the pod's model volume minus its name)
VOLUMES: list[tuple[str, dict[str, Any] | None, dict[str, Any]]] = [
    ("default", None, {"emptyDir": {}}),
    ("huggingFace", {"huggingFace": TOKEN}, {"emptyDir": {}}),
    (
        "huggingFace shared cache",
        {"huggingFace": {**TOKEN, "cache": {"claimName": "hf-cache"}}},
        {"persistentVolumeClaim": {"claimName": "hf-cache"}},
    ),
    (
        "pvc",
        {"pvc": {"claimName": "llama-70b", "subPath": "llama-3.3-70b"}},
        {"persistentVolumeClaim": {"claimName": "llama-70b", "readOnly": True}},
    ),
    (
        "hostPath",
        {"hostPath": {"path": "/mnt/models/llama-70b"}},
        {"hostPath": {"path": "/mnt/models/llama-70b", "type": "Directory"}},
    ),
    (
        "image",
        {"image": {"reference": f"registry.example.com/models/llama{DIGEST}"}},
        {"image": {"reference": f"registry.example.com/models/llama{DIGEST}"}},
    ),
    (
        "image with pull policy",
        {"image": {"reference": "registry.example.com/m:v1", "pullPolicy": "IfNotPresent"}},
        {"image": {"reference": "registry.example.com/m:v1", "pullPolicy": "IfNotPresent"}},
    ),
]

# (id, source, engine type, the mount, env the engine must get, env it must not get,
#  startup probe failureThreshold at the adapters' 10 s period)
HF_HOME = "/models/hf-cache"
MODEL_DIR = "/models/model"
OFFLINE = {"HF_HUB_OFFLINE": "1"}
TOKEN_ENV = {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
PODS: list[
    tuple[str, dict[str, Any] | None, str, dict[str, Any], dict[str, Any], set[str], int]
] = [
    (
        "default vllm",
        None,
        "vllm",
        {"mountPath": HF_HOME},
        {"HF_HOME": HF_HOME},
        {"HF_TOKEN", "HF_HUB_OFFLINE"},
        360,
    ),
    (
        "hf token sglang",
        {"huggingFace": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}},
        "sglang",
        {"mountPath": HF_HOME},
        {"HF_HOME": HF_HOME, "HF_TOKEN": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
        {"HF_HUB_OFFLINE"},
        360,
    ),
    (
        "hf cache vllm",
        {"huggingFace": {**TOKEN, "cache": {"claimName": "hf-cache"}}},
        "vllm",
        {"mountPath": HF_HOME},
        {"HF_HOME": HF_HOME, "HF_TOKEN": TOKEN_ENV},
        {"HF_HUB_OFFLINE"},
        360,
    ),
    (
        "pvc vllm",
        {"pvc": {"claimName": "llama-70b", "subPath": "llama-3.3-70b"}},
        "vllm",
        {"mountPath": MODEL_DIR, "readOnly": True, "subPath": "llama-3.3-70b"},
        OFFLINE,
        {"HF_TOKEN", "HF_HOME"},
        180,
    ),
    (
        "pvc sglang",
        {"pvc": {"claimName": "llama-70b"}},
        "sglang",
        {"mountPath": MODEL_DIR, "readOnly": True},
        OFFLINE,
        {"HF_TOKEN", "HF_HOME"},
        180,
    ),
    (
        "hostPath sglang",
        {"hostPath": {"path": "/mnt/models/llama-70b"}},
        "sglang",
        {"mountPath": MODEL_DIR, "readOnly": True},
        OFFLINE,
        {"HF_TOKEN", "HF_HOME"},
        120,
    ),
    (
        "image vllm",
        {"image": {"reference": "registry.example.com/m:v1", "subPath": "models"}},
        "vllm",
        {"mountPath": MODEL_DIR, "readOnly": True, "subPath": "models"},
        OFFLINE,
        {"HF_TOKEN", "HF_HOME"},
        120,
    ),
]


def pdd_with(source: dict[str, Any] | None, engine: str = "vllm", **model: Any) -> Any:
    spec_model: dict[str, Any] = {"name": MODEL, **model}
    if source is not None:
        spec_model["source"] = source
    return make_pdd({"model": spec_model, "engine": {"type": engine}})


def pod_spec(pdd: Any, role: str = "decode") -> dict[str, Any]:
    objs = render_children(pdd, RenderContext())
    sts = next(
        o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"llama-{role}"
    )
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def engine(spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == "engine")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    ("source", "volume"), [(s, v) for _, s, v in VOLUMES], ids=[i for i, *_ in VOLUMES]
)
def test_the_model_volume_follows_the_source(
    source: dict[str, Any] | None, volume: dict[str, Any]
) -> None:
    volumes = {v["name"]: v for v in pod_spec(pdd_with(source))["volumes"]}
    assert volumes["model"] == {"name": "model", **volume}


@pytest.mark.parametrize(
    ("source", "engine_type", "mount", "env", "absent", "threshold"),
    [p[1:] for p in PODS],
    ids=[p[0] for p in PODS],
)
def test_the_engine_container_mounts_the_model_and_gets_its_environment(
    source: dict[str, Any] | None,
    engine_type: str,
    mount: dict[str, Any],
    env: dict[str, Any],
    absent: set[str],
    threshold: int,
) -> None:
    container = engine(pod_spec(pdd_with(source, engine_type)))
    mounts = [m for m in container["volumeMounts"] if m["name"] == "model"]
    assert mounts == [{"name": "model", **mount}]
    rendered = env_of(container)
    for name, value in env.items():
        assert rendered[name] == value, name
    assert not absent & rendered.keys()
    assert container["startupProbe"]["failureThreshold"] == threshold
    assert container["startupProbe"]["periodSeconds"] == 10


# (id, source, engine, the model argument, flags that must follow it as pairs)
ARGS: list[tuple[str, dict[str, Any] | None, str, str, dict[str, str]]] = [
    ("vllm download", None, "vllm", MODEL, {}),
    (
        "vllm revision",
        {"huggingFace": {"revision": "0cb88a4f764b7a12671c53f0838cd831a0843b95"}},
        "vllm",
        MODEL,
        {"--revision": "0cb88a4f764b7a12671c53f0838cd831a0843b95"},
    ),
    ("vllm pvc", {"pvc": {"claimName": "m"}}, "vllm", MODEL_DIR, {"--served-model-name": MODEL}),
    (
        "sglang revision",
        {"huggingFace": {"revision": "main"}},
        "sglang",
        MODEL,
        {"--revision": "main"},
    ),
    (
        "sglang hostPath",
        {"hostPath": {"path": "/mnt/m"}},
        "sglang",
        MODEL_DIR,
        {"--served-model-name": MODEL},
    ),
]


@pytest.mark.parametrize(
    ("source", "engine_type", "model_arg", "flags"),
    [a[1:] for a in ARGS],
    ids=[a[0] for a in ARGS],
)
def test_the_engine_is_told_the_model_its_way(
    source: dict[str, Any] | None, engine_type: str, model_arg: str, flags: dict[str, str]
) -> None:
    args = engine(pod_spec(pdd_with(source, engine_type)))["args"]
    if engine_type == "vllm":
        assert args[:3] == ["vllm", "serve", model_arg]  # vllm serve's positional model
    else:
        assert args[args.index("--model-path") + 1] == model_arg
    for flag, value in flags.items():
        assert args[args.index(flag) + 1] == value
    if not flags:
        assert "--revision" not in args and "--served-model-name" not in args


def test_a_served_name_wins_over_the_name_for_a_local_model() -> None:
    args = engine(pod_spec(pdd_with({"pvc": {"claimName": "m"}}, servedName="llama")))["args"]
    assert args[args.index("--served-model-name") + 1] == "llama"
    assert args.count("--served-model-name") == 1


def test_a_custom_engine_is_told_the_directory_of_a_local_model() -> None:
    pdd = make_pdd(
        {
            "model": {"name": MODEL, "source": {"hostPath": {"path": "/mnt/m"}}},
            "engine": {"type": "custom", "command": ["my-engine"]},
            "router": {"enabled": False},
            "kvTransfer": {"metadataExchange": {"mode": "sidecar"}},
        }
    )
    assert env_of(engine(pod_spec(pdd)))["PDD_MODEL"] == MODEL_DIR


@pytest.mark.parametrize(
    ("source", "budget_s"), [(None, 3600), ({"pvc": {"claimName": "m"}}, 1800)]
)
def test_an_explicit_startup_timeout_wins_over_the_source(
    source: dict[str, Any] | None, budget_s: int
) -> None:
    assert engine(pod_spec(pdd_with(source)))["startupProbe"]["failureThreshold"] == budget_s // 10
    pdd = make_pdd(
        {
            "model": {"name": MODEL, **({"source": source} if source else {})},
            "engine": {"startupTimeoutSeconds": 7205},
        }
    )
    assert engine(pod_spec(pdd))["startupProbe"]["failureThreshold"] == 721  # rounded up


def test_user_env_overrides_the_rendered_hugging_face_environment() -> None:
    pdd = make_pdd(
        {
            "model": {"name": MODEL, "source": {"pvc": {"claimName": "m"}}},
            "engine": {"env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]},
        }
    )
    assert env_of(engine(pod_spec(pdd)))["HF_HUB_OFFLINE"] == "0"


def test_the_token_never_appears_as_a_value() -> None:
    """Only a reference to the Secret is rendered: the operator never has the token."""
    container = engine(pod_spec(pdd_with({"huggingFace": TOKEN})))
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert "value" not in token


def test_the_model_source_is_part_of_the_engine_revision() -> None:
    from pdd_operator.rendering.roles import engine_revision

    revisions = {engine_revision(pdd_with(s).spec) for _, s, _ in VOLUMES}
    # default and `huggingFace: {tokenSecretRef}` differ too: all seven are distinct
    assert len(revisions) == len(VOLUMES)


@pytest.mark.parametrize(
    "source",
    [
        {},
        {"huggingFace": {}, "pvc": {"claimName": "m"}},
        {"hostPath": {"path": "/m"}, "image": {"reference": "m:v1"}},
    ],
    ids=["none", "huggingFace and pvc", "hostPath and image"],
)
def test_exactly_one_source_is_accepted_by_the_models(source: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="set exactly one of huggingFace, pvc, hostPath"):
        pdd_with(source)


def test_no_source_means_a_hugging_face_download_as_before() -> None:
    pdd = pdd_with(None)
    assert pdd.spec.model.source is None
    assert pdd.spec.model.source_or_default.kind == "huggingFace"
    assert pdd_with({"huggingFace": {}}).spec.model.source_or_default.kind == "huggingFace"
