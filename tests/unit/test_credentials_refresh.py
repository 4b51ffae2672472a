"""The credentials refresh hook the client library calls before every request runs at most
once per period (a kubeconfig's hook re-copies its whole configuration each time), also when
the library's loaders install a new hook each time theirs runs."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import yaml
from kubernetes import client, config

from pdd_operator.kube.client import RefreshLimitedConfiguration


def test_the_refresh_hook_runs_at_most_once_per_period() -> None:
    configuration = RefreshLimitedConfiguration()
    configuration.api_key = {"BearerToken": "old"}
    configuration.refresh_every_s = 0.5
    calls: list[float] = []
    now = [100.0]
    configuration.clock = lambda: now[0]

    def hook(conf: client.Configuration) -> None:
        calls.append(now[0])
        conf.api_key["BearerToken"] = f"token-{len(calls)}"

    configuration.refresh_api_key_hook = hook

    assert configuration.get_api_key_with_prefix("BearerToken") == "token-1"
    now[0] += 0.4
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-1"
    now[0] += 0.2
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-2"
    assert len(calls) == 2


def test_keys_and_prefixes_read_as_the_client_library_reads_them() -> None:
    configuration = RefreshLimitedConfiguration()
    configuration.refresh_api_key_hook = None
    configuration.api_key = {"BearerToken": "abc", "other": "xyz"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer abc"
    assert configuration.get_api_key_with_prefix("missing", alias="other") == "xyz"
    assert configuration.get_api_key_with_prefix("missing") is None


class CountingConfiguration(RefreshLimitedConfiguration):
    """Counts how often its host is set: a kubeconfig's refresh hook sets it every run."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "host":
            self.__dict__["hosts_set"] = self.__dict__.get("hosts_set", 0) + 1
        super().__setattr__(name, value)


def kubeconfig_with_token(tmp_path: Path) -> str:
    path = tmp_path / "config"
    path.write_text(
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
    return str(path)


def test_a_kubeconfig_hook_that_installs_itself_again_stays_limited(tmp_path: Path) -> None:
    """The client library's kubeconfig loader puts a new hook in place every time its hook
    runs; the limit must hold for every request, not the first one only."""
    configuration = CountingConfiguration()
    now = [100.0]
    configuration.clock = lambda: now[0]
    config.load_kube_config(
        config_file=kubeconfig_with_token(tmp_path), client_configuration=configuration
    )
    loaded = configuration.__dict__["hosts_set"]

    for _ in range(20):
        assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer secret-token"
    assert configuration.__dict__["hosts_set"] == loaded + 1
    now[0] += 0.6
    for _ in range(20):
        configuration.get_api_key_with_prefix("BearerToken")
    assert configuration.__dict__["hosts_set"] == loaded + 2


def test_requests_racing_from_many_threads_refresh_once_per_period(tmp_path: Path) -> None:
    configuration = CountingConfiguration()
    configuration.clock = lambda: 100.0
    config.load_kube_config(
        config_file=kubeconfig_with_token(tmp_path), client_configuration=configuration
    )
    loaded = configuration.__dict__["hosts_set"]
    start = threading.Barrier(16)

    def requests() -> None:
        start.wait()
        for _ in range(200):
            configuration.get_api_key_with_prefix("BearerToken")

    threads = [threading.Thread(target=requests) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert configuration.__dict__["hosts_set"] == loaded + 1


def test_a_copy_of_the_configuration_is_limited_too(tmp_path: Path) -> None:
    """The client library deep-copies configurations (Configuration.get_default_copy)."""
    configuration = CountingConfiguration()
    config.load_kube_config(
        config_file=kubeconfig_with_token(tmp_path), client_configuration=configuration
    )
    copied = copy.deepcopy(configuration)
    assert isinstance(copied, RefreshLimitedConfiguration)
    assert copied.get_api_key_with_prefix("BearerToken") == "Bearer secret-token"
