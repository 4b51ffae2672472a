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


# The smallest deployment the simulated fleet runs anywhere: one 1-GPU instance per role, no
# router, no topology placement.
SMALL_PATCH: dict[str, Any] = {
    "router": {"enabled": False},
    "prefill": {"replicas": 1, "gpusPerInstance": 1},
    "decode": {"replicas": 1, "gpusPerInstance": 1},
    "topology": {"placement": "none"},
}


def sample_spec(spec_patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of the sample spec with `spec_patch` applied: a dict value is merged into the
    sample's dict of that name (one level deep), anything else replaces the field."""
    return _patched(BASE_BODY["spec"], spec_patch or {})


def _patched(spec: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = copy.deepcopy(spec)
    for key, value in copy.deepcopy(patch).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


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


def small_pdd_body(name: str, namespace: str, **spec_patch: Any) -> dict[str, Any]:
    """`pdd_body` of the small deployment (SMALL_PATCH), with `spec_patch` merged into it the
    same way."""
    return pdd_body(name, namespace, **_patched(SMALL_PATCH, spec_patch))
