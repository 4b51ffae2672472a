"""The sidecar's view of its peers' NIXL agents and the versioned history engines watch.

Pure data and functions. An agent is identified by its name *and* the pod UID, metadata digest
and etcd revision behind it: when any of them changes (pod replaced, engine restarted, metadata
re-published), the old identity is reported removed and the new one added, so an engine drops
the predecessor (``remove_remote_agent``) before it loads the successor and never writes to the
predecessor's memory keys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# Why an agent left the view; the etcd janitor only acts on the first three.
POD_GONE = "pod_gone"
UID_CHANGED = "uid_changed"
UNPUBLISHED = "unpublished"
METADATA_CHANGED = "metadata_changed"
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class AgentRecord:
    """One NIXL agent published by a peer pod's engine."""

    name: str
    role: str
    pod: str
    pod_uid: str
    address: str  # the peer sidecar, host:port
    sha256: str
    published_at: float = 0.0
    etcd_mod_revision: int | None = None
    revision: str = ""  # the peer pod's engine revision (pdd.dev/revision), "" when unset
    metadata: bytes = field(default=b"", repr=False, compare=False)  # secret: never logged

    @property
    def identity(self) -> tuple[str, str, str, int | None]:
        return (self.name, self.pod_uid, self.sha256, self.etcd_mod_revision)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["metadata"]
        return doc


View = Mapping[str, AgentRecord]  # agent name -> record


@dataclass(frozen=True)
class Removal:
    record: AgentRecord
    reason: str


@dataclass
class Changes:
    """What a watcher must do to go from version ``since`` to ``version``."""

    version: int
    added: list[AgentRecord] = field(default_factory=list)
    removed: list[AgentRecord] = field(default_factory=list)
    resync: bool = False  # ``since`` is older than the history kept: reconcile to ``added``

    def for_role(self, role: str | None) -> Changes:
        if role is None:
            return self
        return Changes(
            self.version,
            [r for r in self.added if r.role == role],
            [r for r in self.removed if r.role == role],
            self.resync,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "resync": self.resync,
            "added": [r.to_json() for r in self.added],
            "removed": [r.to_json() for r in self.removed],
        }


def diff_views(old: View, new: View) -> tuple[list[AgentRecord], list[AgentRecord]]:
    """(added, removed): a record whose identity changed is in both lists."""
    removed = [r for name, r in old.items() if name not in new or new[name].identity != r.identity]
    added = [r for name, r in new.items() if name not in old or old[name].identity != r.identity]
    return added, removed


def merge_pods(pods: Iterable[Iterable[AgentRecord]]) -> dict[str, AgentRecord]:
    """One record per agent name. Two live pods claiming one name is a misconfiguration; the
    most recently published wins so that a replacement pod takes over from its predecessor."""
    view: dict[str, AgentRecord] = {}
    for records in pods:
        for record in records:
            current = view.get(record.name)
            if current is None or record.published_at > current.published_at:
                view[record.name] = record
    return view


def removal_reason(record: AgentRecord, new: View, live_uids: Mapping[str, str]) -> str:
    """Why ``record`` left the view. ``live_uids`` maps each listed pod name to its UID now."""
    if record.pod not in live_uids:
        return POD_GONE
    if live_uids[record.pod] != record.pod_uid:
        return UID_CHANGED
    successor = new.get(record.name)
    if successor is None:
        return UNPUBLISHED
    if successor.pod_uid != record.pod_uid:
        return UID_CHANGED
    return METADATA_CHANGED


class PeerHistory:
    """The current view plus snapshots of recent versions, for ``/v1/peers/watch?since=N``."""

    def __init__(self, start_version: int = 0, keep: int = 256) -> None:
        # Start from a clock reading, not 0, so a watcher's ``since`` from before a sidecar
        # restart is older than anything kept and gets a resync instead of a wrong diff.
        self.version = start_version
        self.view: dict[str, AgentRecord] = {}
        self._snapshots: OrderedDict[int, dict[str, AgentRecord]] = OrderedDict({start_version: {}})
        self._keep = keep

    def update(self, new: View) -> tuple[list[AgentRecord], list[AgentRecord]]:
        """Install a new view; bumps the version only when an identity changed."""
        added, removed = diff_views(self.view, new)
        if added or removed:
            self.version += 1
            self.view = dict(new)
            self._snapshots[self.version] = self.view
            while len(self._snapshots) > self._keep:
                self._snapshots.popitem(last=False)
        return added, removed

    def changes_since(self, since: int) -> Changes:
        if since == self.version:
            return Changes(self.version)
        old = self._snapshots.get(since)
        if old is None or since > self.version:
            return Changes(self.version, list(self.view.values()), [], resync=True)
        added, removed = diff_views(old, self.view)
        return Changes(self.version, added, removed)
