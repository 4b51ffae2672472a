"""The operator's own objects as a pass reads them: every child, pod, router ReplicaSet and
scale target carrying its managed-by label (selected by the API server), kept as summaries.

An event that changes what a pass reads of a summary gets its deployment a pass; most events
change none (a new resourceVersion, a StatefulSet's controller updating its counts, a container
moving from waiting to running while the pod is not ready) and cost only their decoding. The
echo of the operator's own write (an apply, a probe request on a pod) gets none either: the
pass that wrote it already knew what it wrote.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.informers.listwatch import Collection
from pdd_operator.kube.decoding import PODS, WHOLE
from pdd_operator.kube.resources import CHILD_KINDS, POD, ROLE_SCALER, Kind
from pdd_operator.status.drift import LiveDigests
from pdd_operator.status.observe import (
    ChildSummary,
    PodSummary,
    ScalerSummary,
    controller_uid,
    owner_key,
    summarize_child,
    summarize_pod,
    summarize_scaler,
    unowned_key,
    workload_as_read,
)
from pdd_operator.status.own_writes import OwnObjectWrites

MANAGED = {"app.kubernetes.io/managed-by": names.MANAGED_BY}
OURS = ("labelSelector", ",".join(f"{k}={v}" for k, v in MANAGED.items()))
REPLICASETS = Kind("apps/v1", "ReplicaSet", "replicasets")

Group = tuple[str, str]
Summarize = Callable[[Mapping[str, Any]], tuple[Group, Any] | None]
DeploymentOf = Callable[[Mapping[str, Any]], DeploymentKey | None]
Trigger = Callable[[DeploymentKey, str], None]  # the deployment, and what changed (a plural)
# Told each object's summary as it is now (None: gone), with its deployment.
Observer = Callable[[str, Any, DeploymentKey | None], None]


@dataclass(frozen=True)
class _Entry:
    group: Group
    summary: Any
    deployment: DeploymentKey | None


class GroupedStore:
    """One collection's summaries by uid, looked up by group (an owner's key or uid)."""

    def __init__(
        self,
        summarize: Summarize,
        deployment_of: DeploymentOf,
        on_change: Trigger | None,
        source: str = "",
        observe: Observer | None = None,
        own_object_writes: OwnObjectWrites | None = None,
    ) -> None:
        self._summarize = summarize
        self._source = source
        self._observe = observe
        self._own_object_writes = own_object_writes
        self._deployment_of = deployment_of
        self._on_change = on_change
        self._entries: dict[str, _Entry] = {}
        self._groups: dict[Group, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._listed = False

    def get(self, group: Group) -> list[Any]:
        with self._lock:
            return list(self._groups.get(group, {}).values())

    def __len__(self) -> int:
        return len(self._entries)

    def deployment_of(self, uid: str) -> DeploymentKey | None:
        """The deployment the object of that uid belongs to, when it is here."""
        with self._lock:
            entry = self._entries.get(uid)
        return entry.deployment if entry is not None else None

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        uid = str(body.get("metadata", {}).get("uid", ""))
        new = None if event_type == "DELETED" else self._entry(body)
        with self._lock:
            old = self._entries.get(uid)
            self._put(uid, old, new)
        self._inform_observer(uid, old, new)
        if not self._own_echo(event_type, body, old, new):
            self._tell(old, new)

    def _own_echo(
        self, event_type: str, body: Mapping[str, Any], old: _Entry | None, new: _Entry | None
    ) -> bool:
        """Whether the event brings back a write of ours and nothing else. A write that
        changed nothing answers with the version the object already had, perhaps someone
        else's whose event is still on its way: what only others write must not have changed
        (a workload's status, a pod's state)."""
        own = self._own_object_writes
        if own is None or not own.is_echo(self._source, event_type, body):
            return False
        created = old is None and event_type == "ADDED"
        return created or _written_by_others(old) == _written_by_others(new)

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list: everything it lacks goes. The first one triggers nothing (at start
        every deployment gets a pass anyway); later ones, after a watch was lost, trigger a
        pass for what changed meanwhile."""
        fresh = {
            str(b.get("metadata", {}).get("uid", "")): entry
            for b in bodies
            if (entry := self._entry(b)) is not None
        }
        if self._own_object_writes is not None:  # echoes lost with the watch never come
            self._own_object_writes.forget(self._source)
        with self._lock:
            old_entries, self._entries = self._entries, {}
            self._groups = {}
            for uid, entry in fresh.items():
                self._put(uid, None, entry)
            first, self._listed = not self._listed, True
        for uid in {**old_entries, **fresh}:
            self._inform_observer(uid, old_entries.get(uid), fresh.get(uid))
            if not first:
                self._tell(old_entries.get(uid), fresh.get(uid))

    def _entry(self, body: Mapping[str, Any]) -> _Entry | None:
        found = self._summarize(body)
        if found is None:
            return None
        return _Entry(found[0], found[1], self._deployment_of(body))

    def _put(self, uid: str, old: _Entry | None, new: _Entry | None) -> None:
        if old is not None:
            group = self._groups.get(old.group, {})
            group.pop(uid, None)
            if not group:
                self._groups.pop(old.group, None)
        if new is None:
            self._entries.pop(uid, None)
        else:
            self._entries[uid] = new
            self._groups.setdefault(new.group, {})[uid] = new.summary

    def _inform_observer(self, uid: str, old: _Entry | None, new: _Entry | None) -> None:
        if self._observe is not None and old != new:
            self._observe(uid, *((new.summary, new.deployment) if new else (None, None)))

    def _tell(self, old: _Entry | None, new: _Entry | None) -> None:
        if self._on_change is None or _looks(old) == _looks(new):
            return
        for entry in (old, new):
            if entry is not None and entry.deployment is not None:
                self._on_change(entry.deployment, self._source)
                return


def _written_by_others(entry: _Entry | None) -> Any:
    """What of an entry this operator's writes never change: a workload's status (its
    controller's), everything of a pod but the probe it was asked for (its kubelet's)."""
    summary = entry.summary if entry is not None else None
    if isinstance(summary, ChildSummary):
        state = summary.workload
        return state and dataclasses.replace(state, desired=0, generation=0)
    if isinstance(summary, PodSummary):
        return dataclasses.replace(summary, probe_request="")
    return summary


def _looks(entry: _Entry | None) -> Any:
    """What a pass reads of an entry: a child's resourceVersion changes with every write and
    no pass decision reads it alone; of its workload status, what workload_as_read keeps (a
    StatefulSet's controller writing its counts asks for nothing)."""
    if entry is None:
        return None
    summary = entry.summary
    if isinstance(summary, ChildSummary):
        summary = dataclasses.replace(
            summary, resource_version="", workload=workload_as_read(summary)
        )
    return entry.group, summary, entry.deployment


@dataclass
class OwnedObjects:
    """The stores of every watched collection of our own objects."""

    children: list[GroupedStore] = field(default_factory=list)
    pods: list[GroupedStore] = field(default_factory=list)
    replicasets: list[GroupedStore] = field(default_factory=list)
    scalers: list[GroupedStore] = field(default_factory=list)

    def children_of(self, key: DeploymentKey) -> list[ChildSummary]:
        return [c for store in self.children for c in store.get(key)]

    def pods_of(self, namespace: str, owner_uid: str) -> list[PodSummary]:
        return [p for store in self.pods for p in store.get((namespace, owner_uid))]

    def replicasets_of(self, namespace: str, deployment_uid: str) -> list[str]:
        return [u for store in self.replicasets for u in store.get((namespace, deployment_uid))]

    def scalers_of(self, key: DeploymentKey) -> list[ScalerSummary]:
        return [s for store in self.scalers for s in store.get(key)]

    def deployment_of_child(self, uid: str) -> DeploymentKey | None:
        return next(filter(None, (store.deployment_of(uid) for store in self.children)), None)


def owned_collections(
    owned: OwnedObjects,
    namespaces: Iterable[str],
    field_manager: str,
    trigger: Trigger | None,
    on_pod: Observer | None = None,
    own_object_writes: OwnObjectWrites | None = None,
) -> list[Collection]:
    """One collection per kind (and namespace, where the operator is confined to some),
    label-selected, each feeding its store in `owned`; `on_pod` is told every pod's summary
    as it changes (the fleet counts our pods' GPUs from them); a child's or pod's event that
    is the echo of one of `own_object_writes` triggers no pass."""

    def child_summarizer() -> Summarize:
        digests = LiveDigests()  # one per collection: each is used by its thread alone

        def child(body: Mapping[str, Any]) -> tuple[Group, Any] | None:
            key = _child_deployment(body)
            return (key, summarize_child(body, field_manager, digests)) if key else None

        return child

    def pod(body: Mapping[str, Any]) -> tuple[Group, Any] | None:
        owner = controller_uid(body)
        return ((_namespace(body), owner), summarize_pod(body)) if owner else None

    def replicaset(body: Mapping[str, Any]) -> tuple[Group, Any] | None:
        owner, uid = controller_uid(body, "Deployment"), body.get("metadata", {}).get("uid")
        return ((_namespace(body), owner), str(uid)) if owner and uid else None

    def scaler(body: Mapping[str, Any]) -> tuple[Group, Any] | None:
        key = owner_key(body)
        return (key, summarize_scaler(body)) if key else None

    kinds: list[
        tuple[Kind, Callable[[], Summarize], DeploymentOf, list[GroupedStore], Observer | None]
    ] = [
        *(
            (kind, child_summarizer, _child_deployment, owned.children, None)
            for kind in CHILD_KINDS
        ),
        (POD, lambda: pod, _pod_deployment, owned.pods, on_pod),
        (REPLICASETS, lambda: replicaset, _no_deployment, owned.replicasets, None),
        (ROLE_SCALER, lambda: scaler, owner_key, owned.scalers, None),
    ]
    collections = []
    for kind, summarizer, deployment_of, stores, observe in kinds:
        echoes = own_object_writes if stores is owned.children or stores is owned.pods else None
        for ns in tuple(namespaces) or ("",):
            store = GroupedStore(summarizer(), deployment_of, trigger, kind.plural, observe, echoes)
            stores.append(store)
            what = f"{kind.plural}{f' in {ns}' if ns else ''}"
            decoding = PODS if kind is POD else WHOLE
            collections.append(Collection(what, kind.path(ns or None), (OURS,), store, decoding))
    return collections


def _namespace(body: Mapping[str, Any]) -> str:
    return str(body.get("metadata", {}).get("namespace", ""))


def _child_deployment(body: Mapping[str, Any]) -> DeploymentKey | None:
    """A child's deployment by its controller reference; one without any controller, by its
    deployment-name annotation: it may have lost its reference, and a pass looks at it."""
    return owner_key(body) or unowned_key(body)


def _pod_deployment(body: Mapping[str, Any]) -> DeploymentKey | None:
    """A pod names its deployment in an annotation (its owner is a StatefulSet or ReplicaSet)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    owner = annotations.get(names.ANNOTATION_OWNER_NAME)
    return (_namespace(body), str(owner)) if owner else None


def _no_deployment(body: Mapping[str, Any]) -> DeploymentKey | None:
    """A router ReplicaSet's changes reach its deployment through its pods' events."""
    return None
