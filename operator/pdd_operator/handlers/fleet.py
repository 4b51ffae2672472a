"""The fleet the planner places on: every Node and every bound pod that holds GPUs.

Listed and watched by the operator's own informers (handlers/listwatch.py), keeping a few
hundred bytes per object (planning/compact.py). Only pods bound to a node are asked for (a
field selector), and only others' (a label selector): the GPUs of our own pods are counted
from the owned-pod informer's summaries. Which pods hold GPUs is not something the API server
can select.
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
from pdd_operator.handlers.listwatch import Collection
from pdd_operator.kube.resources import NODE, POD
from pdd_operator.planning.compact import compact_node, compact_pod
from pdd_operator.planning.node_facts import GpuUsage, gpu_usage, node_facts, with_usage
from pdd_operator.planning.placement import Fleet, NodeFacts
from pdd_operator.status.observe import PodSummary

BOUND_PODS = ("fieldSelector", "spec.nodeName!=")
# Our own pods come from the owned-pod informer, which decodes them anyway: one decoding of
# each of our pod events, not two.
NOT_OURS = ("labelSelector", f"app.kubernetes.io/managed-by!={names.MANAGED_BY}")
OwnGpuPods = Callable[[], Iterable[tuple[PodSummary, DeploymentKey | None]]]
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

    def __init__(
        self,
        state: FleetState | None = None,
        max_age: float = 1.0,
        own_pods: OwnGpuPods | None = None,
    ) -> None:
        self.state = state or FleetState()
        self.max_age = max_age
        self.own_pods = own_pods or (lambda: ())
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
            _add_own(usage, self.own_pods())
            self._fleet = Fleet(with_usage(self._bases, usage.used), usage.held)
            self._at = now
        return self._fleet

    def node(self, name: str) -> dict[str, Any] | None:
        return self.state.nodes.get(name)


def _add_own(usage: GpuUsage, pods: Iterable[tuple[PodSummary, DeploymentKey | None]]) -> None:
    """Our bound, unfinished pods' GPUs, as gpu_usage counts the others'."""
    for pod, key in pods:
        if pod.node and not pod.failed and pod.gpus:
            usage.add(pod.node, pod.gpus, key)


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
            )
            for ns in (tuple(namespaces) or ("",))
        ),
    ]
