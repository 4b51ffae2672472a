"""The reconciler's view of the cluster, read from kopf's watch-fed indexes (no LIST calls)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_operator.api.names import DeploymentKey
from pdd_operator.planning.node_facts import gpu_usage, node_facts, with_usage
from pdd_operator.planning.placement import Fleet, NodeFacts
from pdd_operator.status.observe import (
    ChildKey,
    ChildSummary,
    PodSummary,
    ScalerSummary,
    owned_pods,
)

CHILD_INDEX_PREFIX = "child_"


def _values(index: kopf.Index[Any, Any], key: Any) -> list[Any]:
    try:
        return list(index[key])
    except KeyError:
        return []


class FleetCache:
    """GPU use per node across the whole fleet, re-indexed at most every `max_age` seconds.

    Walking every Node and every GPU pod, and grouping the nodes into domains, costs
    milliseconds at fleet size; doing it once per reconcile of every deployment would be
    quadratic. GPU use may be a second stale (the scheduler has the last word, and slices
    planned meanwhile are counted by the reconciler's reservations); a Node change rebuilds
    the snapshot at the next pass.
    """

    def __init__(self, max_age: float = 1.0) -> None:
        self.max_age = max_age
        self._at = -1e9
        self._fleet = Fleet(())
        self._nodes: dict[str, Mapping[str, Any]] = {}
        self._nodes_changed = True
        self._bases: list[NodeFacts] = []

    def saw_node(self, name: str, compact: Mapping[str, Any]) -> None:
        """A Node event: rebuild at the next pass when what the planner reads of it changed
        (a snapshot without a node that just joined would place a slice by the wrong fleet);
        status heartbeats that change nothing of that keep the snapshot."""
        if self._nodes.get(name) != compact:
            self._nodes[name] = compact
            self._nodes_changed = True
            self._at = -1e9

    def fleet(self, indexes: Mapping[str, kopf.Index[Any, Any]]) -> Fleet:
        now = time.monotonic()
        if now - self._at > self.max_age:
            node_index = indexes["node_index"]
            # Nodes change rarely; only GPU use is recounted every time. A deleted Node is
            # noticed by the count (kopf drops it from the index without an index call).
            if self._nodes_changed or len(self._bases) != len(node_index):
                self._bases = node_facts(n for s in node_index.values() for n in s)
                self._nodes_changed = False
            pods = (pod for store in indexes["gpu_pod_index"].values() for pod in store)
            usage = gpu_usage(pods, LABEL_DEPLOYMENT)
            self._fleet = Fleet(with_usage(self._bases, usage.used), usage.held)
            self._at = now
        return self._fleet


class IndexView:
    """Adapts the kopf indexes passed to a handler to the reconciler's ClusterView."""

    def __init__(
        self, indexes: Mapping[str, kopf.Index[Any, Any]], fleet: FleetCache | None = None
    ) -> None:
        self.indexes = indexes
        self.fleet_cache = fleet or FleetCache(max_age=0)

    def pdd_body(self, key: DeploymentKey) -> Mapping[str, Any] | None:
        bodies = _values(self.indexes["pdd_index"], key)
        return bodies[0] if bodies else None

    def children(self, key: DeploymentKey) -> Mapping[ChildKey, ChildSummary]:
        """The children whose controller reference names this PDDeployment's uid (a name can
        be copied, and one of a deleted deployment's namesake is another object)."""
        uid = self._uid(key)
        out: dict[ChildKey, ChildSummary] = {}
        for index_name, index in self.indexes.items():
            if index_name.startswith(CHILD_INDEX_PREFIX):
                for summary in _values(index, key):
                    if summary.owner_uid == uid:
                        out[summary.key] = summary
        return out

    def pods(self, key: DeploymentKey) -> Sequence[PodSummary]:
        namespace = key[0]
        return owned_pods(
            self._uid(key),
            self.children(key).values(),
            lambda uid: _values(self.indexes["replicaset_index"], (namespace, uid)),
            lambda uid: _values(self.indexes["pod_index"], (namespace, uid)),
        )

    def scalers(self, key: DeploymentKey) -> Mapping[str, ScalerSummary]:
        """The deployment's scale targets by role (those its uid controls)."""
        uid = self._uid(key)
        index = self.indexes.get("scaler_index")
        found = _values(index, key) if index is not None else []
        return {s.role: s for s in found if s.owner_uid == uid and uid}

    def _uid(self, key: DeploymentKey) -> str:
        body = self.pdd_body(key)
        return str(body.get("metadata", {}).get("uid", "")) if body else ""

    def node_ready(self, name: str) -> bool | None:
        nodes = _values(self.indexes["node_index"], name)
        if not nodes:
            return None
        conditions = nodes[0]["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def fleet(self) -> Fleet:
        """Every node's GPUs, as the planner indexes them (its own pods included as used)."""
        return self.fleet_cache.fleet(self.indexes)
