"""Which watch events are worth a pass: those that change what a pass reads of an object.

Most events of a child or a pod change nothing the reconciler reads (a StatefulSet's status
rewritten with the same counts, a pod's container moving from waiting to running while it is
not yet ready, a new resourceVersion); each would still have cost a whole pass. The index
function records how the object now looks to a pass (its summary); the event handler, which
kopf runs after the indexes for the same event, asks whether that differs from the look that
last triggered one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pdd_operator.status.observe import ChildSummary


class ChangeFilter:
    def __init__(self) -> None:
        self._triggered: dict[str, Any] = {}  # uid -> the look that last triggered a pass
        self._latest: dict[str, Any] = {}  # uid -> the look the index has now

    def saw(self, uid: str, summary: Any) -> None:
        """From an index function: how the object looks to a pass now."""
        if uid:
            self._latest[uid] = _comparable(summary)

    def worth_a_pass(self, uid: str, event_type: str | None) -> bool:
        """From the event handler of the same event. A deletion always is (its look goes);
        so is anything not indexed (no look recorded)."""
        if event_type == "DELETED" or not uid:
            self._triggered.pop(uid, None)
            self._latest.pop(uid, None)
            return True
        latest = self._latest.get(uid, _UNSEEN)
        if latest is _UNSEEN:
            return True
        if self._triggered.get(uid, _UNSEEN) == latest:
            return False
        self._triggered[uid] = latest
        return True

    def __len__(self) -> int:
        return len(self._latest.keys() | self._triggered.keys())


_UNSEEN = object()


def _comparable(summary: Any) -> Any:
    """A child's resourceVersion changes with every write, and no pass decision reads it."""
    if isinstance(summary, ChildSummary):
        return dataclasses.replace(summary, resource_version="")
    return summary
