"""pdd_kubeconfig: the one rule every process of the project finds the API server by (the
operator, the sidecar and the node agent all call it), with the client library's real loaders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.config import incluster_config, kube_config

from pdd_kubeconfig import core_v1_api, load_configuration


def kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / f"kubeconfig-{server.rsplit(':', 1)[-1]}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def default_kubeconfig(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """The client library reads KUBECONFIG once, at import: its default is set here instead."""
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", path)


@pytest.fixture
def in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the kubelet gives a pod: the service's address and the ServiceAccount's files."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("pod-token")
    ca.write_text("not checked until a connection is made")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")


def test_a_given_kubeconfig_wins_even_in_a_pod(
    in_a_pod: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default_kubeconfig(monkeypatch, kubeconfig(tmp_path, "https://127.0.0.1:7001"))
    given = kubeconfig(tmp_path, "https://127.0.0.1:7002")
    assert load_configuration(given).host == "https://127.0.0.1:7002"


def test_in_a_pod_without_one_the_service_account_is_used(
    in_a_pod: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default_kubeconfig(monkeypatch, kubeconfig(tmp_path, "https://127.0.0.1:7001"))
    configuration = load_configuration()
    assert configuration.host == "https://10.96.0.1:443"
    assert (
        configuration.get_api_key_with_prefix("BearerToken") == "bearer pod-token"
    )  # the loader writes it so


def test_outside_a_pod_the_default_kubeconfig_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    default_kubeconfig(monkeypatch, kubeconfig(tmp_path, "https://127.0.0.1:7001"))
    assert load_configuration().host == "https://127.0.0.1:7001"
    assert core_v1_api().api_client.configuration.host == "https://127.0.0.1:7001"


def test_the_callers_configuration_is_the_one_filled(tmp_path: Path) -> None:
    """The operator passes its refresh-limited configuration: the loader must fill that one,
    not a fresh one, or the limit would not apply."""
    from pdd_operator.kube.client import RefreshLimitedConfiguration
    from pdd_operator.kube.client import load_configuration as op

    mine = RefreshLimitedConfiguration()
    assert load_configuration(kubeconfig(tmp_path, "https://127.0.0.1:7003"), mine) is mine
    assert isinstance(
        op(kubeconfig(tmp_path, "https://127.0.0.1:7004")), RefreshLimitedConfiguration
    )
