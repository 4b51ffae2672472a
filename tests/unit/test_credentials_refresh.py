"""The credentials refresh hook the client library calls before every request runs at most
once per period (a kubeconfig's hook re-copies its whole configuration each time)."""

from __future__ import annotations

from kubernetes import client

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
