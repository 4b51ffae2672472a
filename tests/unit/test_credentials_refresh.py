"""The credentials refresh hook the client library calls before every request runs at most
once per period (a kubeconfig's hook re-copies its whole configuration each time)."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client, config

from pdd_operator.kube.client import refresh_at_most_every


def test_the_refresh_hook_runs_at_most_once_per_period() -> None:
    configuration = client.Configuration()
    configuration.api_key = {"BearerToken": "old"}
    calls: list[float] = []
    now = [100.0]

    def hook(conf: client.Configuration) -> None:
        calls.append(now[0])
        conf.api_key["BearerToken"] = f"token-{len(calls)}"

    configuration.refresh_api_key_hook = hook
    refresh_at_most_every(configuration, 0.5, clock=lambda: now[0])

    assert configuration.get_api_key_with_prefix("BearerToken") == "token-1"
    now[0] += 0.4
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-1"
    now[0] += 0.2
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-2"
    assert len(calls) == 2


def test_a_configuration_without_a_hook_is_left_as_it_is() -> None:
    configuration = client.Configuration()
    configuration.refresh_api_key_hook = None
    refresh_at_most_every(configuration, 0.5)
    assert configuration.refresh_api_key_hook is None


class CountingConfiguration(client.Configuration):
    """Counts how often its host is set: a kubeconfig's refresh hook sets it every run."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts_set = 0

    def __setattr__(self, name: str, value: object) -> None:
        if name == "host":
            self.__dict__["hosts_set"] = self.__dict__.get("hosts_set", 0) + 1
        super().__setattr__(name, value)


def test_a_kubeconfig_hook_that_installs_itself_again_stays_limited(tmp_path: Path) -> None:
    """The client library's kubeconfig loader puts a new hook in place every time its hook
    runs; the limit must survive that, or it holds for the first request only."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    configuration = CountingConfiguration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    now = [100.0]
    refresh_at_most_every(configuration, 0.5, clock=lambda: now[0])
    loaded = configuration.hosts_set

    for _ in range(20):
        assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer secret-token"
    assert configuration.hosts_set == loaded + 1
    now[0] += 0.6
    for _ in range(20):
        configuration.get_api_key_with_prefix("BearerToken")
    assert configuration.hosts_set == loaded + 2
