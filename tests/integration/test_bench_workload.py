"""The benchmark's deployments are ones the API server admits: a shape the CRD refuses (its CEL
rules change) would silently drop out of every run as an apply error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kubernetes import client

from helpers.operator_proc import install_crd
from pdd_operator.kube.client import KubeApi

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from pddbench.workload import SCALE_MIX, Shape, pdd_body


@pytest.mark.parametrize("shape", SCALE_MIX, ids=lambda s: s.name)
@pytest.mark.parametrize("placement", ["preferred", "none"])
def test_every_shape_of_the_bench_is_admitted(
    api_client: client.ApiClient, namespace: str, shape: Shape, placement: str
) -> None:
    install_crd(api_client)
    body = pdd_body("bench-shape", namespace, shape, placement)
    admitted = KubeApi(api_client).apply(body, dry_run=True)
    assert admitted["spec"]["prefill"]["replicas"] == shape.prefill
