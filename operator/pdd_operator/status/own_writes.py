"""The writes this operator made, recognised when the watch brings them back.

A write's resourceVersion names its watch echo: the pass that wrote it already saw everything
else, so the echo needs no pass of its own. Without this, a new deployment's ten children came
back as ten events and one more pass that wrote nothing.

A PDDeployment's written status also stands in for the index copy while the index still lags
behind the write: a pass triggered by a pod or child event can run before the watch delivers
the write, and computing from the older status would rewrite every condition's transition
time and renew the probe request.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OwnWrite:
    """A status this operator wrote, the resourceVersion the write produced, and the versions
    known to predate the write.

    resourceVersions are opaque: only equality means anything, so "the index copy is older
    than our write" cannot be a comparison. Instead each write records the version its pass
    read, which the write certainly followed; while the index still lags, the versions of
    earlier writes and their reads are carried over. An index copy at one of these predates
    the write. Any other version is the write itself, a change made after it (a watch
    delivers one object's versions in order, so the index passes our write before it shows
    a later one), or one this operator never saw (a change between a pass's read and its
    write); for those the index copy is used as it is.
    """

    version: str
    status: dict[str, Any]
    predating: frozenset[str]
    # Earlier writes whose echoes had not come when this one was made: echoes still.
    earlier: frozenset[str] = frozenset()

    def predates(self, version: str) -> bool:
        return version in self.predating

    def wrote(self, version: str) -> bool:
        return version == self.version or version in self.earlier

    @classmethod
    def after(
        cls, previous: OwnWrite | None, read: str, version: str, status: dict[str, Any]
    ) -> OwnWrite:
        """The record of a write made by a pass that read version `read`."""
        if previous is not None and previous.predates(read):  # the index still lagged
            predating = previous.predating | {previous.version, read}
            earlier = previous.earlier | {previous.version}
        else:
            predating, earlier = frozenset({read}), frozenset()
        return cls(version, status, predating - {""}, earlier)


def is_echo(written: OwnWrite | None, version: str) -> bool:
    """Whether this version of the PDDeployment is the status this operator just wrote
    (``written``: the deployment's last status write, reconcile.memory)."""
    return bool(version) and written is not None and written.wrote(version)


def latest(written: OwnWrite | None, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body with the status this operator last wrote, when the body predates it."""
    if written is None or not written.predates(resource_version(body)):
        return body
    return {**body, "status": written.status}


def after_write(
    written: OwnWrite | None, read: Mapping[str, Any], version: str, status: dict[str, Any]
) -> OwnWrite | None:
    """The record after a write of ``status`` by a pass that read the body ``read``;
    ``version`` is what the write returned ("" when the object was gone: nothing to
    recognise, the record stays as it was)."""
    if not version:
        return written
    return OwnWrite.after(written, resource_version(read), version, status)


class OwnObjectWrites:
    """The resourceVersion each of this operator's writes to its children and their pods (an
    apply, a probe request) produced, per object, until the watch brings it back. Written by
    the threads that write, read by the informers'."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def expect(self, plural: str, body: Mapping[str, Any]) -> None:
        """`body`: what the write returned (its metadata is enough)."""
        if version := resource_version(body):
            with self._lock:
                self._versions[_object(plural, body)] = version

    def is_echo(self, plural: str, event_type: str, body: Mapping[str, Any]) -> bool:
        """Whether this watch event is a write of ours coming back. A write that changed
        nothing produces no event: its version is forgotten when the object goes."""
        key, version = _object(plural, body), resource_version(body)
        with self._lock:
            expected = self._versions.get(key)
            if expected is None:
                return False
            if expected == version or event_type == "DELETED":
                del self._versions[key]
        return expected == version and event_type != "DELETED"

    def forget(self, plural: str) -> None:
        """A kind's watch was lost and its objects listed afresh: the echoes it would have
        brought never come."""
        with self._lock:
            self._versions = {k: v for k, v in self._versions.items() if k[0] != plural}

    def __len__(self) -> int:
        with self._lock:
            return len(self._versions)


def _object(plural: str, body: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = body.get("metadata", {})
    return plural, str(meta.get("namespace", "")), str(meta.get("name", ""))


def resource_version(body: Mapping[str, Any]) -> str:
    return str(body.get("metadata", {}).get("resourceVersion") or "")
