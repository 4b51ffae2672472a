"""What every part of a pass reads and writes through: the operator's watch-fed indexes
(ClusterView), the API server (ApiWriter), the events it posts, its settings and metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.kube.resources import Kind
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.planning.placement import Fleet
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary, ScalerSummary
from pdd_operator.status.own_writes import OwnObjectWrites
from pdd_operator.status.token import MountFailure


class ClusterView(Protocol):
    """What the reconciler reads: the operator's watch-fed indexes."""

    def pdd_body(self, key: DeploymentKey) -> Mapping[str, Any] | None: ...
    def children(self, key: DeploymentKey) -> Mapping[ChildKey, ChildSummary]: ...
    def pods(self, key: DeploymentKey) -> Sequence[PodSummary]: ...
    def fleet(self) -> Fleet: ...
    def node_ready(self, name: str) -> bool | None: ...
    def scalers(self, key: DeploymentKey) -> Mapping[str, ScalerSummary]: ...
    # Objects of the children's kinds that name the deployment but have no controller: its
    # children that lost their owner reference, or copies (a look at each tells which).
    def unowned_children(self, key: DeploymentKey) -> frozenset[ChildKey]: ...
    # Why a workload short of pods has none: its controller's newest creation Event says.
    def creation_refusal(self, workload_uid: str) -> str: ...
    # Each pod's newest report that it cannot mount this Secret (FailedMount), newest first.
    def mount_failures(self, namespace: str, secret: str) -> Sequence[MountFailure]: ...


class ApiWriter(Protocol):
    """What the reconciler writes through: the API server (kube.client.KubeApi)."""

    def apply(
        self, obj: dict[str, Any], dry_run: bool = False, want_result: bool = True
    ) -> dict[str, Any]: ...
    def create_if_absent(self, obj: dict[str, Any]) -> bool: ...
    def owner_references(
        self, kind: Kind, namespace: str, name: str
    ) -> list[dict[str, Any]] | None: ...
    def object_metadata(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None: ...
    def delete(self, kind: Kind, namespace: str, name: str, uid: str = "") -> None: ...
    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str: ...
    def annotate_pod(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> dict[str, Any]: ...
    def patch_scaler_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    # The model's claims are read on each pass (nothing watches claims; Secrets are never
    # read: a missing one is learnt from the pods).
    def read_pvc(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    # Whether the gang scheduler's API is served (discovery), for instances over nodes.
    def serves(self, api: str, plural: str = "") -> bool: ...


EventSink = Callable[[Mapping[str, Any], str, str, str], None]  # body, type, reason, message


@dataclass(frozen=True)
class Ports:
    """The parts' shared means: reads, writes, events, settings, metrics, and the versions
    this operator's own writes to children and pods produced (their watch events ask no
    pass)."""

    kube: ApiWriter
    view: ClusterView
    settings: OperatorSettings
    emit_event: EventSink
    metrics: OperatorMetrics | None = None
    own_object_writes: OwnObjectWrites = field(default_factory=OwnObjectWrites)

    def count_write(self, verb: str, kind: str) -> None:
        if self.metrics:
            self.metrics.writes.labels(verb=verb, kind=kind).inc()


def key_of(pdd: PDDeployment) -> DeploymentKey:
    return (pdd.namespace, pdd.name)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
