"""The pod status a kubelet would report, built from the pod alone. Pure functions on the pod's
JSON (dicts as the apiserver sends them); the simulator sends the result as a merge patch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
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
class ContainerRun:
    """A container that really runs (`pdd_localcluster.runtime`): its state as the kubelet
    would report it."""

    name: str
    state: str  # "waiting" | "running" | "terminated"
    reason: str = ""
    message: str = ""
    exit_code: int = 0
    started_at: str = ""
    finished_at: str = ""
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    container_id: str = ""
    # The previous run's end (exit code, reason, started, finished), shown as lastState.
    last_exit: tuple[int, str, str, str] | None = None
    sidecar: bool = False  # an init container with restartPolicy Always: done once started

    def init_done(self) -> bool:
        if self.sidecar:
            return self.state == "running" and self.started
        return self.state == "terminated" and self.exit_code == 0


@dataclass(frozen=True)
class PodRun:
    """The containers of a pod that really runs, in spec order."""

    inits: tuple[ContainerRun, ...]
    mains: tuple[ContainerRun, ...]

    @classmethod
    def creating(cls, pod: Json) -> PodRun:
        """Every container waiting to be created: before the runtime reports."""
        spec = pod.get("spec", {})

        def waiting(containers: list[Json]) -> tuple[ContainerRun, ...]:
            return tuple(
                ContainerRun(c["name"], "waiting", "ContainerCreating") for c in containers
            )

        return cls(waiting(spec.get("initContainers") or []), waiting(spec.get("containers") or []))

    def initialized(self) -> bool:
        return all(c.init_done() for c in self.inits)

    def phase(self) -> str:
        """Pending until the init containers are done; once every app container has ended
        for good (a container to be restarted is waiting, not terminated), Succeeded or
        Failed; Running in between."""
        if not self.initialized():
            return "Pending"
        if self.mains and all(c.state == "terminated" for c in self.mains):
            return "Succeeded" if all(c.exit_code == 0 for c in self.mains) else "Failed"
        return "Running"


class Stage(IntEnum):
    """The stages a kubelet reports a starting pod in, each its own status write."""

    CREATING = 0  # Pending: sandbox and containers being created (ContainerCreating), no IP
    STARTED = 1  # Running: containers started, readiness not passed yet
    READY = 2  # every container ready; the only stage when stages are off


@dataclass(frozen=True)
class PodPlan:
    """What the simulated kubelet wants the pod to look like. `run` is set for a pod whose
    containers really run; without it every container is shown running and ready, or, at
    an earlier `stage`, on its way there."""

    pod_ip: str
    host_ip: str
    node_ready: bool = True
    init_failure: InitFailure | None = None
    run: PodRun | None = None
    stage: Stage = Stage.READY

    @property
    def staged(self) -> bool:
        """A simulated pod (no runtime, no failure) not yet at its Ready stage."""
        return self.stage < Stage.READY and self.run is None and self.init_failure is None


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def desired_status(pod: Json, plan: PodPlan, now: str) -> Json:
    """The pod's whole kubelet-owned status for `plan`."""
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    start = status.get("startTime") or now
    if plan.run is not None and plan.init_failure is None:
        return _run_status(pod, plan, plan.run, start, now)
    if plan.staged:
        return _staged_status(pod, plan, start, now)
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


def _run_status(pod: Json, plan: PodPlan, run: PodRun, start: str, now: str) -> Json:
    """The status of a pod whose containers really run: from their states and probes."""
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    images = {c["name"]: c.get("image", "") for c in _all_containers(spec)}
    initialized = run.initialized()
    containers_ready = initialized and all(c.ready for c in run.mains)
    ready = containers_ready and _readiness_gates_true(spec, status) and plan.node_ready
    reason = (
        "NodeNotReady"
        if not plan.node_ready
        else "ContainersNotReady"
        if not containers_ready
        else "ReadinessGatesNotReady"
    )
    waiting = [c.name for c in run.inits if not c.init_done()]
    conditions = _conditions(
        status.get("conditions") or [],
        initialized=initialized,
        containers_ready=containers_ready,
        ready=ready,
        not_ready_reason=reason,
        waiting_inits=waiting,
        now=now,
    )
    return {
        "phase": run.phase(),
        "conditions": conditions,
        "hostIP": plan.host_ip,
        "hostIPs": [{"ip": plan.host_ip}],
        "podIP": plan.pod_ip,
        "podIPs": [{"ip": plan.pod_ip}],
        "startTime": start,
        "initContainerStatuses": [_run_container_status(c, images) for c in run.inits],
        "containerStatuses": [_run_container_status(c, images) for c in run.mains],
    }


def _staged_status(pod: Json, plan: PodPlan, start: str, now: str) -> Json:
    """A starting pod: Pending with its containers being created (no pod IP yet, as before
    the sandbox exists), or Running with its containers started but not ready."""
    run = staged_run(pod, plan.stage, start)
    status = _run_status(pod, plan, run, start, now)
    if plan.stage == Stage.CREATING:
        status["phase"] = "Pending"
        for key in ("podIP", "podIPs"):
            status.pop(key)
    return status


def staged_run(pod: Json, stage: Stage, start: str) -> PodRun:
    """The containers of a simulated pod at `stage` (before READY)."""
    if stage == Stage.CREATING:
        return PodRun.creating(pod)
    spec = pod.get("spec", {})

    def init(c: Json) -> ContainerRun:
        cid = _container_id(pod, c["name"])
        if c.get("restartPolicy") == "Always":  # a native sidecar keeps running
            return ContainerRun(
                c["name"], "running", started_at=start, started=True, container_id=cid, sidecar=True
            )
        return ContainerRun(
            c["name"],
            "terminated",
            "Completed",
            started_at=start,
            finished_at=start,
            container_id=cid,
        )

    def main(c: Json) -> ContainerRun:
        cid = _container_id(pod, c["name"])
        return ContainerRun(c["name"], "running", started_at=start, started=True, container_id=cid)

    return PodRun(
        tuple(init(c) for c in spec.get("initContainers") or []),
        tuple(main(c) for c in spec.get("containers") or []),
    )


def _all_containers(spec: Json) -> list[Json]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _run_container_status(c: ContainerRun, images: dict[str, str]) -> Json:
    image = images.get(c.name, "")
    s: Json = {
        "name": c.name,
        "image": image,
        "imageID": f"local://{image}",
        "restartCount": c.restart_count,
        "ready": c.ready,
        "started": c.started,
    }
    if c.container_id:
        s["containerID"] = c.container_id
    if c.state == "running":
        s["state"] = {"running": {"startedAt": c.started_at}}
    elif c.state == "terminated":
        s["state"] = _terminated(c.exit_code, c.reason, c.message, c.started_at, c.finished_at)
    else:
        waiting: Json = {"reason": c.reason or "ContainerCreating"}
        if c.message:
            waiting["message"] = c.message
        s["state"] = {"waiting": waiting}
    if c.last_exit is not None:
        code, reason, started, finished = c.last_exit
        s["lastState"] = _terminated(code, reason, "", started, finished)
    return s


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
    if plan.staged:
        want = desired_status(pod, plan, "")
        return (
            status.get("podIP") == want.get("podIP")
            and status.get("hostIP") == plan.host_ip
            and _run_fingerprint(status) == _run_fingerprint(want)
        )
    if status.get("podIP") != plan.pod_ip or status.get("hostIP") != plan.host_ip:
        return False
    if plan.run is not None and plan.init_failure is None:
        return _run_fingerprint(status) == _run_fingerprint(desired_status(pod, plan, ""))
    if plan.init_failure is not None:
        return _shows_failure(status, plan.init_failure)
    want_ready = plan.node_ready and _readiness_gates_true(pod.get("spec", {}), status)
    return status.get("phase") == "Running" and _condition_true(status, "Ready") == want_ready


def _run_fingerprint(status: Json) -> tuple[object, ...]:
    """What a status write of a running pod would change, times left out."""

    def containers(key: str) -> list[tuple[object, ...]]:
        return [
            (
                s.get("name"),
                sorted(s.get("state") or {}),
                ((s.get("state") or {}).get("waiting") or {}).get("reason"),
                s.get("ready"),
                s.get("started"),
                s.get("restartCount"),
                s.get("containerID"),
            )
            for s in status.get(key) or []
        ]

    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return (
        status.get("phase"),
        [conditions.get(t) for t in KUBELET_CONDITIONS],
        containers("initContainerStatuses"),
        containers("containerStatuses"),
    )


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
