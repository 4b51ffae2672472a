"""The reconciler's view of the cluster: kopf's watch-fed indexes of our own objects and the
fleet watch's Nodes and GPU pods (no LIST calls in a pass)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from pdd_operator.api.names import DeploymentKey
from pdd_operator.handlers.fleet import FleetCache
from pdd_operator.planning.placement import Fleet
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
        node = self.fleet_cache.node(name)
        if node is None:
            return None
        conditions = node["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def fleet(self) -> Fleet:
        """Every node's GPUs, as the planner indexes them (its own pods included as used)."""
        return self.fleet_cache.fleet()
