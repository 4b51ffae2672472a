"""An in-memory API server and operator indexes, for unit tests of the Reconciler.

A test double of the operator's own two protocols, `reconcile.ApiWriter` (what it writes) and
`reconcile.ClusterView` (its watch-fed indexes), not of the Kubernetes API: the integration
tier runs the real API server. What the Reconciler's logic depends on is kept: applied objects
are stored as server-side apply stores them (managedFields of the operator's field manager), a
no-op apply keeps the resourceVersion, resourceVersions are opaque and unordered, a RoleBinding
is refused while its Role is missing, a status write is a merge patch, and the indexes
summarise what is stored unless a test holds a watch back.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import API_VERSION, SCALER_KIND
from pdd_operator.kube.resources import CHILD_KINDS, Kind
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.planning.placement import Fleet
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.observe import (
    ChildKey,
    ChildSummary,
    PodSummary,
    ScalerSummary,
    summarize_child,
    summarize_scaler,
)
from pdd_operator.status.refusals import newest_creation, refusal_message
from pdd_operator.status.token import MountFailure

MANAGER = OperatorSettings.field_manager
INDEXED_KINDS = frozenset(kind.kind for kind in CHILD_KINDS)  # the operator's child indexes
ObjectKey = tuple[str, str, str, str]  # namespace, apiVersion, kind, name


def fields_v1(value: Any) -> dict[str, Any]:
    """A fieldsV1 set owning every field of `value`, lists as atomic (a form the server uses
    for atomic lists; good enough to stand for what an apply of `value` owns)."""
    if isinstance(value, dict):
        return {f"f:{k}": fields_v1(v) for k, v in value.items()}
    return {}


def applied(obj: Mapping[str, Any], version: str = "rv-1") -> dict[str, Any]:
    """`obj` as the server stores it after the operator applied it."""
    live = copy.deepcopy(dict(obj))
    owned = {k: v for k, v in live.items() if k not in ("apiVersion", "kind")}
    owned["metadata"] = {k: v for k, v in live["metadata"].items() if k != "name"}
    entry = {"manager": MANAGER, "operation": "Apply", "fieldsV1": fields_v1(owned)}
    live["metadata"]["managedFields"] = [entry]
    live["metadata"]["resourceVersion"] = version
    live["metadata"]["uid"] = f"uid-{live['metadata']['name']}"
    live["metadata"]["generation"] = 1
    return live


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: objects merge, anything else replaces, null removes."""
    merged = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def forbidden(message: str) -> ApiException:
    err = ApiException(status=403, reason="Forbidden")
    err.body = f'{{"kind": "Status", "code": 403, "reason": "Forbidden", "message": "{message}"}}'
    return err


def name_taken(kind: str, name: str) -> ApiException:
    """What the chart's name-guard admission policy answers an apply that would make an
    existing object, not the applying PDDeployment's, its child."""
    err = ApiException(status=422, reason="Invalid")
    message = (
        f"ValidatingAdmissionPolicy 'pdd-operator-child-names' denied request: "
        f"pdd.dev/name-taken: {kind} {name} exists and is not this PDDeployment's"
    )
    err.body = f'{{"kind": "Status", "code": 422, "reason": "Invalid", "message": "{message}"}}'
    return err


def _controller_uid(obj: Mapping[str, Any]) -> str:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r.get("uid", "") for r in refs if r.get("controller")), "")


def _guard_admits(stored: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    """The chart's name-guard policy: an apply keeps the object's controller, or adopts an
    object without one that carries the proof of having been the claiming deployment's (its
    deployment label, its name annotation, an apply by the operator's field manager)."""
    if _controller_uid(stored) == _controller_uid(obj):
        return True
    meta = stored["metadata"]
    claimed = next(r["name"] for r in obj["metadata"]["ownerReferences"] if r.get("controller"))
    return (
        not _controller_uid(stored)
        and names.LABEL_DEPLOYMENT in (meta.get("labels") or {})
        and (meta.get("annotations") or {}).get(names.ANNOTATION_OWNER_NAME) == claimed
        and any(
            m.get("manager") == MANAGER and m.get("operation") == "Apply"
            for m in meta.get("managedFields") or []
        )
    )


class FakeCluster:
    """The API server and the operator's indexes in one. `name_guard`: the chart's name-guard
    admission policy is installed (an apply may not make an existing object, not the
    PDDeployment's, its child)."""

    def __init__(
        self,
        *bodies: Mapping[str, Any],
        respell: bool = False,
        apply_error: Exception | None = None,
        slow_kinds: Mapping[str, float] | None = None,
        name_guard: bool = False,
    ) -> None:
        self.name_guard = name_guard
        self.stored: dict[DeploymentKey, dict[str, Any]] = {}  # PDDeployments on the server
        self.indexed: dict[DeploymentKey, dict[str, Any]] = {}  # as the index last saw them
        self.hold_pdd_watch = False  # status writes reach the server, not the index
        self.objects: dict[ObjectKey, dict[str, Any]] = {}
        self.index_lag: set[ChildKey] = set()  # children whose watch event has not come yet
        self._indexed_children: dict[ObjectKey, ChildSummary] = {}
        self.pods_of: dict[DeploymentKey, list[PodSummary]] = {}
        # The pods of each StatefulSet (by its key) as their kubelets last reported them.
        self.workload_pods: dict[ObjectKey, list[PodSummary]] = {}
        self.nodes_ready: dict[str, bool] = {}
        self.fleet_snapshot = Fleet(())
        self.respell = respell  # the server reads one owned value back in another spelling
        self.apply_error = apply_error
        self.status_error: Exception | None = None
        self.annotate_error: Exception | None = None
        self.slow_kinds = dict(slow_kinds or {})  # seconds an apply of the kind takes
        # Every request that writes, in the order the server received them: (verb, kind, name).
        self.writes: list[tuple[str, str, str]] = []
        self.applies: list[tuple[str, str, bool]] = []  # kind, name, answer decoded
        self.reads: list[tuple[str, str]] = []  # kind, name of each owner look-up
        self.status_writes: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.versions = 0
        # The model's claims as the server has them (Secrets are never read).
        self.pvcs: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: list[tuple[str, str, str]] = []  # (kind, namespace, name)
        self.read_error: Exception | None = None
        # The kubelets' FailedMount reports of missing Secrets, by (namespace, Secret).
        self.mount_reports: dict[tuple[str, str], list[MountFailure]] = {}
        # Events the API server holds, by the uid of the object they are about.
        self.object_events: dict[str, list[dict[str, Any]]] = {}
        # APIs the fake API server serves (discovery), as group/version or group.
        self.served_apis: set[str] = {"scheduling.k8s.io/v1alpha1"}
        self._lock = threading.Lock()  # applies of one wave arrive from several threads
        for body in bodies:
            self.add(body)

    # ------------------------------------------------------------------ set-up and changes

    def add(self, body: Mapping[str, Any]) -> DeploymentKey:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.stored[key] = copy.deepcopy(dict(body))
        self.indexed[key] = copy.deepcopy(dict(body))
        return key

    def update_spec(self, key: DeploymentKey, spec: Mapping[str, Any]) -> None:
        """A user's edit of the spec: a new generation and version, seen by the index."""
        body = merge_patch(self.stored[key], {"spec": spec})
        body["metadata"]["generation"] = int(body["metadata"].get("generation", 1)) + 1
        body["metadata"]["resourceVersion"] = self.next_version()
        self.stored[key] = body
        self.indexed[key] = copy.deepcopy(body)

    def delete_deployment(self, key: DeploymentKey) -> None:
        """Gone from the server and the index (its children are the garbage collector's)."""
        self.stored.pop(key, None)
        self.indexed.pop(key, None)

    def deliver_pdd_watch(self) -> None:
        self.indexed = copy.deepcopy(self.stored)

    def child(self, namespace: str, key: ChildKey) -> dict[str, Any]:
        return self.objects[(namespace, *key)]

    def changed_by_hand(
        self, namespace: str, key: ChildKey, change: Callable[[dict[str, Any]], None]
    ) -> None:
        change(self.objects[(namespace, *key)])
        self.objects[(namespace, *key)]["metadata"]["resourceVersion"] = self.next_version()

    def deleted_by_hand(self, namespace: str, key: ChildKey) -> None:
        del self.objects[(namespace, *key)]

    def index_copy(self, namespace: str, live: Mapping[str, Any]) -> None:
        """The watch delivers this copy of a child to the index."""
        key = (namespace, live["apiVersion"], live["kind"], live["metadata"]["name"])
        self._indexed_children[key] = summarize_child(live, MANAGER)

    def workloads_ready(self, namespace: str) -> None:
        """Every replica's pod is Ready at its workload's latest revision, and the StatefulSet
        and Deployment controllers report it."""
        for key, live in self.objects.items():
            if key[0] == namespace and key[2] in ("StatefulSet", "Deployment"):
                replicas = live["spec"].get("replicas", 1)
                if key[2] == "StatefulSet":  # pods that were there keep what was asked of them
                    kept = {pod.name: pod for pod in self.workload_pods.get(key, [])}
                    self.workload_pods[key] = [
                        kept.get(pod.name, pod) for pod in ready_pods(live, replicas, "r")
                    ]
                live["status"] = {
                    "observedGeneration": live["metadata"]["generation"],
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "updatedReplicas": replicas,
                    "currentRevision": "r",
                    "updateRevision": "r",
                }
                live["metadata"]["resourceVersion"] = self.next_version()

    def next_version(self) -> str:
        """Opaque and unordered, as the API promises: only equality may be used."""
        with self._lock:
            self.versions += 1
            return f"rv-{'qzmkdt'[self.versions % 6]}{self.versions}"

    # ------------------------------------------------------------------ ApiWriter

    def apply(
        self, obj: dict[str, Any], dry_run: bool = False, want_result: bool = True
    ) -> dict[str, Any]:
        namespace, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
        with self._lock:
            self.writes.append(("apply", obj["kind"], name))
            self.applies.append((obj["kind"], name, want_result))
        if self.apply_error is not None:
            raise self.apply_error
        time.sleep(self.slow_kinds.get(obj["kind"], 0.0))
        if obj["kind"] == "RoleBinding" and not self._has_role(namespace, obj["roleRef"]):
            raise forbidden(f"RoleBinding {name}: its Role does not exist")
        if self.respell and obj["kind"] == "Service":  # an owned value the render lacks
            obj = {**obj, "metadata": {**obj["metadata"], "labels": {"respelled": "x"}}}
        key = (namespace, obj["apiVersion"], obj["kind"], name)
        stored = self.objects.get(key)
        guarded = self.name_guard and stored is not None
        if guarded and not _guard_admits(stored or {}, obj):
            raise name_taken(obj["kind"], name)
        live = applied(obj, self.next_version())
        if stored is not None and "status" in stored:  # an apply leaves status alone
            live["status"] = stored["status"]
        if stored is not None and _without_version(stored) == _without_version(live):
            live = stored  # a no-op apply: the server keeps the version
        self.objects[key] = live
        return copy.deepcopy(live if want_result else {"metadata": live["metadata"]})

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), obj["apiVersion"], obj["kind"], meta["name"])
        with self._lock:
            self.writes.append(("create", obj["kind"], meta["name"]))
        if key in self.objects:
            return False
        created = copy.deepcopy(obj)
        created["metadata"].setdefault("uid", f"uid-{meta['name']}")
        self.objects[key] = created
        return True

    def owner_references(
        self, kind: Kind, namespace: str, name: str
    ) -> list[dict[str, Any]] | None:
        with self._lock:
            self.reads.append((kind.kind, name))
        live = self.objects.get((namespace, kind.api_version, kind.kind, name))
        if live is None:
            return None
        return copy.deepcopy(live["metadata"].get("ownerReferences") or [])

    def object_metadata(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self.reads.append((kind.kind, name))
        live = self.objects.get((namespace, kind.api_version, kind.kind, name))
        return copy.deepcopy(live["metadata"]) if live is not None else None

    def delete(self, kind: Kind, namespace: str, name: str, uid: str = "") -> None:
        with self._lock:
            self.writes.append(("delete", kind.kind, name))
        key = (namespace, kind.api_version, kind.kind, name)
        live = self.objects.get(key)
        if live is not None and uid and live["metadata"].get("uid") != uid:
            return  # the uid precondition: another object holds the name now
        self.objects.pop(key, None)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        with self._lock:
            self.writes.append(("status", "PDDeployment", name))
        if self.status_error is not None:
            raise self.status_error
        if (namespace, name) not in self.stored:
            return ""
        self.status_writes.append(copy.deepcopy(status))
        body = merge_patch(self.stored[(namespace, name)], {"status": status})
        body["metadata"]["resourceVersion"] = version = self.next_version()
        self.stored[(namespace, name)] = body
        if not self.hold_pdd_watch:
            self.indexed[(namespace, name)] = copy.deepcopy(body)
        return version

    def patch_scaler_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        with self._lock:
            self.writes.append(("status", "PDDRoleScaler", name))
        key = (namespace, API_VERSION, SCALER_KIND, name)
        if key in self.objects:
            self.objects[key] = merge_patch(self.objects[key], {"status": status})

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        """What an HPA's write to a PDDRoleScaler's /scale does: its spec.replicas."""
        key = (namespace, API_VERSION, SCALER_KIND, name)
        self.objects[key] = merge_patch(self.objects[key], {"spec": {"replicas": replicas}})

    def annotate_pod(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> dict[str, Any]:
        with self._lock:
            self.writes.append(("annotate", "Pod", name))
        if self.annotate_error is not None:
            raise self.annotate_error
        request = annotations.get(names.ANNOTATION_PROBE_REQUEST)
        for pods in (*self.pods_of.values(), *self.workload_pods.values()):
            for i, pod in enumerate(pods):
                if pod.name == name and request is not None:
                    pods[i] = replace(pod, probe_request=request)
        return {}  # no resourceVersion: nothing watches this fake's pods

    def serves(self, api: str, plural: str = "") -> bool:
        self.reads.append(("APIGroup", "", api))
        return api in self.served_apis

    def read_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(("PersistentVolumeClaim", namespace, name))
        if self.read_error is not None:
            raise self.read_error
        found = self.pvcs.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    # ------------------------------------------------------------------ ClusterView

    def pdd_body(self, key: DeploymentKey) -> Mapping[str, Any] | None:
        return self.indexed.get(key)

    def children(self, key: DeploymentKey) -> Mapping[ChildKey, ChildSummary]:
        for where, live in self.objects.items():
            if live["kind"] in INDEXED_KINDS and where[1:] not in self.index_lag:
                self._indexed_children[where] = summarize_child(live, MANAGER)
        # As the operator's view: by the controller reference's uid, not its name.
        uid = (self.indexed.get(key) or {}).get("metadata", {}).get("uid", "")
        return {
            where[1:]: summary
            for where, summary in self._indexed_children.items()
            if where in self.objects
            and where[0] == key[0]
            and _owner(self.objects[where]) == key[1]
            and summary.owner_uid == uid
        }

    def unowned_children(self, key: DeploymentKey) -> frozenset[ChildKey]:
        """Objects of the children's kinds without a controller whose annotation names the
        deployment (the index keeps them under its name)."""
        return frozenset(
            where[1:]
            for where, live in self.objects.items()
            if where[0] == key[0]
            and live["kind"] in INDEXED_KINDS
            and where[1:] not in self.index_lag
            and not _controller_uid(live)
            and (live["metadata"].get("annotations") or {}).get(names.ANNOTATION_OWNER_NAME)
            == key[1]
        )

    def pods(self, key: DeploymentKey) -> Sequence[PodSummary]:
        """Its StatefulSets' pods, and the pods a test gave the deployment: one of a
        StatefulSet pod's name stands for that pod (its owner and revision when it names
        none)."""
        workloads = {
            pod.name: pod
            for where, pods in self.workload_pods.items()
            if where in self.objects
            and where[0] == key[0]
            and _owner(self.objects[where]) == key[1]
            for pod in pods
        }
        given = [
            replace(pod, owner_uid=twin.owner_uid, controller_revision=twin.controller_revision)
            if (twin := workloads.pop(pod.name, None)) is not None and not pod.owner_uid
            else pod
            for pod in self.pods_of.get(key, ())
        ]
        return given + list(workloads.values())

    def fleet(self) -> Fleet:
        return self.fleet_snapshot

    def creation_refusal(self, workload_uid: str) -> str:
        """What the operator's Events informer keeps: the newest creation Event's refusal."""
        return refusal_message(newest_creation(self.object_events.get(workload_uid, [])))

    def node_ready(self, name: str) -> bool | None:
        return self.nodes_ready.get(name)

    def mount_failures(self, namespace: str, secret: str) -> Sequence[MountFailure]:
        return sorted(
            self.mount_reports.get((namespace, secret), []), key=lambda r: r.when, reverse=True
        )

    def scalers(self, key: DeploymentKey) -> Mapping[str, ScalerSummary]:
        uid = (self.indexed.get(key) or {}).get("metadata", {}).get("uid", "")
        found = [
            summarize_scaler(live)
            for where, live in self.objects.items()
            if where[0] == key[0] and live["kind"] == SCALER_KIND and _owner(live) == key[1]
        ]
        return {s.role: s for s in found if s.owner_uid == uid}

    # ------------------------------------------------------------------ the event sink

    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def _has_role(self, namespace: str, ref: Mapping[str, Any]) -> bool:
        return (namespace, "rbac.authorization.k8s.io/v1", ref["kind"], ref["name"]) in self.objects


def ready_pods(statefulset: Mapping[str, Any], replicas: int, revision: str) -> list[PodSummary]:
    """The StatefulSet's pods, Ready, created from its controller revision `revision`."""
    meta = statefulset["metadata"]
    template = statefulset["spec"].get("template", {}).get("metadata", {}).get("labels", {})
    return [
        PodSummary(
            f"{meta['name']}-{ordinal}",
            f"{meta['uid']}-{ordinal}",
            meta.get("labels", {}).get(names.LABEL_ROLE, ""),
            "",
            True,
            template.get(names.LABEL_REVISION, ""),
            None,
            owner_uid=meta["uid"],
            controller_revision=revision,
        )
        for ordinal in range(replicas)
    ]


def reconciler_for(cluster: FakeCluster, metrics: OperatorMetrics | None = None) -> Reconciler:
    return Reconciler(
        cluster,
        cluster,
        OperatorSettings(),
        cluster.emit,
        metrics,
        names_guarded=cluster.name_guard,
    )


def _owner(live: Mapping[str, Any]) -> str:
    refs = live["metadata"].get("ownerReferences") or []
    return next((r["name"] for r in refs if r.get("controller")), "")


def _without_version(live: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in live["metadata"].items() if k != "resourceVersion"}
    return {**live, "metadata": meta}
