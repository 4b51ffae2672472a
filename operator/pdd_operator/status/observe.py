"""Compact summaries of observed children and pods (pure), kept in the operator's indexes.

The operator keeps only these summaries in memory instead of whole objects: what status, the
no-op check and the drift check need, nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import names
from pdd_operator.planning.node_facts import pod_gpu_request
from pdd_operator.status.compute import PodProblem, WorkloadState
from pdd_operator.status.drift import LiveDigests, live_fingerprint

ChildKey = tuple[str, str, str]  # (apiVersion, kind, name)
ENGINE_CONTAINER = "engine"
STATEFULSET_REVISION_LABEL = "controller-revision-hash"


@dataclass(frozen=True)
class ChildSummary:
    key: ChildKey
    applied_hash: str
    role: str
    workload: WorkloadState | None = None
    template_revision: str = ""  # pdd.dev/revision of a StatefulSet's pod template
    partition: int = 0
    # The live values of the fields the operator owns, as a digest (status.drift): differs
    # from the render's when someone changed or removed one of them.
    owned_fingerprint: str = ""
    resource_version: str = ""
    uid: str = ""
    owner_uid: str = ""  # of the PDDeployment its controller reference names


@dataclass(frozen=True)
class PodSummary:
    """A pod as a pass reads it. Its IP is left out: no pass reads it (routers and sidecars
    find pods themselves), so a pod being given one asks for no pass."""

    name: str
    uid: str
    role: str
    node: str
    ready: bool
    revision: str
    problem: PodProblem | None
    probe_request: str = ""
    probe_result: Mapping[str, Any] | None = None
    owner_uid: str = ""  # of its controller (a StatefulSet or a ReplicaSet)
    instance: str = ""  # pdd.dev/instance: the instance over several nodes it is a rank of
    engine_restarts: int = 0  # restarts of its engine container
    failed: bool = False  # phase Failed
    terminating: bool = False  # deletion asked for (deletionTimestamp set)
    gpus: int = 0  # its effective GPU request: the fleet's GPU count takes ours from here
    # controller-revision-hash: the StatefulSet revision it was created from (set at creation).
    controller_revision: str = ""
    slice: int = 0  # pdd.dev/slice: the slice it serves (planning.slices); 0: the home slice
    # When it turned Ready (its Ready condition's lastTransitionTime, epoch seconds); 0 when
    # not Ready or not known.
    ready_since: float = 0.0


@dataclass(frozen=True)
class ScalerSummary:
    """A PDDRoleScaler as the reconciler reads it: what its scale target asks for, and the
    status the operator last wrote there."""

    name: str
    role: str
    uid: str
    owner_uid: str
    replicas: int  # spec.replicas: the HPA's, KEDA's or `kubectl scale`'s ask
    status: Mapping[str, Any]


def summarize_scaler(body: Mapping[str, Any]) -> ScalerSummary:
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    return ScalerSummary(
        name=str(meta.get("name", "")),
        role=str(spec.get("role", "")),
        uid=str(meta.get("uid", "")),
        owner_uid=controller_uid(body, "PDDeployment"),
        replicas=int(spec.get("replicas", 0)),
        status=dict(body.get("status") or {}),
    )


def controller_uid(body: Mapping[str, Any], kind: str | None = None) -> str:
    """The uid of the object's controller (of that kind when given), "" when none: labels and
    annotations can be copied by anyone, an owner uid names one object."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and (kind is None or ref.get("kind") == kind):
            return str(ref.get("uid", ""))
    return ""


def owned_pods(
    pdd_uid: str,
    children: Iterable[ChildSummary],
    replica_sets: Callable[[str], Sequence[str]],
    pods_of: Callable[[str], Sequence[PodSummary]],
) -> list[PodSummary]:
    """The deployment's pods by the owner chain: PDDeployment (uid) -> its StatefulSets -> their
    pods, and -> its Deployments -> their ReplicaSets -> their pods."""
    owners: list[str] = []
    for child in children:
        if child.owner_uid != pdd_uid or not child.uid:
            continue
        if child.key[1] == "StatefulSet":
            owners.append(child.uid)
        elif child.key[1] == "Deployment":
            owners.extend(replica_sets(child.uid))
    return [pod for owner in owners for pod in pods_of(owner)]


def owner_key(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, PDDeployment name) of a child we control, from its owner reference."""
    meta = body.get("metadata", {})
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "PDDeployment" and ref.get("controller"):
            return meta.get("namespace", ""), ref["name"]
    return None


def unowned_key(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, PDDeployment name) that an object without any controller reference names
    in its deployment-name annotation: a child that lost its owner reference (or a copy of
    one; ownership.adoptable tells them apart)."""
    meta = body.get("metadata", {})
    if any(ref.get("controller") for ref in meta.get("ownerReferences") or []):
        return None
    owner = (meta.get("annotations") or {}).get(names.ANNOTATION_OWNER_NAME)
    return (meta.get("namespace", ""), str(owner)) if owner else None


def summarize_child(
    body: Mapping[str, Any], field_manager: str, digests: LiveDigests | None = None
) -> ChildSummary:
    meta = body["metadata"]
    role = meta.get("labels", {}).get(names.LABEL_ROLE, "")
    key = (body["apiVersion"], body["kind"], meta["name"])
    applied = meta.get("annotations", {}).get(names.ANNOTATION_APPLIED_HASH, "")
    workload = _workload(body) if body["kind"] in ("StatefulSet", "Deployment") else None
    spec = body.get("spec", {})
    template_labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
    partition = spec.get("updateStrategy", {}).get("rollingUpdate", {}).get("partition", 0)
    return ChildSummary(
        key,
        applied,
        role,
        workload,
        template_revision=template_labels.get(names.LABEL_REVISION, ""),
        partition=int(partition or 0),
        owned_fingerprint=(
            digests.fingerprint(body, field_manager)
            if digests is not None
            else live_fingerprint(body, field_manager)
        ),
        resource_version=str(meta.get("resourceVersion", "")),
        uid=str(meta.get("uid", "")),
        owner_uid=controller_uid(body, "PDDeployment"),
    )


def _workload(body: Mapping[str, Any]) -> WorkloadState:
    spec = body.get("spec", {})
    status = body.get("status", {})
    desired = int(spec.get("replicas", 1))
    if body["kind"] == "StatefulSet":
        updated = int(status.get("updatedReplicas", 0))
        current, update = status.get("currentRevision", ""), status.get("updateRevision", "")
    else:
        updated = int(status.get("updatedReplicas", 0))
        current = update = ""
    return WorkloadState(
        exists=True,
        desired=desired,
        ready=int(status.get("readyReplicas", 0)),
        updated=updated,
        pods=int(status.get("replicas", 0)),
        current_revision=current,
        update_revision=update,
        generation=int(body["metadata"].get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
    )


def counted_from_pods(
    children: Iterable[ChildSummary], pods: Iterable[PodSummary]
) -> list[ChildSummary]:
    """The children, each StatefulSet's replica counts taken from its pods as the pod watch
    shows them, counted as its controller counts them (status.replicas: its pods; ready: those
    Ready; updated: those of its update revision), but leaving out pods on their way out.

    Under load the StatefulSet controller writes its counts seconds after the pods change: a
    pass asked by a pod's event would read the old counts, write nothing, and need another
    pass for the counts' own event. Counted here, the pod's event is the one that matters, and
    the counts' events ask for no pass (informers.owned). The revisions and generations still
    come from the StatefulSet: only its controller knows them."""
    by_owner: dict[str, list[PodSummary]] = {}
    for pod in pods:
        by_owner.setdefault(pod.owner_uid, []).append(pod)
    return [
        replace(child, workload=_counted(child.workload, by_owner.get(child.uid, [])))
        if child.key[1] == "StatefulSet" and child.workload is not None
        else child
        for child in children
    ]


def _counted(workload: WorkloadState, pods: Sequence[PodSummary]) -> WorkloadState:
    serving = [pod for pod in pods if not pod.terminating]
    revision = workload.update_revision
    return replace(
        workload,
        pods=len(pods),
        ready=sum(1 for pod in serving if pod.ready),
        updated=sum(1 for pod in serving if revision and pod.controller_revision == revision),
    )


def workload_as_read(child: ChildSummary) -> WorkloadState | None:
    """What a pass reads of the child's own workload status: a StatefulSet's replica counts
    are taken from its pods instead (counted_from_pods), and no pass reads its current
    revision."""
    state = child.workload
    if state is None or child.key[1] != "StatefulSet":
        return state
    return replace(state, ready=0, updated=0, pods=0, current_revision="")


def summarize_pod(body: Mapping[str, Any]) -> PodSummary:
    meta = body["metadata"]
    labels = meta.get("labels", {})
    annotations = meta.get("annotations") or {}
    status = body.get("status", {})
    spec = body.get("spec", {})
    role = labels.get(names.LABEL_ROLE, "")
    ready_condition: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    ready = ready_condition.get("status") == "True"
    return PodSummary(
        name=meta["name"],
        uid=meta.get("uid", ""),
        role=role,
        node=spec.get("nodeName", "") or "",
        ready=ready,
        revision=labels.get(names.LABEL_REVISION, ""),
        problem=pod_problem(meta["name"], role, status),
        probe_request=annotations.get(names.ANNOTATION_PROBE_REQUEST, ""),
        probe_result=_json_object(annotations.get(names.ANNOTATION_PROBE_RESULT, "")),
        owner_uid=controller_uid(body),
        instance=labels.get(names.LABEL_INSTANCE, ""),
        engine_restarts=_engine_restarts(status),
        failed=status.get("phase") == "Failed",
        terminating=bool(meta.get("deletionTimestamp")),
        gpus=pod_gpu_request(spec),
        controller_revision=labels.get(STATEFULSET_REVISION_LABEL, ""),
        slice=_slice_index(labels.get(names.LABEL_SLICE, "")),
        ready_since=_epoch(ready_condition.get("lastTransitionTime", "")) if ready else 0.0,
    )


def _epoch(timestamp: str) -> float:
    """An API timestamp (RFC 3339, "2026-12-02T20:01:24Z") in epoch seconds; 0 when unreadable."""
    try:
        return datetime.fromisoformat(timestamp).timestamp()
    except ValueError:
        return 0.0


def _slice_index(label: str) -> int:
    return int(label) if label.isdigit() else 0


def _engine_restarts(status: Mapping[str, Any]) -> int:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == ENGINE_CONTAINER:
            return int(container.get("restartCount") or 0)
    return 0


def _json_object(text: str) -> Mapping[str, Any] | None:
    """A probe result written by a sidecar; anything unparsable counts as no result."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def pod_problems(
    pods: Sequence[PodSummary], node_ready: Callable[[str], bool | None]
) -> list[PodProblem]:
    """Problems of the pods themselves, plus pods that sit on a node that went NotReady or
    that no longer exists (the pod keeps its Ready status: no kubelet reports on it)."""
    problems = []
    for pod in pods:
        if pod.problem is not None:
            problems.append(pod.problem)
        elif pod.node and node_ready(pod.node) is None:
            problems.append(
                PodProblem(
                    pod.name,
                    pod.role,
                    "NodeLost",
                    f"node {pod.node} no longer exists; the pod is replaced once it is deleted "
                    f"(the pod garbage collector does that; `kubectl delete pod {pod.name}` "
                    "does it now)",
                )
            )
        elif pod.node and not pod.ready and node_ready(pod.node) is False:
            problems.append(
                PodProblem(
                    pod.name,
                    pod.role,
                    "NodeNotReady",
                    f"node {pod.node} is NotReady; the pod is replaced once the node is "
                    "removed or its pods are evicted (check the node's kubelet and network)",
                )
            )
    return problems


def pod_nodes(
    pods: Sequence[PodSummary], node_ready: Callable[[str], bool | None]
) -> tuple[str, ...]:
    """The existing nodes the engine pods are bound to, sorted: where the slice runs now."""
    return tuple(
        sorted(
            {
                pod.node
                for pod in pods
                if pod.node and pod.role in ENGINE_ROLES and node_ready(pod.node) is not None
            }
        )
    )


ENGINE_ROLES = ("prefill", "decode")


def pod_problem(pod: str, role: str, status: Mapping[str, Any]) -> PodProblem | None:
    """Why a pod cannot serve, in words a user can act on; None when nothing is wrong."""
    for init in status.get("initContainerStatuses") or []:
        term = (init.get("state") or {}).get("terminated") or (init.get("lastState") or {}).get(
            "terminated"
        )
        if term and term.get("exitCode", 0) != 0:
            message = (term.get("message") or term.get("reason") or "failed").strip()
            return PodProblem(pod, role, reasons.PREFLIGHT_FAILED, message, blocking=True)
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in (
            "CrashLoopBackOff",
            "ImagePullBackOff",
            "ErrImagePull",
            "CreateContainerConfigError",
            "InvalidImageName",
        ):
            msg = waiting.get("message") or waiting["reason"]
            return PodProblem(
                pod, role, waiting["reason"], f"container {container.get('name')}: {msg}"
            )
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return PodProblem(
                pod, role, "Unschedulable", cond.get("message") or "cannot be scheduled"
            )
    return None
