from __future__ import annotations

import copy
from typing import Any

from pdd_operator.api.v1alpha1 import PDDeployment

BASE_BODY: dict[str, Any] = {
    "metadata": {"name": "llama", "namespace": "team-a", "uid": "uid-1", "generation": 3},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "router": {"image": "ghcr.io/llm-d/router:v1"},
        "prefill": {"replicas": 2, "gpusPerInstance": 2},
        "decode": {"replicas": 4, "gpusPerInstance": 2},
    },
}


def make_pdd(spec_patch: dict[str, Any] | None = None, **meta: Any) -> PDDeployment:
    body = copy.deepcopy(BASE_BODY)
    body["metadata"].update(meta)
    for key, value in (spec_patch or {}).items():
        if isinstance(value, dict) and isinstance(body["spec"].get(key), dict):
            body["spec"][key] = {**body["spec"][key], **value}
        else:
            body["spec"][key] = value
    return PDDeployment.from_body(body)
