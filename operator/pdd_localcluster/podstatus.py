"""The pod status a kubelet would report, built from the pod alone. Pure functions on the pod's
JSON (dicts as the apiserver sends them); the simulator sends the result as a merge patch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Json = dict[str, Any]

# Condition types the kubelet owns; any other condition (readiness gates, ones set by
# controllers) is kept as it is.
KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


@dataclass(frozen=True)
class InitFailure:
    """The first init container (the first container when there are none) exited non-zero."""

    exit_code: int
    message: str


@dataclass(frozen=True)
class PodPlan:
    """What the simulated kubelet wants the pod to look like."""

    pod_ip: str
    host_ip: str
    node_ready: bool = True
    init_failure: InitFailure | None = None


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def desired_status(pod: Json, plan: PodPlan, now: str) -> Json:
    """The pod's whole kubelet-owned status for `plan`."""
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    start = status.get("startTime") or now
    inits, mains = _container_statuses(pod, plan.init_failure, start, now)
    init_failed = plan.init_failure is not None and bool(inits)
    containers_ready = all(s["ready"] for s in mains)
    gates_ready = _readiness_gates_true(spec, status)
    conditions = _conditions(
        status.get("conditions") or [],
        initialized=not init_failed,
        containers_ready=containers_ready,
        ready=containers_ready and gates_ready and plan.node_ready,
        not_ready_reason=(
            "NodeNotReady"
            if not plan.node_ready
            else "ContainersNotReady"
            if not containers_ready
            else "ReadinessGatesNotReady"
        ),
        waiting_inits=[s["name"] for s in inits] if init_failed else [],
        now=now,
    )
    return {
        "phase": "Pending" if init_failed else "Running",
        "conditions": conditions,
        "hostIP": plan.host_ip,
        "hostIPs": [{"ip": plan.host_ip}],
        "podIP": plan.pod_ip,
        "podIPs": [{"ip": plan.pod_ip}],
        "startTime": start,
        "initContainerStatuses": inits,
        "containerStatuses": mains,
    }


def _container_statuses(
    pod: Json, failure: InitFailure | None, start: str, now: str
) -> tuple[list[Json], list[Json]]:
    """(init container statuses, container statuses). A failure hits the first init
    container, or the first container when the pod has no init containers."""
    spec = pod.get("spec", {})
    inits = spec.get("initContainers") or []
    fail_init = failure is not None and bool(inits)
    init_statuses = [
        _init_status(c, pod, i == 0 and fail_init, failure, start, now) for i, c in enumerate(inits)
    ]
    if fail_init:
        # Containers after a failed init container never start.
        for s in init_statuses[1:]:
            s.update(_waiting("PodInitializing"))
            del s["containerID"]
    main_statuses = [
        _main_status(
            c,
            pod,
            started=not fail_init,
            failed=(i == 0 and failure is not None and not inits),
            failure=failure,
            start=start,
            now=now,
        )
        for i, c in enumerate(spec.get("containers") or [])
    ]
    return init_statuses, main_statuses


def status_matches(pod: Json, plan: PodPlan) -> bool:
    """Whether the pod already shows `plan`, judged on the fields a plan changes; the
    simulator skips its write when it does (its own writes come back as watch events)."""
    status = pod.get("status", {})
    if status.get("podIP") != plan.pod_ip or status.get("hostIP") != plan.host_ip:
        return False
    if plan.init_failure is not None:
        return _shows_failure(status, plan.init_failure)
    want_ready = plan.node_ready and _readiness_gates_true(pod.get("spec", {}), status)
    return status.get("phase") == "Running" and _condition_true(status, "Ready") == want_ready


def _shows_failure(status: Json, failure: InitFailure) -> bool:
    for s in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        term = (s.get("state") or {}).get("terminated")
        if term and term.get("exitCode") == failure.exit_code:
            return not _condition_true(status, "Ready")
    return False


def _condition_true(status: Json, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _readiness_gates_true(spec: Json, status: Json) -> bool:
    gates = [g["conditionType"] for g in spec.get("readinessGates") or []]
    return all(_condition_true(status, g) for g in gates)


def _conditions(
    existing: Iterable[Json],
    *,
    initialized: bool,
    containers_ready: bool,
    ready: bool,
    not_ready_reason: str,
    waiting_inits: list[str],
    now: str,
) -> list[Json]:
    old = {c.get("type"): c for c in existing}
    kept = [c for t, c in old.items() if t not in (*KUBELET_CONDITIONS, "PodScheduled")]

    def cond(ctype: str, ok: bool, reason: str = "", message: str = "") -> Json:
        status = "True" if ok else "False"
        prev = old.get(ctype)
        # Like the kubelet: the transition time moves only when the status does.
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now
        c: Json = {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": since,
        }
        if not ok:
            c.update(reason=reason, message=message)
        return c

    init_msg = f"containers with incomplete status: [{' '.join(waiting_inits)}]"
    return [
        cond("PodReadyToStartContainers", True),
        cond("Initialized", initialized, "ContainersNotInitialized", init_msg),
        cond("ContainersReady", containers_ready, "ContainersNotReady", "containers not ready"),
        cond("Ready", ready, not_ready_reason, "pod is not ready"),
        old.get("PodScheduled") or cond("PodScheduled", True),
        *kept,
    ]


def _container_id(pod: Json, name: str) -> str:
    return f"containerd://sim-{pod['metadata']['uid']}-{name}"


def _base(container: Json, pod: Json) -> Json:
    image = container.get("image", "")
    return {
        "name": container["name"],
        "image": image,
        "imageID": f"sim://{image}",
        "containerID": _container_id(pod, container["name"]),
        "restartCount": 0,
    }


def _waiting(reason: str) -> Json:
    return {"state": {"waiting": {"reason": reason}}, "ready": False, "started": False}


def _terminated(exit_code: int, reason: str, message: str, start: str, now: str) -> Json:
    term: Json = {"exitCode": exit_code, "reason": reason, "startedAt": start, "finishedAt": now}
    if message:
        term["message"] = message
    return {"terminated": term}


def _init_status(
    container: Json, pod: Json, failed: bool, failure: InitFailure | None, start: str, now: str
) -> Json:
    s = _base(container, pod)
    if failed and failure is not None:
        s.update(state=_terminated(failure.exit_code, "Error", failure.message, start, now))
        s.update(ready=False, started=False)
    elif container.get("restartPolicy") == "Always":
        # A native sidecar keeps running next to the main containers.
        s.update(state={"running": {"startedAt": start}}, ready=True, started=True)
    else:
        s.update(state=_terminated(0, "Completed", "", start, start), ready=True, started=False)
    return s


def _main_status(
    container: Json,
    pod: Json,
    *,
    started: bool,
    failed: bool,
    failure: InitFailure | None,
    start: str,
    now: str,
) -> Json:
    s = _base(container, pod)
    if not started:
        s.update(_waiting("PodInitializing"))
        del s["containerID"]
    elif failed and failure is not None:
        s.update(state=_terminated(failure.exit_code, "Error", failure.message, start, now))
        s.update(ready=False, started=False)
    else:
        s.update(state={"running": {"startedAt": start}}, ready=True, started=True)
    return s
