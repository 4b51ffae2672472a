"""One pod's containers, supervised by one thread the way a kubelet's pod worker would: the
pod's sandbox (its namespaces) and volumes first, then the init containers one after another,
then the app containers with their probes, restarts with backoff and liveness kills; `stop()`
ends them all, then the sandbox."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdd_localcluster.podstatus import ContainerRun, InitFailure, PodRun, now_rfc3339
from pdd_localcluster.runtime import images as image_table
from pdd_localcluster.runtime.containers import ContainerProcess
from pdd_localcluster.runtime.namespaces import pod_namespaces
from pdd_localcluster.runtime.pod_sandbox import PodSandbox
from pdd_localcluster.runtime.podenv import EnvError, command_line, container_env, run_as
from pdd_localcluster.runtime.probes import ProbeTracker, run_probe
from pdd_localcluster.runtime.volumes import (
    BytesLookup,
    Mount,
    VolumeDirs,
    container_mounts,
    volume_files,
    write_files,
)

log = logging.getLogger(__name__)

# A container whose env or mounts cannot be resolved waits with this reason, tried again
# every CONFIG_RETRY_S (a Secret created later lets it start, as with the kubelet).
CONFIG_ERROR = "CreateContainerConfigError"
CONFIG_RETRY_S = 2.0
# A volume that cannot be set up is reported again (a FailedMount Event) this often.
MOUNT_REPORT_S = 10.0
# Secret and ConfigMap volumes of running pods are rewritten this often where their object
# changed (the kubelet's sync is a minute or so; tests wait on it).
VOLUME_REFRESH_S = 3.0
Json = dict[str, Any]


@dataclass(frozen=True)
class RuntimeOptions:
    """Knobs of the local runtime. Defaults are the kubelet's, but the grace period is capped
    so a test or `down` never waits a minute for an engine that ignores SIGTERM."""

    max_grace_s: float = 10.0
    backoff_base_s: float = 10.0
    backoff_max_s: float = 300.0
    # Caps every probe's periodSeconds (None: as the pod says); tests use it for speed.
    max_probe_period_s: float | None = None
    tick_s: float = 0.1


@dataclass(frozen=True)
class PodServices:
    """What a pod's runner needs from outside: the API objects, tokens, the apiserver's
    service variables, the network shim, and a callback when its status changed."""

    lookup: BytesLookup
    issue_token: Callable[[Json, str, int], str]
    service_env: Mapping[str, str]
    netshim: Path
    images: Mapping[str, image_table.ImageFs]
    options: RuntimeOptions
    changed: Callable[[], None]
    # Posts an Event about the pod (type, reason, message), as its kubelet does.
    report: Callable[[str, str, str], None] = lambda kind, reason, message: None
    # Mounted into every container before its volumes: the node's hardware, if faked.
    node_mounts: Sequence[Mount] = ()


@dataclass
class _Main:
    """Supervision state of one app container."""

    spec: Json
    trackers: dict[str, ProbeTracker] = field(default_factory=dict)
    restart_at: float = 0.0
    backoff: float = 0.0


def pod_dir_name(pod: Json) -> str:
    m = pod["metadata"]
    return f"{m['namespace']}_{m['name']}_{m['uid']}"


class PodRunner:
    def __init__(
        self, pod: Json, pod_ip: str, host_ip: str, pod_dir: Path, services: PodServices
    ) -> None:
        self.pod = copy.deepcopy(pod)
        status = self.pod.setdefault("status", {})
        status.update(podIP=pod_ip, hostIP=host_ip)
        self.pod_ip = pod_ip
        self.dir = pod_dir
        self._svc = services
        spec = self.pod["spec"]
        self._inits: list[Json] = list(spec.get("initContainers") or [])
        self._mains: list[Json] = list(spec.get("containers") or [])
        claims = pod_dir.parent.parent / "claims" / self.pod["metadata"]["namespace"]
        self._volumes = VolumeDirs(pod_dir, spec.get("volumes") or [], claims)
        self._procs = {
            c["name"]: ContainerProcess(c["name"], pod_dir) for c in self._inits + self._mains
        }
        self._envs: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._runs = {
            c["name"]: ContainerRun(c["name"], "waiting", "PodInitializing")
            for c in self._inits + self._mains
        }
        self._failure: InitFailure | None = None
        self._sandbox = PodSandbox(pod_namespaces(self.pod), pod_dir)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-{pod_dir.name}", daemon=True)

    # ------------------------------------------------------------- outside view

    def start(self) -> None:
        self._thread.start()

    def snapshot(self) -> PodRun | InitFailure:
        with self._lock:
            if self._failure is not None:
                return self._failure
            return PodRun(
                tuple(self._runs[c["name"]] for c in self._inits),
                tuple(self._runs[c["name"]] for c in self._mains),
            )

    def pid(self, container: str) -> int | None:
        return self._procs[container].pid

    def started_with(self, container: str) -> dict[str, Any] | None:
        path = self._procs[container].spec_path
        return json.loads(path.read_text()) if path.exists() else None

    def exec(
        self, container: str, argv: Sequence[str], timeout: float
    ) -> subprocess.CompletedProcess[bytes]:
        """Runs `argv` inside the running container (its namespaces, root, working dir, env)."""
        pid = self._procs[container].forked_pid(timeout=min(timeout, 10.0))
        if pid is None:
            raise RuntimeError(f"container {container} is not running")
        cmd = ["nsenter", "-t", str(pid), "-m", "-i", "-u", "-p", "-r", "-w", "--", *argv]
        env = self._envs.get(container, {})
        return subprocess.run(cmd, env=env, capture_output=True, timeout=timeout)

    def stop(self, grace: float) -> None:
        """Ends the pod: no more starts or restarts, SIGTERM to every container, SIGKILL to
        what is left after `grace` seconds."""
        self._stopping.set()
        self._thread.join(timeout=5)
        grace = min(grace, self._svc.options.max_grace_s)
        stoppers = [threading.Thread(target=p.stop, args=(grace,)) for p in self._procs.values()]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        self._sandbox.stop()

    # ------------------------------------------------------------- the worker

    def _run(self) -> None:
        try:
            self._sandbox.start()
            if not self._prepare_volumes():
                return
            for c in self._inits:
                if not self._run_init(c):
                    return
            self._supervise_mains()
        except Exception as e:
            log.exception("pod %s: runner failed", self.dir.name)
            for name in self._runs:
                self._set(
                    name,
                    ContainerRun(name, "waiting", "RunContainerError", f"local runtime: {e!r}"),
                )

    def _set(self, name: str, run: ContainerRun) -> None:
        with self._lock:
            changed = self._runs[name] != run
            self._runs[name] = run
        if changed:
            self._svc.changed()

    def _prepare_volumes(self) -> bool:
        """Writes the volumes' files; retried every 2 s while an object is missing. As with
        the kubelet, the containers wait as ContainerCreating (no message) and what failed
        is said in FailedMount Events, again every MOUNT_REPORT_S while it lasts."""
        self._volumes.prepare()
        reported, at = "", 0.0
        while not self._stopping.is_set():
            failure = self._write_volumes()
            if not failure:
                return True
            for name in self._runs:
                self._set(name, ContainerRun(name, "waiting", "ContainerCreating"))
            if failure != reported or time.monotonic() - at >= MOUNT_REPORT_S:
                self._svc.report("Warning", "FailedMount", failure)
                reported, at = failure, time.monotonic()
            self._stopping.wait(2.0)
        return False

    def _write_volumes(self, refresh: bool = False) -> str:
        """Writes every file volume; "" when all were written, else the kubelet's FailedMount
        message for the first that could not be. `refresh`: only Secret and ConfigMap
        volumes, rewritten where their object changed, as the kubelet's periodic sync does
        (a missing object keeps the files it had)."""
        for volume in self._volumes.needs_files():
            if refresh and not ("secret" in volume or "configMap" in volume):
                continue
            try:
                files = volume_files(volume, self.pod, self._svc.lookup, self._issue_token)
            except EnvError as e:
                return f'MountVolume.SetUp failed for volume "{volume["name"]}" : {e}'
            write_files(self._volumes.source(volume["name"]), files)
        return ""

    def _issue_token(self, audience: str, seconds: int) -> str:
        return self._svc.issue_token(self.pod, audience, seconds)

    def _start(
        self, container: Json, restarts: int, last_exit: tuple[int, str, str, str] | None
    ) -> bool:
        """Starts one run of the container; False (shown as waiting) when it cannot start."""
        name = container["name"]
        fs = image_table.lookup(container.get("image", ""), self._svc.images)
        assert fs is not None, "the runtime only runs pods whose images are all known"
        try:
            env = container_env(
                container,
                self.pod,
                image_env=fs.env(container.get("image", "")),
                service_env=self._svc.service_env,
                lookup_data=self._lookup_text,
            )
            argv = command_line(container, fs.entrypoint, env, fs.cmd)
            mounts = [*self._svc.node_mounts, *container_mounts(container, self._volumes)]
            own_root = _image_root_spec(container, self.pod, fs)
        except EnvError as e:
            self._set(
                name,
                ContainerRun(
                    name,
                    "waiting",
                    CONFIG_ERROR,
                    str(e),
                    restart_count=restarts,
                    last_exit=last_exit,
                ),
            )
            return False
        self._envs[name] = env
        spec = {
            "argv": argv,
            "env": env,
            "working_dir": container.get("workingDir") or fs.working_dir or "/",
            "mounts": [
                {"source": str(m.source), "target": m.target, "read_only": m.read_only}
                for m in mounts
            ],
            "netshim": str(self._svc.netshim),
            "pod_ip": self.pod_ip,
            "keep_visible": [] if fs.root else list(image_table.IMAGE_CONTENT),
            **own_root,
            **self._sandbox.container_spec(),
        }
        proc = self._procs[name]
        proc.start(spec)
        run = ContainerRun(
            name,
            "running",
            started_at=now_rfc3339(),
            restart_count=restarts,
            container_id=f"local://{proc.pid}",
            last_exit=last_exit,
        )
        self._set(name, run)
        return True

    def _lookup_text(self, kind: str, name: str) -> Mapping[str, str] | None:
        data = self._svc.lookup(kind, name)
        return None if data is None else {k: v.decode(errors="replace") for k, v in data.items()}

    def _exited(self, container: Json, code: int) -> ContainerRun:
        """The container's run after its process ended with `code`."""
        name = container["name"]
        fallback = (
            container.get("terminationMessagePolicy") == "FallbackToLogsOnError" and code != 0
        )
        message = self._procs[name].termination_message(fallback)
        prev = self.snapshot_of(name)
        return replace(
            prev,
            state="terminated",
            reason="Completed" if code == 0 else "Error",
            message=message,
            exit_code=code,
            finished_at=now_rfc3339(),
            ready=False,
            started=False,
        )

    def snapshot_of(self, name: str) -> ContainerRun:
        with self._lock:
            return self._runs[name]

    def _run_init(self, container: Json) -> bool:
        name = container["name"]
        if container.get("restartPolicy") == "Always":
            # A native sidecar would run beside the app containers; nothing renders one yet.
            msg = "local runtime: init containers with restartPolicy Always are not supported"
            self._set(name, ContainerRun(name, "waiting", "RunContainerError", msg))
            return False
        while not self._start(container, 0, None):
            if self._stopping.wait(2.0):
                return False
        proc = self._procs[name]
        while (code := proc.poll()) is None:
            if self._stopping.wait(self._svc.options.tick_s):
                return False
        run = self._exited(container, code)
        self._set(name, run)
        if code == 0:
            return True
        with self._lock:
            self._failure = InitFailure(code, run.message)
        self._svc.changed()
        return False

    def _supervise_mains(self) -> None:
        mains = [_Main(c) for c in self._mains]
        for m in mains:
            self._start_main(m, restarts=0, last_exit=None)
        refreshed = time.monotonic()
        while not self._stopping.wait(self._svc.options.tick_s):
            for m in mains:
                self._tick(m, time.monotonic())
            if time.monotonic() - refreshed >= VOLUME_REFRESH_S:
                self._write_volumes(refresh=True)
                refreshed = time.monotonic()

    def _start_main(
        self, m: _Main, restarts: int, last_exit: tuple[int, str, str, str] | None
    ) -> None:
        if not self._start(m.spec, restarts, last_exit):
            m.restart_at = time.monotonic() + CONFIG_RETRY_S
            return
        m.trackers = ProbeTracker.for_container(
            m.spec, time.monotonic(), self._svc.options.max_probe_period_s
        )
        if not m.trackers.get("startupProbe"):
            self._update(m.spec["name"], started=True, ready="readinessProbe" not in m.trackers)

    def _update(self, name: str, **changes: Any) -> None:
        self._set(name, replace(self.snapshot_of(name), **changes))

    def _tick(self, m: _Main, now: float) -> None:
        name = m.spec["name"]
        run = self.snapshot_of(name)
        if run.state == "running":
            code = self._procs[name].poll()
            if code is None:
                self._probe(m, now)
                return
            self._container_ended(m, code, now)
        elif run.reason == CONFIG_ERROR:
            if now >= m.restart_at:  # it never ran, so this is no restart
                self._start_main(m, run.restart_count, run.last_exit)
        elif now >= m.restart_at and self._restarts(run):
            last = run.last_exit
            if run.state == "terminated":
                last = (run.exit_code, run.reason, run.started_at, run.finished_at)
            self._start_main(m, run.restart_count + 1, last)

    def _restarts(self, run: ContainerRun) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        last_code = run.exit_code if run.state == "terminated" else (run.last_exit or (1,))[0]
        return policy == "Always" or (policy == "OnFailure" and last_code != 0)

    def _container_ended(self, m: _Main, code: int, now: float) -> None:
        opts = self._svc.options
        run = self._exited(m.spec, code)
        m.backoff = (
            opts.backoff_base_s if m.backoff == 0 else min(m.backoff * 2, opts.backoff_max_s)
        )
        m.restart_at = now + m.backoff
        if self._restarts(run):
            # What the kubelet shows between two runs of a crashing container.
            last = (run.exit_code, run.reason, run.started_at, run.finished_at)
            msg = f"back-off {m.backoff:.0f}s restarting failed container={m.spec['name']}"
            run = replace(
                run,
                state="waiting",
                reason="CrashLoopBackOff",
                message=msg,
                last_exit=last,
                container_id="",
            )
        self._set(m.spec["name"], run)

    def _probe(self, m: _Main, now: float) -> None:
        name = m.spec["name"]
        startup = m.trackers.get("startupProbe")
        if startup is not None and startup.passing is not True:
            if startup.due(now):
                verdict = startup.record(self._probe_once(m, startup), now)
                if verdict is True:
                    self._update(name, started=True, ready="readinessProbe" not in m.trackers)
                elif verdict is False:
                    self._kill(name, "startup probe failed")
            return
        readiness = m.trackers.get("readinessProbe")
        if readiness is not None and readiness.due(now):
            readiness.record(self._probe_once(m, readiness), now)
            self._update(name, ready=readiness.passing is True)
        liveness = m.trackers.get("livenessProbe")
        if liveness is not None and liveness.due(now):
            liveness.record(self._probe_once(m, liveness), now)
            if liveness.passing is False:
                self._kill(name, "liveness probe failed")

    def _probe_once(self, m: _Main, tracker: ProbeTracker) -> bool:
        name = m.spec["name"]

        def exec_in(argv: Sequence[str], seconds: float) -> int | None:
            try:
                return self.exec(name, argv, seconds).returncode
            except (subprocess.TimeoutExpired, RuntimeError):
                return None

        return run_probe(tracker.spec, m.spec, self.pod_ip, exec_in)

    def _kill(self, name: str, why: str) -> None:
        log.info("pod %s: container %s %s, restarting it", self.dir.name, name, why)
        grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        self._procs[name].stop(min(grace, self._svc.options.max_grace_s))


def _image_root_spec(container: Json, pod: Json, fs: image_table.ImageFs) -> dict[str, Any]:
    """For an image run from its own files: that root, the user and the read-only root the
    pod asks for. The host-backed stand-ins (the reference engine) keep the host's root and
    run as root, since their files are the host's."""
    if fs.root is None:
        return {}
    uid, gid = run_as(container, pod, fs.user)
    context = container.get("securityContext") or {}
    return {
        "lower_dir": str(fs.root),
        "user": [uid, gid],
        "read_only_root": bool(context.get("readOnlyRootFilesystem")),
    }
