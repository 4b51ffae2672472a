"""Conflicts and server errors are retried with growing, jittered delays; others are not."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from pdd_operator.kube import client as kube_client


class Flaky:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.statuses:
            raise ApiException(status=self.statuses.pop(0))
        return "ok"


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    recorded: list[float] = []
    monkeypatch.setattr(kube_client.time, "sleep", recorded.append)
    return recorded


@pytest.mark.parametrize("status", [409, 429, 500, 503, 504])
def test_retryable_answers_are_retried_with_backoff(status: int, sleeps: list[float]) -> None:
    call = Flaky([status, status, status])
    assert kube_client._retry(call, base_delay=0.2) == "ok"
    assert call.calls == 4
    assert len(sleeps) == 3
    # exponential with jitter in [0.5, 1.5): attempt n waits 0.2 * 2**n * jitter
    for attempt, delay in enumerate(sleeps):
        assert 0.1 * 2**attempt <= delay < 0.3 * 2**attempt


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_client_errors_are_not_retried(status: int, sleeps: list[float]) -> None:
    call = Flaky([status])
    with pytest.raises(ApiException):
        kube_client._retry(call)
    assert call.calls == 1 and sleeps == []


def test_gives_up_after_the_last_attempt(sleeps: list[float]) -> None:
    call = Flaky([503] * 10)
    with pytest.raises(ApiException):
        kube_client._retry(call, attempts=5)
    assert call.calls == 5 and len(sleeps) == 4
    assert max(sleeps) <= 5.0 * 1.5  # capped, never a hot loop and never unbounded


def test_a_user_facing_message_comes_from_the_server_not_a_trace() -> None:
    err = ApiException(status=403)
    err.body = '{"message": "statefulsets.apps is forbidden: User \\"x\\" cannot create"}'
    assert kube_client.api_error_message(err).startswith("statefulsets.apps is forbidden")
