"""The Reconciler's status writes, against the in-memory cluster of helpers.fake_cluster (the
unit tier; the real API server is in tests/integration)."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for

KEY = ("team-a", "llama")


def body(version: str, **spec: Any) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"]["resourceVersion"] = version
    result["spec"]["topology"] = {"placement": "none"}
    result["spec"].update(spec)
    return result


# ---------------------------------------------------------------- the index lagging our write


async def test_a_pass_on_an_index_copy_older_than_its_own_write_writes_nothing_new() -> None:
    cluster = FakeCluster(body("rv-1"))
    cluster.hold_pdd_watch = True
    rec = reconciler_for(cluster)
    await rec.reconcile(KEY)
    assert len(cluster.status_writes) == 1
    # A pod event runs a pass before the watch delivered the write: the index copy is the
    # version the first pass read, so the pass computes from its own write and writes nothing.
    await rec.reconcile(KEY)
    assert len(cluster.status_writes) == 1
    # The watch delivers the write (with the version patch_status returned): nothing either.
    version = cluster.stored[KEY]["metadata"]["resourceVersion"]
    assert rec.is_own_status_write(KEY, version)
    assert not rec.is_own_status_write(KEY, "rv-1")
    cluster.deliver_pdd_watch()
    await rec.reconcile(KEY)
    assert len(cluster.status_writes) == 1


async def test_an_unknown_version_is_read_as_it_is() -> None:
    cluster = FakeCluster(body("rv-1"))
    rec = reconciler_for(cluster)
    await rec.reconcile(KEY)
    # Someone else wrote after the operator (their version was never seen, and versions are
    # not compared): the index copy is taken as it is, here with its status cleared.
    cluster.indexed[KEY] = {**body("rv-0"), "status": {}}
    await rec.reconcile(KEY)
    assert len(cluster.status_writes) == 2


# ---------------------------------------------------------------- errors told by their Status


def status_error(code: int, reason: str, details: dict[str, Any], message: str) -> ApiException:
    err = ApiException(status=code, reason=reason)
    err.body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code,
        }
    )
    return err


TERMINATING = status_error(
    403,
    "Forbidden",
    {
        "name": "llama-prefill",
        "group": "apps",
        "kind": "statefulsets",
        "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}],
    },
    # A message that says nothing of namespaces: the Status decides, not the words.
    "refused",
)
NAMESPACE_GONE = status_error(404, "NotFound", {"name": "team-a", "kind": "namespaces"}, "x")
OTHER_FORBIDDEN = status_error(
    403,
    "Forbidden",
    {"name": "llama-prefill", "group": "apps", "kind": "statefulsets"},
    "unable to create new content in namespace team-a because it is being terminated",
)
OBJECT_NOT_FOUND = status_error(
    404, "NotFound", {"name": "llama", "group": "apps", "kind": "namespaces"}, "not found"
)


@pytest.mark.parametrize(
    ("error", "going_away"),
    [
        (TERMINATING, True),
        (NAMESPACE_GONE, True),
        # the words of a terminating namespace, but no NamespaceTerminating cause
        (OTHER_FORBIDDEN, False),
        # a resource of another group that happens to be called "namespaces"
        (OBJECT_NOT_FOUND, False),
        (ApiException(status=404), False),  # no Status body at all
    ],
)
async def test_a_namespace_going_away_ends_the_pass_without_a_status_write(
    error: ApiException, going_away: bool
) -> None:
    cluster = FakeCluster(body("rv-1"), apply_error=error)
    await reconciler_for(cluster).reconcile(KEY)
    assert cluster.applies
    if going_away:
        assert cluster.status_writes == [] and cluster.events == []
    else:
        [status] = cluster.status_writes
        stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "ApplyFailed")


# ---------------------------------------------------------------- an unreadable spec


async def test_an_unreadable_spec_is_stalled_once_and_then_quiet() -> None:
    cluster = FakeCluster(body("rv-1", futureField="x"))
    cluster.hold_pdd_watch = True
    rec = reconciler_for(cluster)
    await rec.reconcile(KEY)
    assert cluster.applies == []  # nothing is rendered from a spec that was not understood
    [patch] = cluster.status_writes
    assert set(patch) == {"observedGeneration", "conditions"}  # the rest of status is kept
    assert patch["observedGeneration"] == 3
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert {t: (c["status"], c["reason"]) for t, c in by_type.items()} == {
        "Ready": ("False", "InvalidSpec"),
        "Progressing": ("False", "InvalidSpec"),
        "Reconciling": ("False", "InvalidSpec"),
        "Stalled": ("True", "InvalidSpec"),
    }
    assert by_type["Stalled"]["message"].startswith("spec.futureField: this operator does not")
    assert all(c["observedGeneration"] == 3 for c in patch["conditions"])
    assert cluster.events == [("Warning", "InvalidSpec", by_type["Stalled"]["message"])]

    # Resyncs of the same object, before and after the watch delivered the write: no write,
    # no event (an event per resync would be a write per resync).
    await rec.reconcile(KEY)
    cluster.deliver_pdd_watch()
    await rec.reconcile(KEY)
    assert len(cluster.status_writes) == 1 and len(cluster.events) == 1

    # Fixed: the normal pass takes over, and Stalled turns False.
    cluster.hold_pdd_watch = False
    cluster.update_spec(KEY, {"futureField": None})
    await rec.reconcile(KEY)
    assert len(cluster.status_writes) == 2
    stalled = next(c for c in cluster.status_writes[1]["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["observedGeneration"]) == ("False", 4)


# ---------------------------------------------------------------- echoes that beat the answer


@pytest.mark.parametrize(("someone_else", "passes"), [(False, 1), (True, 2)])
async def test_a_status_echo_that_comes_before_the_writes_answer_runs_no_second_pass(
    monkeypatch: pytest.MonkeyPatch, someone_else: bool, passes: int
) -> None:
    """The watch delivers the status write while its pass still waits for the answer: once
    the pass has it, the echo is known as ours. A spec change in that moment is not."""
    cluster = FakeCluster(body("rv-1"))
    rec = reconciler_for(cluster)
    loop = asyncio.get_running_loop()
    write = cluster.patch_status
    events: list[asyncio.Future[None]] = []

    def delivered_before_the_answer(namespace: str, name: str, status: dict[str, Any]) -> str:
        version = write(namespace, name, status)
        seen = "rv-theirs" if someone_else else version
        event = asyncio.run_coroutine_threadsafe(rec.deployment_changed(KEY, seen), loop)
        events.append(asyncio.wrap_future(event, loop=loop))
        time.sleep(0.05)  # the event loop takes the event before this thread returns
        return version

    monkeypatch.setattr(cluster, "patch_status", delivered_before_the_answer)
    counted = rec._reconcile_once
    runs: list[int] = []

    async def one_pass(key: tuple[str, str]) -> None:
        runs.append(1)
        await counted(key)

    monkeypatch.setattr(rec, "_reconcile_once", one_pass)
    await rec.reconcile(KEY)
    await asyncio.gather(*events)
    assert len(runs) == passes
