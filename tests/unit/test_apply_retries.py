"""Stalled only where waiting cannot help: a write of the children that failed in a way time
may cure (a 429, a 5xx, a webhook the API server could not call, no answer at all) is
Reconciling=True (ApplyRetrying) and retried with backoff; one refused until someone acts
(422 Invalid, 403 Forbidden, 409 AlreadyExists) is Stalled=True (ApplyFailed)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from helpers.factories import BASE_BODY, make_pdd
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator import reconcile
from pdd_operator.kube.client import transient
from pdd_operator.reconcile import Reconciler
from pdd_operator.status.compute import Observed, WorkloadState, compute_status

KEY = ("team-a", "llama")
NOW = "2026-01-01T00:00:00Z"


def status_error(code: int, reason: str, message: str) -> ApiException:
    err = ApiException(status=code, reason=reason)
    body = {"kind": "Status", "status": "Failure", "message": message, "reason": reason}
    err.body = json.dumps({**body, "code": code})
    return err


# What kube-apiserver answers when a webhook with failurePolicy Fail cannot be called.
WEBHOOK_DOWN = status_error(
    500,
    "InternalError",
    'Internal error occurred: failed calling webhook "deny.example.com": failed to call '
    'webhook: Post "https://127.0.0.1:1/validate?timeout=1s": dial tcp 127.0.0.1:1: '
    "connect: connection refused",
)
WEBHOOK_TIMEOUT = status_error(
    500,
    "InternalError",
    'Internal error occurred: failed calling webhook "slow.example.com": failed to call '
    'webhook: Post "https://slow.example.com/validate?timeout=10s": context deadline exceeded',
)
INVALID = status_error(
    422, "Invalid", 'StatefulSet.apps "llama-prefill" is invalid: spec.template: Required value'
)
QUOTA = status_error(
    403,
    "Forbidden",
    'services "llama-router" is forbidden: exceeded quota: q, requested: services=1',
)

CASES: list[tuple[str, BaseException, bool]] = [
    ("429 too many requests", status_error(429, "TooManyRequests", "rate limited"), True),
    ("500 webhook unreachable", WEBHOOK_DOWN, True),
    ("500 webhook timed out", WEBHOOK_TIMEOUT, True),
    ("503 aggregated API down", status_error(503, "ServiceUnavailable", "unavailable"), True),
    ("504 server timeout", status_error(504, "Timeout", "the server was unable to answer"), True),
    ("408 request timeout", status_error(408, "Timeout", "request timeout"), True),
    ("409 someone wrote in between", status_error(409, "Conflict", "modified"), True),
    ("a 502 from a proxy, no Status", ApiException(status=502, reason="Bad Gateway"), True),
    ("connection refused", ConnectionRefusedError(111, "Connection refused"), True),
    ("read timed out", TimeoutError("timed out"), True),
    ("urllib3 gave up", urllib3.exceptions.MaxRetryError(None, "/api", "refused"), True),
    ("422 invalid", INVALID, False),
    ("403 quota", QUOTA, False),
    ("403 RBAC", status_error(403, "Forbidden", "cannot create resource"), False),
    ("409 name taken", status_error(409, "AlreadyExists", "already exists"), False),
    ("404 kind not served", status_error(404, "NotFound", "the server could not find"), False),
    ("400 bad request", status_error(400, "BadRequest", "bad"), False),
    ("a bug of ours", ValueError("unexpected"), False),
]


@pytest.mark.parametrize(("error", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_which_failures_time_may_cure(error: BaseException, expected: bool) -> None:
    assert transient(error) is expected


def settled(n: int) -> WorkloadState:
    return WorkloadState(True, n, n, n, "r1", "r1", 2, 2)


# (id, reason, transient, Stalled, Reconciling, Degraded)
STATUSES = [
    ("transient", "ApplyRetrying", True, "False", "True", "False"),
    ("refused", "ApplyFailed", False, "True", "False", "True"),
    ("a name held by another owner", "NameConflict", False, "True", "False", "True"),
]


@pytest.mark.parametrize(
    ("reason", "is_transient", "stalled", "reconciling", "degraded"),
    [s[1:] for s in STATUSES],
    ids=[s[0] for s in STATUSES],
)
def test_only_a_refusal_is_stalled(
    reason: str, is_transient: bool, stalled: str, reconciling: str, degraded: str
) -> None:
    seen = Observed(
        workloads={"prefill": settled(2), "decode": settled(4), "router": settled(1)},
        wanted={"prefill": 2, "decode": 4, "router": 1},
        apply_error="could not apply children: why",
        apply_error_reason=reason,
        apply_error_transient=is_transient,
    )
    found = {c.type: c for c in compute_status(make_pdd(), seen, NOW).conditions}
    assert found["Stalled"].status == stalled
    assert found["Reconciling"].status == reconciling
    assert found["Degraded"].status == degraded
    # Not Ready either way, with the reason and what the API server said.
    assert (found["Ready"].status, found["Ready"].reason) == ("False", reason)
    assert found["Ready"].message == "could not apply children: why"
    said = found["Reconciling"] if reconciling == "True" else found["Stalled"]
    assert (said.reason, said.message) == (reason, "could not apply children: why")


def body() -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(uid="uid-llama", resourceVersion="1")
    result["spec"]["topology"] = {"placement": "none"}
    return result


def condition(cluster: FakeCluster, type_: str) -> tuple[str, str, str]:
    found = next(c for c in cluster.stored[KEY]["status"]["conditions"] if c["type"] == type_)
    return found["status"], found["reason"], found["message"]


def delays_asked(rec: Reconciler) -> list[float]:
    """Record the delays of the passes the reconciler schedules, instead of scheduling them."""
    asked: list[float] = []
    rec._retry_later = lambda key, delay: asked.append(delay)  # type: ignore[method-assign]
    return asked


async def test_a_transient_failure_is_retried_with_backoff_until_it_passes() -> None:
    cluster = FakeCluster(body(), apply_error=WEBHOOK_DOWN)
    rec = reconciler_for(cluster)
    asked = delays_asked(rec)
    for _ in range(4):
        await rec.reconcile(KEY)
        cluster.deliver_pdd_watch()
    first = reconcile.TRANSIENT_RETRY_FIRST_S
    assert asked == [first, first * 2, first * 4, first * 8]
    status, reason, message = condition(cluster, "Reconciling")
    assert (status, reason) == ("True", "ApplyRetrying")
    assert 'failed calling webhook "deny.example.com"' in message and "(retrying)" in message
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")

    cluster.apply_error = None  # the webhook is back
    await rec.reconcile(KEY)
    cluster.deliver_pdd_watch()
    assert condition(cluster, "Reconciling")[1] != "ApplyRetrying"
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")
    assert len(asked) == 4  # no more retries of its own

    cluster.apply_error = WEBHOOK_DOWN  # down again: the backoff starts over
    cluster.deleted_by_hand("team-a", ("apps/v1", "StatefulSet", "llama-prefill"))
    await rec.reconcile(KEY)
    assert asked[-1] == first


async def test_the_retry_comes_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing else would ask for a pass before the periodic resync (minutes)."""
    monkeypatch.setattr(reconcile, "TRANSIENT_RETRY_FIRST_S", 0.02)
    cluster = FakeCluster(body(), apply_error=WEBHOOK_DOWN)
    rec = reconciler_for(cluster)
    await rec.reconcile(KEY)
    assert condition(cluster, "Reconciling")[1] == "ApplyRetrying"
    cluster.apply_error = None
    for _ in range(200):
        if condition(cluster, "Reconciling")[1] != "ApplyRetrying":
            break
        await asyncio.sleep(0.01)
    assert condition(cluster, "Reconciling")[1] != "ApplyRetrying"
    assert ("apply", "StatefulSet", "llama-prefill") in cluster.writes


async def test_a_refusal_is_stalled_and_not_retried_by_itself() -> None:
    cluster = FakeCluster(body(), apply_error=INVALID)
    rec = reconciler_for(cluster)
    asked = delays_asked(rec)
    await rec.reconcile(KEY)
    status, reason, message = condition(cluster, "Stalled")
    assert (status, reason) == ("True", "ApplyFailed")
    assert "spec.template: Required value" in message and "retrying" not in message
    assert condition(cluster, "Reconciling")[0] == "False"
    assert asked == []
