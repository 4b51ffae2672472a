"""The fleet the planner places on: every Node and every bound pod that holds GPUs.

Listed and watched by the operator's own informers (informers/listwatch.py), keeping a few
hundred bytes per object (planning/compact.py). Only pods bound to a node are asked for (a
field selector), and only others' (a label selector): the GPUs of our own pods are counted
from the owned-pod informer's summaries. Which pods hold GPUs is not something the API server
can select. Both feed one ledger of GPUs in use, kept current on each event, so that the
planner's snapshot costs a copy of the counts, not a walk over every GPU pod of the fleet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.informers.listwatch import Collection
from pdd_operator.kube.decoding import PODS
from pdd_operator.kube.resources import NODE, POD
from pdd_operator.planning.compact import compact_node, compact_pod
from pdd_operator.planning.node_facts import (
    GpuUsage,
    Holding,
    node_facts,
    pod_holding,
    with_usage,
)
from pdd_operator.planning.placement import Fleet, NodeFacts
from pdd_operator.status.observe import PodSummary

BOUND_PODS = ("fieldSelector", "spec.nodeName!=")
# Our own pods come from the owned-pod informer, which decodes them anyway: one decoding of
# each of our pod events, not two.
NOT_OURS = ("labelSelector", f"app.kubernetes.io/managed-by!={names.MANAGED_BY}")
Compactor = Callable[[Mapping[str, Any]], dict[str, Any] | None]
KeptChange = Callable[[str, dict[str, Any] | None], None]  # key, what is kept now (None: gone)


class CompactStore:
    """Compact objects by key, written by one watch thread and read by the passes.

    `version` counts the changes of what is kept, so a reader can tell that its snapshot is
    stale without comparing objects (a node's heartbeat changes nothing that is kept)."""

    def __init__(
        self,
        key: Callable[[Mapping[str, Any]], str],
        compact: Compactor,
        on_change: KeptChange | None = None,
    ) -> None:
        self._key = key
        self._compact = compact
        self._on_change = on_change
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
        if changed and self._on_change is not None:
            self._on_change(key, kept)

    def reset(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """Replace everything with a fresh list (objects deleted while no watch ran go)."""
        items = {self._key(b): kept for b in bodies if (kept := self._compact(b)) is not None}
        with self._lock:
            old, self._items = self._items, items
            self.version += items != old
        if self._on_change is not None:
            for key in old.keys() - items.keys():
                self._on_change(key, None)
            for key, kept in items.items():
                if old.get(key) != kept:
                    self._on_change(key, kept)

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


class GpuLedger:
    """GPUs in use per node and per deployment, kept current by the pod stores: each tells
    what one pod holds now (keyed by who watches it and the pod's uid)."""

    def __init__(self) -> None:
        self._holdings: dict[tuple[str, str], Holding] = {}
        self._usage = GpuUsage({}, {})
        self._lock = threading.Lock()
        self.version = 0

    def put(self, key: tuple[str, str], holding: Holding | None) -> None:
        with self._lock:
            old = self._holdings.get(key)
            if old == holding:
                return
            if old is not None:
                self._usage.remove(*old)
                del self._holdings[key]
            if holding is not None:
                self._usage.add(*holding)
                self._holdings[key] = holding
            self.version += 1

    def usage(self) -> GpuUsage:
        """A copy of the counts, the planner's to keep."""
        with self._lock:
            return self._usage.copy()


@dataclass
class FleetState:
    nodes: CompactStore = field(default_factory=lambda: CompactStore(_name, compact_node))
    # GPU pods, one store per watched namespace ("" for all of them): each is listed anew on
    # its own, which must not drop the others' pods.
    pods_by_namespace: dict[str, CompactStore] = field(default_factory=dict)
    gpus: GpuLedger = field(default_factory=GpuLedger)

    def pod_store(self, namespace: str = "") -> CompactStore:
        # Called while the collections are set up, before any watch thread runs.
        if namespace not in self.pods_by_namespace:
            self.pods_by_namespace[namespace] = CompactStore(_uid, compact_pod, self._others_pod)
        return self.pods_by_namespace[namespace]

    def _others_pod(self, uid: str, pod: dict[str, Any] | None) -> None:
        self.gpus.put(("others", uid), pod_holding(pod, LABEL_DEPLOYMENT) if pod else None)

    def own_pod(self, uid: str, pod: PodSummary | None, key: DeploymentKey | None) -> None:
        """One of our pods as the owned-pod informer now summarises it (None: gone)."""
        holding = None
        if pod is not None and pod.node and not pod.failed and pod.gpus:
            holding = (pod.node, pod.gpus, key)
        self.gpus.put(("ours", uid), holding)


class FleetCache:
    """The planner's snapshot of the fleet: the nodes with their GPUs in use.

    Rebuilt when a Node changes what the planner reads, and when GPU use changed, at most
    every `max_age` seconds: every pass of every deployment reads it, and a snapshot is what
    makes a plan's domains (grouped once per snapshot) shared. GPU use may be a second stale
    (the scheduler has the last word, and slices planned meanwhile are counted by the
    reconciler's reservations).
    """

    def __init__(self, state: FleetState | None = None, max_age: float = 1.0) -> None:
        self.state = state or FleetState()
        self.max_age = max_age
        self._at = -1e9
        self._fleet = Fleet(())
        self._nodes_version = -1
        self._gpus_version = -1
        self._bases: list[NodeFacts] = []

    def fleet(self) -> Fleet:
        now = time.monotonic()
        nodes, gpus = self.state.nodes, self.state.gpus
        nodes_changed = nodes.version != self._nodes_version
        if nodes_changed:
            self._nodes_version = nodes.version
            self._bases = node_facts(nodes.values())
        stale = gpus.version != self._gpus_version and now - self._at > self.max_age
        if nodes_changed or stale:
            self._gpus_version = gpus.version
            usage = gpus.usage()
            last = () if nodes_changed else self._fleet.nodes
            self._fleet = Fleet(with_usage(self._bases, usage.used, last), usage.held)
            self._at = now
        return self._fleet

    def node(self, name: str) -> dict[str, Any] | None:
        return self.state.nodes.get(name)


def fleet_collections(state: FleetState, namespaces: Iterable[str] = ()) -> list[Collection]:
    """Every Node, and the bound pods of `namespaces` (none: of all). An operator confined to
    namespaces by its Roles may not list pods elsewhere, and so counts only their GPU use."""
    return [
        Collection("nodes", NODE.path(None), (), state.nodes),
        *(
            Collection(
                f"bound pods{f' in {ns}' if ns else ''}",
                POD.path(ns or None),
                (BOUND_PODS, NOT_OURS),
                state.pod_store(ns),
                PODS,
            )
            for ns in (tuple(namespaces) or ("",))
        ),
    ]
