"""The one sample PDDeployment of the test suite, as a model (`make_pdd`) or as the raw object
an API client sends (`pdd_body`). A test that needs something else patches the sample."""

from __future__ import annotations

import copy
from typing import Any

from pdd_operator.api.v1alpha1 import API_VERSION, KIND, PDDeployment

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


def sample_spec(spec_patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of the sample spec with `spec_patch` applied: a dict value is merged into the
    sample's dict of that name (one level deep), anything else replaces the field."""
    spec: dict[str, Any] = copy.deepcopy(BASE_BODY["spec"])
    for key, value in copy.deepcopy(spec_patch or {}).items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def make_pdd(spec_patch: dict[str, Any] | None = None, **meta: Any) -> PDDeployment:
    body = copy.deepcopy(BASE_BODY)
    body["metadata"].update(meta)
    body["spec"] = sample_spec(spec_patch)
    return PDDeployment.from_body(body)


def pdd_body(name: str, namespace: str, **spec_patch: Any) -> dict[str, Any]:
    """The sample as a new object for the API server: no uid or generation (the server sets
    them); `spec_patch` as in `sample_spec`."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": sample_spec(spec_patch),
    }
