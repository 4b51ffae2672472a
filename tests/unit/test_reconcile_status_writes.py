"""The Reconciler's status writes, against a fake view and a fake API (the unit tier; the real
API server is in tests/integration)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from helpers.factories import BASE_BODY
from pdd_operator.planning.placement import Fleet
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary

KEY = ("team-a", "llama")


class FakeKube:
    """Answers like the API server would, without one; hands out opaque resourceVersions."""

    def __init__(self, apply_error: Exception | None = None) -> None:
        self.status_writes: list[dict[str, Any]] = []
        self.applies = 0
        self.apply_error = apply_error

    def apply(self, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.applies += 1
        if self.apply_error is not None:
            raise self.apply_error
        return {}

    def delete(self, *_: Any) -> None:
        return None

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return True

    def annotate_pod(self, *_: Any) -> None:
        return None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        self.status_writes.append(copy.deepcopy(status))
        # Not numbers, and not increasing in any order: only equality may be used.
        return f"rv-{'zyxwvu'[len(self.status_writes) % 6]}{len(self.status_writes)}"


class FakeView:
    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body

    def pdd_body(self, key: tuple[str, str]) -> Mapping[str, Any] | None:
        return self.body

    def children(self, key: tuple[str, str]) -> Mapping[ChildKey, ChildSummary]:
        return {}

    def pods(self, key: tuple[str, str]) -> Sequence[PodSummary]:
        return ()

    def fleet(self) -> Fleet:
        return Fleet(())

    def node_ready(self, name: str) -> bool | None:
        return None


def body(version: str, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"]["resourceVersion"] = version
    result["spec"]["topology"] = {"placement": "none"}
    result["spec"].update(spec)
    if status is not None:
        result["status"] = status
    return result


def reconciler(kube: FakeKube, view: FakeView) -> tuple[Reconciler, list[tuple[str, ...]]]:
    events: list[tuple[str, ...]] = []

    def emit(_: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        events.append((type_, reason, message))

    return Reconciler(kube, view, OperatorSettings(), emit), events  # type: ignore[arg-type]


# ---------------------------------------------------------------- the index lagging our write


async def test_a_pass_on_an_index_copy_older_than_its_own_write_writes_nothing_new() -> None:
    kube = FakeKube()
    view = FakeView(body("rv-1"))
    rec, _ = reconciler(kube, view)
    await rec.reconcile(KEY)
    assert len(kube.status_writes) == 1
    written = kube.status_writes[0]
    # A pod event runs a pass before the watch delivered the write: the index copy is the
    # version the first pass read, so the pass computes from its own write and writes nothing.
    await rec.reconcile(KEY)
    assert len(kube.status_writes) == 1
    # The watch delivers the write (with the version patch_status returned): nothing either.
    version = "rv-y1"
    assert rec.is_own_status_write(KEY, version)
    view.body = body(version, written)
    await rec.reconcile(KEY)
    assert len(kube.status_writes) == 1


async def test_an_unknown_version_is_read_as_it_is() -> None:
    kube = FakeKube()
    view = FakeView(body("rv-1"))
    rec, _ = reconciler(kube, view)
    await rec.reconcile(KEY)
    # Someone else wrote after the operator (their version was never seen, and versions are
    # not compared): the index copy is taken as it is, here with its status cleared.
    view.body = body("rv-0", {})
    await rec.reconcile(KEY)
    assert len(kube.status_writes) == 2


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
    kube = FakeKube(apply_error=error)
    rec, events = reconciler(kube, FakeView(body("rv-1")))
    await rec.reconcile(KEY)
    assert kube.applies > 0
    if going_away:
        assert kube.status_writes == [] and events == []
    else:
        [status] = kube.status_writes
        stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "ApplyFailed")


# ---------------------------------------------------------------- an unreadable spec


async def test_an_unreadable_spec_is_stalled_once_and_then_quiet() -> None:
    kube = FakeKube()
    view = FakeView(body("rv-1", futureField="x"))
    rec, events = reconciler(kube, view)
    await rec.reconcile(KEY)
    assert kube.applies == 0  # nothing is rendered from a spec that was not understood
    [patch] = kube.status_writes
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
    assert events == [("Warning", "InvalidSpec", by_type["Stalled"]["message"])]

    # Resyncs of the same object, before and after the watch delivered the write: no write,
    # no event (an event per resync would be a write per resync).
    await rec.reconcile(KEY)
    view.body = body("rv-y1", patch, futureField="x")
    await rec.reconcile(KEY)
    assert len(kube.status_writes) == 1 and len(events) == 1

    # Fixed: the normal pass takes over, and Stalled turns False.
    view.body = body("rv-2", patch)
    view.body["metadata"]["generation"] = 4
    await rec.reconcile(KEY)
    assert len(kube.status_writes) == 2
    stalled = next(c for c in kube.status_writes[1]["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["observedGeneration"]) == ("False", 4)
