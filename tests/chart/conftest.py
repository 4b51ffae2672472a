"""The chart tier: the pinned helm and one real control plane (etcd + kube-apiserver, and a
controller-manager for ServiceAccounts) shared by this directory's tests.

Self-contained on purpose (it does not use tests/integration's fixtures): the control plane is
package-scoped, so it stops when the chart tests are done instead of living on beside the
integration tier's own for the rest of `make test`. No scheduler and no simulated nodes: the
chart tests check what the API server accepts and what the operator is allowed to do, not pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient

from pdd_localcluster import LocalControlPlane
from pdd_localcluster.controlplane import resolve_bin_dir

from .support import Helm


@pytest.fixture(scope="package")
def helm_binary() -> Path:
    return resolve_bin_dir() / "helm"


@pytest.fixture(scope="package")
def helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm without a cluster (lint, template)."""
    return Helm(helm_binary, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="package")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalControlPlane]:
    state = tmp_path_factory.mktemp("chart-controlplane")
    # The ServiceAccount controllers (the ServiceAccounts' tokens are what the RBAC proof runs
    # with) and ClusterRole aggregation (the chart's user roles join admin/edit/view). Nothing
    # here needs pods scheduled or garbage collected.
    cp = LocalControlPlane(
        state,
        controllers=(
            "serviceaccount-controller",
            "serviceaccount-token-controller",
            "clusterrole-aggregation-controller",
        ),
        scheduler=False,
    )
    with cp:
        yield cp


@pytest.fixture(scope="package")
def api_client(control_plane: LocalControlPlane) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="package")
def cluster_helm(
    helm_binary: Path, control_plane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Helm:
    """helm against the control plane, as its admin."""
    return Helm(helm_binary, tmp_path_factory.mktemp("helm-home"), control_plane.kubeconfig)


@pytest.fixture(scope="package")
def dynamic(api_client: client.ApiClient) -> DynamicClient:
    return DynamicClient(api_client)
