"""Only the containers that call the Kubernetes API hold the pod's ServiceAccount token: the
sidecar, never the engine (model code) or the preflight. The API server's side of it (its
ServiceAccount admission mounts nothing more) is proved in tests/chart/test_least_privilege.py."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.rendering.access import API_ACCESS_VOLUME, SERVICE_ACCOUNT_DIR
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.roles import render_pod_template


def credential_mounts(template: dict[str, Any]) -> dict[str, list[str]]:
    spec = template["spec"]
    return {
        c["name"]: [
            m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == SERVICE_ACCOUNT_DIR
        ]
        for c in spec.get("initContainers", []) + spec["containers"]
    }


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_sidecar_alone_mounts_the_token(role: str) -> None:
    template = render_pod_template(make_pdd(), role, RenderContext())
    assert template["spec"]["automountServiceAccountToken"] is False
    assert credential_mounts(template) == {
        "preflight": [],
        "engine": [],
        "nixl-sidecar": [API_ACCESS_VOLUME],
    }
    [volume] = [v for v in template["spec"]["volumes"] if v["name"] == API_ACCESS_VOLUME]
    kinds = [next(iter(source)) for source in volume["projected"]["sources"]]
    assert kinds == ["serviceAccountToken", "configMap", "downwardAPI"]


def test_without_a_sidecar_no_container_gets_a_token() -> None:
    pdd = make_pdd({"kvTransfer": {"metadataExchange": {"mode": "engine"}}})
    template = render_pod_template(pdd, "prefill", RenderContext())
    assert template["spec"]["automountServiceAccountToken"] is False
    assert all(mounts == [] for mounts in credential_mounts(template).values())
    assert API_ACCESS_VOLUME not in [v["name"] for v in template["spec"]["volumes"]]


def test_a_pod_template_cannot_turn_automounting_back_on() -> None:
    """The account is the sidecar's: a podTemplate that asks for the token in every container
    (the engine's included) does not get it."""
    pdd = make_pdd({"prefill": {"podTemplate": {"spec": {"automountServiceAccountToken": True}}}})
    template = render_pod_template(pdd, "prefill", RenderContext())
    assert template["spec"]["automountServiceAccountToken"] is False
