"""Why a StatefulSet of ours has fewer pods than it asks for: its controller's Events.

A pod refused at admission (a ResourceQuota, Pod Security admission, a webhook) never exists;
the StatefulSet controller says why only in a FailedCreate Event on the StatefulSet
(status/refusals.py). Events carry no label of ours, so the API server selects those about
StatefulSets (a field selector) and this store keeps only the newest pod-creation Event of
each. A pass reads it without a request; a change of what it says (a refusal, or its end)
asks for a pass of the deployment the StatefulSet belongs to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdd_operator.informers.listwatch import Collection
from pdd_operator.kube.resources import EVENT
from pdd_operator.status.refusals import (
    FAILED_CREATE,
    SUCCESSFUL_CREATE,
    event_time,
    refusal_message,
)

STATEFULSET_EVENTS = ("fieldSelector", "involvedObject.kind=StatefulSet")
WorkloadChanged = Callable[[str], None]  # gets the StatefulSet's uid


@dataclass(frozen=True)
class _Newest:
    event_uid: str
    when: str
    refusal: str  # "" for a successful creation


class CreationEvents:
    """The newest pod-creation Event of each StatefulSet, by the StatefulSet's uid."""

    def __init__(self, on_change: WorkloadChanged | None = None) -> None:
        self._on_change = on_change
        self._newest: dict[str, _Newest] = {}
        self._lock = threading.Lock()
        self._listed = False

    def refusal(self, workload_uid: str) -> str:
        """Why the workload's newest pod creation was refused; "" when it was not."""
        with self._lock:
            newest = self._newest.get(workload_uid)
        return newest.refusal if newest else ""

    def __len__(self) -> int:
        return len(self._newest)

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        found = _creation(body)
        if found is None:
            return
        workload, event = found
        with self._lock:
            before = self._newest.get(workload)
            if event_type == "DELETED":
                if before is not None and before.event_uid == event.event_uid:
                    del self._newest[workload]
            elif before is None or event.when >= before.when:
                self._newest[workload] = event
            after = self._newest.get(workload)
        self._tell(workload, before, after)

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list. The first one tells nothing (every deployment gets a pass at start);
        later ones, after a watch was lost, tell of the refusals that changed meanwhile."""
        fresh: dict[str, _Newest] = {}
        for body in bodies:
            if (found := _creation(body)) is not None:
                workload, event = found
                if workload not in fresh or event.when >= fresh[workload].when:
                    fresh[workload] = event
        with self._lock:
            old, self._newest = self._newest, fresh
            first, self._listed = not self._listed, True
        if not first:
            for workload in old.keys() | fresh.keys():
                self._tell(workload, old.get(workload), fresh.get(workload))

    def _tell(self, workload: str, before: _Newest | None, after: _Newest | None) -> None:
        said = (before.refusal if before else "", after.refusal if after else "")
        if self._on_change is not None and said[0] != said[1]:
            self._on_change(workload)


def _creation(body: Mapping[str, Any]) -> tuple[str, _Newest] | None:
    """(the StatefulSet's uid, what the Event says) for a pod-creation Event, else None."""
    if body.get("reason") not in (FAILED_CREATE, SUCCESSFUL_CREATE):
        return None
    workload = str((body.get("involvedObject") or {}).get("uid") or "")
    if not workload:
        return None
    uid = str((body.get("metadata") or {}).get("uid") or "")
    return workload, _Newest(uid, event_time(body), refusal_message(body))


def creation_event_collections(
    events: CreationEvents, namespaces: Iterable[str]
) -> list[Collection]:
    """The StatefulSets' Events of the whole cluster, or of each namespace the operator is
    confined to."""
    return [
        Collection(
            f"statefulset events{f' in {ns}' if ns else ''}",
            EVENT.path(ns or None),
            (STATEFULSET_EVENTS,),
            events,
        )
        for ns in tuple(namespaces) or ("",)
    ]
