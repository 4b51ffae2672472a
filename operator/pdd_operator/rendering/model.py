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
from pdd_operator.api.v1alpha1 import ModelSource, PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter, HealthCheck

MODEL_VOLUME = "model"

# Seconds the engine may take to become healthy, by source: a download of a 70B model
# (~140 GB) at a few hundred MB/s takes 10-20 minutes before loading starts; a network
# volume streams it in a few; a node-local disk or an image the kubelet already pulled
# (before the container starts) leaves loading and CUDA-graph capture.
STARTUP_BUDGET_S = {"huggingFace": 3600, "pvc": 1800, "hostPath": 1200, "image": 1200}


def model_volumes(spec: PDDeploymentSpec) -> list[dict[str, Any]]:
    source = spec.model.source_or_default
    return [{"name": MODEL_VOLUME, **_volume_source(source)}]


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
    source = spec.model.source_or_default
    if source.huggingFace is not None:
        return [{"name": MODEL_VOLUME, "mountPath": adapter.hf_home}]
    mount: dict[str, Any] = {"name": MODEL_VOLUME, "mountPath": adapter.model_dir, "readOnly": True}
    sub_path = source.pvc.subPath if source.pvc else source.image.subPath if source.image else None
    if sub_path:
        mount["subPath"] = sub_path
    return [mount]


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
