"""Where the engine finds its model: the volume, its mount, the Hugging Face environment and
how long the engine may take to start, per ``spec.model.source`` (docs/model-storage.md).

A volume source (pvc, hostPath, image) is mounted read-only at the adapter's ``model_dir``
and the Hub is switched off (HF_HUB_OFFLINE): a missing file is an error, not a silent
140 GB download into the container's layer. A Hugging Face download is cached at the
adapter's ``hf_home``: an emptyDir per pod, or one claim shared by all pods.
"""

from __future__ import annotations

import math
from typing import Any

from pdd_contract.env import HF_HOME, HF_HUB_OFFLINE, HF_TOKEN
from pdd_operator.api.v1alpha1 import AdapterSource, LoraAdapter, ModelSource, PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter, HealthCheck

MODEL_VOLUME = "model"
ADAPTER_VOLUME_PREFIX = "lora-"  # lora-0, lora-1, ...: by the adapter's place in the list

# Seconds the engine may take to become healthy, by source: a download of a 70B model
# (~140 GB) at a few hundred MB/s takes 10-20 minutes before loading starts; a network
# volume streams it in a few; a node-local disk or an image the kubelet already pulled
# (before the container starts) leaves loading and CUDA-graph capture.
STARTUP_BUDGET_S = {"huggingFace": 3600, "pvc": 1800, "hostPath": 1200, "image": 1200}


def model_volumes(spec: PDDeploymentSpec) -> list[dict[str, Any]]:
    """The model's volume, then one per claim or image that holds LoRA adapters and is not
    the model's own (a Hub adapter is downloaded into the model's cache)."""
    source = spec.model.source_or_default
    adapters: dict[str, dict[str, Any]] = {}
    for _, lora in _volume_adapters(spec):
        name = _adapter_volume(spec, lora)
        if name != MODEL_VOLUME:
            adapters[name] = {"name": name, **_adapter_volume_source(lora.source)}
    return [{"name": MODEL_VOLUME, **_volume_source(source)}, *adapters.values()]


def _volume_adapters(spec: PDDeploymentSpec) -> list[tuple[int, LoraAdapter]]:
    return [(i, a) for i, a in enumerate(spec.model.adapters) if a.source.huggingFace is None]


def _adapter_volume(spec: PDDeploymentSpec, adapter: LoraAdapter) -> str:
    """The model's volume where the adapter is on the model's claim or image; else one
    volume per claim or image, named by the first adapter on it (adapters in subdirectories
    of one claim share it, each mounted with its own subPath)."""
    key = _source_key(adapter.source)
    if key == _source_key(spec.model.source_or_default):
        return MODEL_VOLUME
    first = next(i for i, a in _volume_adapters(spec) if _source_key(a.source) == key)
    return f"{ADAPTER_VOLUME_PREFIX}{first}"


def _source_key(source: AdapterSource | ModelSource) -> tuple[str, str]:
    if source.pvc is not None:
        return ("pvc", source.pvc.claimName)
    if source.image is not None:
        return ("image", source.image.reference)
    return ("", "")  # the Hub: no volume of its own


def _adapter_volume_source(source: AdapterSource) -> dict[str, Any]:
    if source.pvc is not None:
        return {"persistentVolumeClaim": {"claimName": source.pvc.claimName, "readOnly": True}}
    assert source.image is not None, "a Hub adapter has no volume"
    image: dict[str, Any] = {"reference": source.image.reference}
    if source.image.pullPolicy:
        image["pullPolicy"] = source.image.pullPolicy
    return {"image": image}


def _volume_source(source: ModelSource) -> dict[str, Any]:
    if source.pvc is not None:
        return {"persistentVolumeClaim": {"claimName": source.pvc.claimName, "readOnly": True}}
    if source.hostPath is not None:
        return {"hostPath": {"path": source.hostPath.path, "type": "Directory"}}
    if source.image is not None:
        image: dict[str, Any] = {"reference": source.image.reference}
        if source.image.pullPolicy:
            image["pullPolicy"] = source.image.pullPolicy
        return {"image": image}
    hf = source.huggingFace
    if hf is not None and hf.cache is not None:
        return {"persistentVolumeClaim": {"claimName": hf.cache.claimName}}
    return {"emptyDir": {}}


def model_mounts(spec: PDDeploymentSpec, adapter: EngineAdapter) -> list[dict[str, Any]]:
    return [_model_mount(spec, adapter), *_adapter_mounts(spec, adapter)]


def _model_mount(spec: PDDeploymentSpec, adapter: EngineAdapter) -> dict[str, Any]:
    source = spec.model.source_or_default
    if source.huggingFace is not None:
        return {"name": MODEL_VOLUME, "mountPath": adapter.hf_home}
    sub_path = source.pvc.subPath if source.pvc else source.image.subPath if source.image else None
    return _read_only_mount(MODEL_VOLUME, adapter.model_dir, sub_path)


def _adapter_mounts(spec: PDDeploymentSpec, adapter: EngineAdapter) -> list[dict[str, Any]]:
    """Each adapter on a volume, read-only where the engine's flags say it is
    (EngineAdapter.adapter_location)."""
    mounts = []
    for _, lora in _volume_adapters(spec):
        source = lora.source.pvc or lora.source.image
        assert source is not None
        where = adapter.adapter_location(lora)
        mounts.append(_read_only_mount(_adapter_volume(spec, lora), where, source.subPath))
    return mounts


def _read_only_mount(volume: str, path: str, sub_path: str | None) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": volume, "mountPath": path, "readOnly": True}
    if sub_path:
        mount["subPath"] = sub_path
    return mount


def model_env(spec: PDDeploymentSpec, adapter: EngineAdapter) -> list[dict[str, Any]]:
    """HF_HOME and the token for a download (the token straight from the Secret: the
    operator never holds it); the Hub switched off for a model on a volume."""
    hf = spec.model.source_or_default.huggingFace
    if hf is None:
        return [{"name": HF_HUB_OFFLINE, "value": "1"}]
    env: list[dict[str, Any]] = [{"name": HF_HOME, "value": adapter.hf_home}]
    if hf.tokenSecretRef is not None:
        ref = {"name": hf.tokenSecretRef.name, "key": hf.tokenSecretRef.key}
        env.append({"name": HF_TOKEN, "valueFrom": {"secretKeyRef": ref}})
    return env


def startup_budget_seconds(spec: PDDeploymentSpec) -> int:
    """spec.engine.startupTimeoutSeconds, else what the model's source needs."""
    if spec.engine.startupTimeoutSeconds is not None:
        return spec.engine.startupTimeoutSeconds
    return STARTUP_BUDGET_S[spec.model.source_or_default.kind]


def startup_failure_threshold(spec: PDDeploymentSpec, health: HealthCheck) -> int:
    """Periods of the startup probe: the budget (rounded up), unless the adapter fixes it
    and the spec does not."""
    if health.startup_failure_threshold is not None and spec.engine.startupTimeoutSeconds is None:
        return health.startup_failure_threshold
    return math.ceil(startup_budget_seconds(spec) / health.period_s)
