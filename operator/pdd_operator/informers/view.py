"""The reconciler's view of the cluster, from the operator's own informers (no LIST calls in
a pass): the PDDeployments kopf hands it, our own objects, the fleet, and why a StatefulSet's
pods were refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdd_operator.api.names import DeploymentKey
from pdd_operator.informers.creation_events import CreationEvents
from pdd_operator.informers.fleet import FleetCache
from pdd_operator.informers.mount_events import MountFailures
from pdd_operator.informers.owned import OwnedObjects
from pdd_operator.planning.placement import Fleet
from pdd_operator.status.observe import (
    ChildKey,
    ChildSummary,
    PodSummary,
    ScalerSummary,
    owned_pods,
)
from pdd_operator.status.token import MountFailure


class IndexView:
    """Adapts the informers' stores to the reconciler's ClusterView."""

    def __init__(
        self,
        pdds: Mapping[DeploymentKey, Mapping[str, Any]],
        owned: OwnedObjects,
        fleet: FleetCache | None = None,
        creations: CreationEvents | None = None,
        mounts: MountFailures | None = None,
    ) -> None:
        self.pdds = pdds
        self.owned = owned
        self.fleet_cache = fleet or FleetCache(max_age=0)
        self.creations = creations if creations is not None else CreationEvents()  # empty: falsy
        self.mounts = mounts if mounts is not None else MountFailures()

    def pdd_body(self, key: DeploymentKey) -> Mapping[str, Any] | None:
        return self.pdds.get(key)

    def children(self, key: DeploymentKey) -> Mapping[ChildKey, ChildSummary]:
        """The children whose controller reference names this PDDeployment's uid (a name can
        be copied, and one of a deleted deployment's namesake is another object)."""
        uid = self._uid(key)
        return {s.key: s for s in self.owned.children_of(key) if uid and s.owner_uid == uid}

    def unowned_children(self, key: DeploymentKey) -> frozenset[ChildKey]:
        """Objects of the children's kinds and labels that name this PDDeployment in their
        annotation and have no controller: children that lost their owner reference, or
        copies of them (a look at their metadata tells which)."""
        return frozenset(s.key for s in self.owned.children_of(key) if not s.owner_uid)

    def pods(self, key: DeploymentKey) -> Sequence[PodSummary]:
        namespace = key[0]
        return owned_pods(
            self._uid(key),
            self.children(key).values(),
            lambda uid: self.owned.replicasets_of(namespace, uid),
            lambda uid: self.owned.pods_of(namespace, uid),
        )

    def scalers(self, key: DeploymentKey) -> Mapping[str, ScalerSummary]:
        """The deployment's scale targets by role (those its uid controls)."""
        uid = self._uid(key)
        return {s.role: s for s in self.owned.scalers_of(key) if s.owner_uid == uid and uid}

    def creation_refusal(self, workload_uid: str) -> str:
        return self.creations.refusal(workload_uid)

    def mount_failures(self, namespace: str, secret: str) -> Sequence[MountFailure]:
        return self.mounts.of(namespace, secret)

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
