"""The fleet the planner places on: every Node and every bound pod that holds GPUs.

The operator lists and watches these two collections itself, one thread each, keeping a few
hundred bytes per object (planning/compact.py). kopf is not used for them: it handles every
watched object as a task of its own, and on 2,000 nodes with a kubelet's ordinary traffic
(status reports, three daemon pods a node, foreign GPU pods) its Pod and Node streams never
caught up, so no PDDeployment was reconciled at all. Only pods bound to a node are asked for
(a field selector); which of them hold GPUs is not something the API server can select.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_operator.kube.client import KubeApi, WatchExpired, api_error_message
from pdd_operator.kube.resources import NODE, POD
from pdd_operator.planning.compact import compact_node, compact_pod
from pdd_operator.planning.node_facts import gpu_usage, node_facts, with_usage
from pdd_operator.planning.placement import Fleet, NodeFacts

log = logging.getLogger(__name__)

BOUND_PODS = ("fieldSelector", "spec.nodeName!=")
Compactor = Callable[[Mapping[str, Any]], dict[str, Any] | None]


class CompactStore:
    """Compact objects by key, written by one watch thread and read by the passes.

    `version` counts the changes of what is kept, so a reader can tell that its snapshot is
    stale without comparing objects (a node's heartbeat changes nothing that is kept)."""

    def __init__(self, key: Callable[[Mapping[str, Any]], str], compact: Compactor) -> None:
        self._key = key
        self._compact = compact
        self._items: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.version = 0

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        key = self._key(body)
        kept = None if event_type == "DELETED" else self._compact(body)
        with self._lock:
            if kept is None:
                changed = self._items.pop(key, None) is not None
            else:
                changed = self._items.get(key) != kept
                self._items[key] = kept
            self.version += changed

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """Replace everything with a fresh list (objects deleted while no watch ran go)."""
        items = {self._key(b): kept for b in bodies if (kept := self._compact(b)) is not None}
        with self._lock:
            if items != self._items:
                self._items = items
                self.version += 1

    def get(self, key: str) -> dict[str, Any] | None:
        return self._items.get(key)

    def values(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)


def _name(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["name"])


def _uid(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["uid"])


@dataclass
class FleetState:
    nodes: CompactStore = field(default_factory=lambda: CompactStore(_name, compact_node))
    # GPU pods, one store per watched namespace ("" for all of them): each is listed anew on
    # its own, which must not drop the others' pods.
    pods_by_namespace: dict[str, CompactStore] = field(default_factory=dict)

    def pod_store(self, namespace: str = "") -> CompactStore:
        return self.pods_by_namespace.setdefault(namespace, CompactStore(_uid, compact_pod))

    def gpu_pods(self) -> list[dict[str, Any]]:
        return [pod for store in list(self.pods_by_namespace.values()) for pod in store.values()]


class FleetCache:
    """GPU use per node across the whole fleet, recounted at most every `max_age` seconds.

    Walking every Node and every GPU pod, and grouping the nodes into domains, costs
    milliseconds at fleet size; doing it once per reconcile of every deployment would be
    quadratic. GPU use may be a second stale (the scheduler has the last word, and slices
    planned meanwhile are counted by the reconciler's reservations); a change of what the
    planner reads of a Node rebuilds the node facts at the next pass.
    """

    def __init__(self, state: FleetState | None = None, max_age: float = 1.0) -> None:
        self.state = state or FleetState()
        self.max_age = max_age
        self._at = -1e9
        self._fleet = Fleet(())
        self._nodes_version = -1
        self._bases: list[NodeFacts] = []

    def fleet(self) -> Fleet:
        now = time.monotonic()
        nodes = self.state.nodes
        if now - self._at > self.max_age or nodes.version != self._nodes_version:
            if nodes.version != self._nodes_version:
                self._nodes_version = nodes.version
                self._bases = node_facts(nodes.values())
            usage = gpu_usage(self.state.gpu_pods(), LABEL_DEPLOYMENT)
            self._fleet = Fleet(with_usage(self._bases, usage.used), usage.held)
            self._at = now
        return self._fleet

    def node(self, name: str) -> dict[str, Any] | None:
        return self.state.nodes.get(name)


@dataclass(frozen=True)
class Collection:
    what: str  # for log lines
    path: str
    query: tuple[tuple[str, str], ...]
    store: CompactStore


class FleetWatch:
    """Lists, then watches, Nodes and bound Pods into a FleetState, a thread per collection."""

    PAGE = 500
    WATCH_TIMEOUT_S = 300

    def __init__(self, kube: KubeApi, state: FleetState, namespaces: Iterable[str] = ()) -> None:
        """`namespaces`: the pods of these only (an operator confined to them by its Roles
        may not list pods elsewhere, and so counts only their GPU use); none: all."""
        self.kube = kube
        self.state = state
        self.collections = (
            Collection("nodes", NODE.path(None), (), state.nodes),
            *(
                Collection(
                    f"bound pods{f' in {ns}' if ns else ''}",
                    POD.path(ns or None),
                    (BOUND_PODS,),
                    state.pod_store(ns),
                )
                for ns in (tuple(namespaces) or ("",))
            ),
        )
        self._stop = threading.Event()
        self._listed: set[str] = set()
        self._ready = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start the threads; call from the event loop (the first lists set `synced`)."""
        self._loop = asyncio.get_running_loop()
        for collection in self.collections:
            threading.Thread(
                target=self._follow,
                args=(collection,),
                name=f"pdd-watch-{collection.what}",
                daemon=True,
            ).start()

    async def synced(self) -> None:
        """Wait until both collections were listed once (a plan on half a fleet is wrong)."""
        await self._ready.wait()

    def stop(self) -> None:
        self._stop.set()

    def _follow(self, collection: Collection) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist(collection)
                failures = 0
                while not self._stop.is_set():
                    version = self._watch(collection, version)
            except WatchExpired:
                log.info("the watch of %s expired; listing them again", collection.what)
            except Exception as err:  # the API server went away, or refused: try again
                failures += 1
                delay = min(2.0**failures, 30.0)
                log.warning(
                    "watching %s failed (%s); listing again in %.0fs",
                    collection.what,
                    api_error_message(err),
                    delay,
                )
                self._stop.wait(delay)

    def _relist(self, collection: Collection) -> str:
        started = time.monotonic()
        bodies: list[Mapping[str, Any]] = []
        token, version = "", ""
        while True:
            page = self.kube.list_page(collection.path, self.PAGE, token, collection.query)
            bodies.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = str(meta.get("continue") or "")
            if not token:
                break
        collection.store.reset(bodies)
        log.info(
            "listed %d %s in %.1fs (%d kept)",
            len(bodies),
            collection.what,
            time.monotonic() - started,
            len(collection.store),
        )
        self._mark_listed(collection)
        return version

    def _mark_listed(self, collection: Collection) -> None:
        self._listed.add(collection.what)
        if len(self._listed) == len(self.collections) and self._loop is not None:
            self._loop.call_soon_threadsafe(self._ready.set)

    def _watch(self, collection: Collection, version: str) -> str:
        """Follow one watch until the API server ends it; the version to go on from."""
        events = self.kube.watch(collection.path, version, self.WATCH_TIMEOUT_S, collection.query)
        for event in events:
            kind, body = event.get("type"), event.get("object") or {}
            if kind != "BOOKMARK":
                collection.store.apply(str(kind), body)
            version = str((body.get("metadata") or {}).get("resourceVersion") or version)
            if self._stop.is_set():
                break
        return version
