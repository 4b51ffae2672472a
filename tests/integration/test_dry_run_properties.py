"""Property test against the real API server: every generated valid spec is admitted by the
CRD (CEL included), and every child rendered from it passes server-side dry-run apply and
reads back with the owned-fields digest of its render (else the drift check would see drift
in every undrifted child of that shape)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import install_crd
from helpers.specs import names, valid_specs
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.client import KubeApi
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.status.drift import live_fingerprint, rendered_fingerprint

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


@pytest.fixture(scope="module")
def crd(api_client: client.ApiClient) -> None:
    install_crd(api_client)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=names, spec=valid_specs())
def test_every_valid_spec_is_admitted_and_its_children_pass_dry_run(
    crd: None, api_client: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]
) -> None:
    body = {**pdd_body(name, namespace), "spec": spec}
    admitted = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict"
    )
    admitted["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000000")
    admitted["metadata"].setdefault("generation", 1)
    pdd = PDDeployment.from_body(admitted)  # the server's defaults filled in
    kube = KubeApi(api_client)
    for child in render_children(pdd, RenderContext()):
        live = kube.apply(child, dry_run=True)
        assert live_fingerprint(live, kube.field_manager) == rendered_fingerprint(child), (
            f"{child['kind']} {child['metadata']['name']}: the server reads back owned "
            "fields in a spelling status.drift does not know"
        )
