"""The reconciler's view of the cluster, read from kopf's watch-fed indexes (no LIST calls)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from pdd_operator.api import names
from pdd_operator.planning.node_facts import node_facts
from pdd_operator.planning.placement import NodeFacts
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary

Key = tuple[str, str]
CHILD_INDEX_PREFIX = "child_"


def _values(index: kopf.Index[Any, Any], key: Any) -> list[Any]:
    try:
        return list(index[key])
    except KeyError:
        return []


class IndexView:
    """Adapts the kopf indexes passed to a handler to the reconciler's ClusterView."""

    def __init__(self, indexes: Mapping[str, kopf.Index[Any, Any]]) -> None:
        self.indexes = indexes

    def pdd_body(self, key: Key) -> Mapping[str, Any] | None:
        bodies = _values(self.indexes["pdd_index"], key)
        return bodies[0] if bodies else None

    def children(self, key: Key) -> Mapping[ChildKey, ChildSummary]:
        out: dict[ChildKey, ChildSummary] = {}
        for index_name, index in self.indexes.items():
            if index_name.startswith(CHILD_INDEX_PREFIX):
                for summary in _values(index, key):
                    out[summary.key] = summary
        return out

    def pods(self, key: Key) -> Sequence[PodSummary]:
        return _values(self.indexes["pod_index"], key)

    def node_ready(self, name: str) -> bool | None:
        nodes = _values(self.indexes["node_index"], name)
        if not nodes:
            return None
        conditions = nodes[0]["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def node_facts(self, instance_id: str) -> Sequence[NodeFacts]:
        nodes = [node for store in self.indexes["node_index"].values() for node in store]
        pods = [pod for store in self.indexes["gpu_pod_index"].values() for pod in store]
        return node_facts(nodes, pods, (names.LABEL_DEPLOYMENT, instance_id))
