"""The Events informer's store (informers/creation_events.py): the newest pod-creation Event of
each StatefulSet, and a pass asked for only when what it says changes."""

from __future__ import annotations

from typing import Any

from pdd_operator.informers.creation_events import (
    STATEFULSET_EVENTS,
    CreationEvents,
    creation_event_collections,
)
from pdd_operator.informers.owned import OwnedObjects
from pdd_operator.informers.view import IndexView

STS = "uid-sts"
QUOTA = 'pods "kv-prefill-0" is forbidden: exceeded quota: gpus'


def event(uid: str, reason: str, when: str, workload: str = STS) -> dict[str, Any]:
    message = f"create Pod kv-prefill-0 in StatefulSet kv-prefill failed error: {QUOTA}"
    return {
        "metadata": {"uid": uid, "namespace": "team-a"},
        "involvedObject": {"kind": "StatefulSet", "uid": workload},
        "reason": reason,
        "message": message if reason == "FailedCreate" else "create Pod kv-prefill-0 ok",
        "lastTimestamp": when,
    }


def test_a_refusal_is_kept_until_a_newer_creation_succeeds_and_each_change_is_told() -> None:
    told: list[str] = []
    store = CreationEvents(told.append)
    store.reset([])
    store.apply("ADDED", event("e1", "FailedCreate", "2026-12-01T10:00:00Z"))
    assert store.refusal(STS) == QUOTA and told == [STS]
    store.apply("MODIFIED", event("e1", "FailedCreate", "2026-12-01T10:00:09Z"))  # repeated
    assert told == [STS]  # it says the same: no pass
    store.apply("ADDED", event("e0", "SuccessfulCreate", "2026-12-01T09:59:00Z"))  # older
    assert store.refusal(STS) == QUOTA
    store.apply("ADDED", event("e2", "SuccessfulCreate", "2026-12-01T10:01:00Z"))
    assert store.refusal(STS) == "" and told == [STS, STS]
    store.apply("ADDED", event("e3", "Killing", "2026-12-01T10:02:00Z"))  # not a creation
    assert len(store) == 1 and told == [STS, STS]


def test_the_newest_events_expiry_forgets_the_workload_and_a_relist_tells_what_changed() -> None:
    told: list[str] = []
    store = CreationEvents(told.append)
    store.reset([event("e1", "FailedCreate", "2026-12-01T10:00:00Z")])
    assert store.refusal(STS) == QUOTA and told == []  # the first list tells nothing
    store.apply("DELETED", event("e1", "FailedCreate", "2026-12-01T10:00:00Z"))
    assert store.refusal(STS) == "" and told == [STS] and len(store) == 0
    store.reset([event("e4", "FailedCreate", "2026-12-01T11:00:00Z", "other")])
    assert store.refusal("other") == QUOTA and told == [STS, "other"]


def test_events_are_selected_by_the_api_server_per_namespace_when_confined() -> None:
    store = CreationEvents()
    everywhere = creation_event_collections(store, ())
    assert [(c.path, c.selectors) for c in everywhere] == [
        ("/api/v1/events", (STATEFULSET_EVENTS,))
    ]
    confined = creation_event_collections(store, ("a", "b"))
    assert [c.path for c in confined] == [
        "/api/v1/namespaces/a/events",
        "/api/v1/namespaces/b/events",
    ]


def test_the_view_reads_the_store_it_was_given_even_while_that_is_empty() -> None:
    store = CreationEvents()
    view = IndexView({}, OwnedObjects(), creations=store)  # empty: len() 0, so falsy
    store.apply("ADDED", event("e1", "FailedCreate", "2026-12-01T10:00:00Z"))
    assert view.creation_refusal(STS) == QUOTA
