"""The node simulator: what the kubelets would do, for nodes that do not exist.

It registers Nodes (capacity, GFD/NFD labels, Ready), watches the pods bound to them and
writes the status a kubelet would report (Running and Ready, with a pod IP from
198.18.0.0/15), and force-deletes pods that are being deleted, since no kubelet will confirm
their end.

With a `FleetActivity` (`pdd_localcluster.fleet_activity`), it also sends what a real fleet
sends: Lease renewals and node status reports, daemon pods on every node, foreign GPU pods
that come and go, and pod status in stages (Pending, Running not Ready, Ready) as separate
writes. All of that is off by default.

With a `runtime` (`pdd_localcluster.runtime.PodRuntime`), pods whose images it knows really
run as local processes: the runtime reports their containers' states and probe results and
the simulator writes those; deleting such a pod stops its processes first.

One thread watches (list, then watch from its resourceVersion, re-list on 410 Gone); a pool
of worker threads writes. Work is keyed by pod UID so a pod has at most one write in flight.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import urllib3
from kubernetes.client.exceptions import ApiException

from pdd_localcluster import podstatus
from pdd_localcluster.fleet_activity import FleetActivity, FleetActivityRunner
from pdd_localcluster.kubejson import MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeJson, watch_events
from pdd_localcluster.nodes import (
    IpPool,
    SimNode,
    node_object,
    node_ready_condition,
    taints_for_readiness,
)
from pdd_localcluster.podstatus import InitFailure, PodPlan, Stage, now_rfc3339
from pdd_localcluster.timers import Timers

if TYPE_CHECKING:
    from pdd_localcluster.runtime import PodRuntime

log = logging.getLogger(__name__)

Json = dict[str, Any]

# Decides, once per pod, whether its first init container fails: None for success, or
# (exit_code, termination message). Gets the pod as the apiserver's JSON and its node.
InitOutcome = Callable[[Json, SimNode], tuple[int, str] | None]

# Simulated addresses come from 198.18.0.0/15 (RFC 2544, reserved for benchmark networks):
# EndpointSlices refuse loopback and link-local addresses, and nothing is ever sent to these.
POD_IP_START = "198.18.0.1"
NODE_IP_START = "198.19.0.1"
WATCH_TIMEOUT_S = 60  # the apiserver ends the watch after this; it is reopened from its RV
BOUND_PODS = {"fieldSelector": "spec.nodeName!="}


@dataclass
class SimStats:
    """Counters for benchmarks and for tests that check the simulator kept up."""

    status_writes: int = 0
    force_deletes: int = 0
    relists: int = 0
    errors: int = 0
    # Fleet activity (zero unless a FleetActivity asks for it).
    stage_advances: int = 0
    lease_renewals: int = 0
    node_status_reports: int = 0
    heartbeats_late: int = 0  # renewals or reports that ran over a second after they were due
    daemon_pods_created: int = 0
    foreign_pods_created: int = 0
    foreign_pods_deleted: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _PodState:
    ip: str
    failure: InitFailure | None
    # While a write for the pod is in flight, the newest event seen meanwhile; re-checked
    # when the write returns so no change is lost.
    pending: Json | None = None
    busy: bool = False
    deleting: bool = False
    gone: bool = False  # a DELETED event came while a write was in flight
    running: bool = False  # its containers run in the runtime
    last: Json | None = None  # the newest pod seen, re-checked when the runtime reports
    stage: Stage = Stage.READY  # with staged status: the stage it is to show next
    # The resourceVersion our last write produced; older events (already in flight when we
    # wrote) are skipped, or a stage would be written twice.
    written_rv: int = 0


class NodeSimulator:
    """Simulated kubelets for `nodes`. Use as a context manager, or start()/stop().

    `init_outcome` may be replaced at any time (`set_init_outcome`); it is asked once per pod.
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        nodes: Iterable[SimNode] = (),
        *,
        workers: int = 16,
        init_outcome: InitOutcome | None = None,
        pod_ips: Iterator[str] | None = None,
        runtime: PodRuntime | None = None,
        activity: FleetActivity | None = None,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._kube = KubeJson(kubeconfig, pool_size=workers + 4)
        self._workers = workers
        self._initial = list(nodes)
        self._init_outcome = init_outcome
        self._nodes: dict[str, SimNode] = {}
        self._node_ips: dict[str, str] = {}
        self._node_ready: dict[str, bool] = {}
        self._pods: dict[str, _PodState] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch_resp: Any = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        # Pod addresses, in order. Default: simulated ones nothing listens on. A test whose
        # pods must answer (stand-in engines for a real router) passes loopback ones
        # (127.0.0.0/8) and listens there; EndpointSlices leave those out.
        self._pod_ips = pod_ips if pod_ips is not None else iter(IpPool(POD_IP_START))
        self._node_ip_pool = IpPool(NODE_IP_START)
        self._synced = threading.Event()
        self.stats = SimStats()
        self.runtime = runtime
        self.activity = activity or FleetActivity()
        self._timers: Timers | None = None
        self._fleet: FleetActivityRunner | None = None

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Registers the nodes, then starts the pod watch; returns once the first list of
        bound pods has been handed to the workers."""
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="nodesim")
        self._timers = Timers(self._pool).start()
        if self.activity.sends_requests:
            self._fleet = FleetActivityRunner(
                self._kubeconfig,
                self.activity,
                self._has_node,
                self._count,
                # 2,000 kubelets renew 200 Leases a second: a thread per 100 nodes.
                workers=max(4, min(32, len(self._initial) // 100)),
            ).start()
        self.add_nodes(self._initial)
        self._thread = threading.Thread(target=self._watch_loop, name="nodesim-watch", daemon=True)
        self._thread.start()
        if not self._synced.wait(60):
            raise RuntimeError("node simulator: the first pod list did not finish in 60s")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._fleet is not None:
            self._fleet.stop()
        if self._timers is not None:
            self._timers.stop()
        self._close_watch()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self.runtime is not None:
            self.runtime.close()
        self._kube.close()

    # ----------------------------------------------------------------- nodes

    @property
    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def _has_node(self, name: str) -> bool:
        with self._lock:
            return name in self._nodes

    def node(self, name: str) -> SimNode:
        return self._nodes[name]

    def node_ip(self, name: str) -> str:
        return self._node_ips[name]

    def add_nodes(self, nodes: Iterable[SimNode]) -> None:
        """Registers nodes (in parallel) and waits until all exist and are Ready."""
        assert self._pool is not None, "start() first"
        specs = list(nodes)
        with self._lock:
            for n in specs:
                self._nodes[n.name] = n
                self._node_ready[n.name] = True
                self._node_ips.setdefault(n.name, self._node_ip_pool.allocate())
        # list() drains map(), which re-raises the first registration error.
        list(self._pool.map(self._register_node, specs))
        if self._fleet is not None:
            list(self._pool.map(self._fleet.node_added, [n.name for n in specs]))

    @contextlib.contextmanager
    def nodes_for_a_while(self, nodes: Iterable[SimNode]) -> Iterator[list[str]]:
        """Adds `nodes` for the block and deletes those still there after it, so a test
        can add, drain or delete nodes of its own without changing the fleet other tests
        count."""
        specs = list(nodes)
        self.add_nodes(specs)
        try:
            yield [n.name for n in specs]
        finally:
            for node in specs:
                if node.name in self.node_names:
                    self.delete_node(node.name)

    def delete_node(self, name: str, *, delete_pods: bool = True) -> None:
        """Deletes the Node. With `delete_pods` its pods go too, as the pod garbage collector
        would do a little later for pods bound to a node that no longer exists."""
        with self._lock:
            self._nodes.pop(name, None)
            self._node_ready.pop(name, None)
        with contextlib.suppress(_NotFound):
            self._call("DELETE", f"/api/v1/nodes/{name}")
        if self._fleet is not None:
            self._fleet.node_removed(name)
        if delete_pods:
            for pod in self._pods_on(name):
                self._stop_and_delete(pod)

    def set_node_ready(self, name: str, ready: bool, reason: str = "") -> None:
        """Flips the node's Ready condition and the not-ready taint, and marks its pods
        (not) Ready, as the node-lifecycle controller would."""
        reason = reason or ("KubeletReady" if ready else "KubeletNotReady")
        message = "kubelet is posting ready status" if ready else f"simulated: {reason}"
        now = now_rfc3339()
        cond = node_ready_condition(ready, reason, message, now)
        self._call(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": {"conditions": [cond]}},
            content_type=STRATEGIC_MERGE_PATCH,
        )
        self._set_not_ready_taint(name, ready)
        with self._lock:
            self._node_ready[name] = ready
        for pod in self._pods_on(name):
            self._on_pod(pod)

    def _set_not_ready_taint(self, name: str, ready: bool) -> None:
        # Taints have no merge key, so the whole list is replaced; the resourceVersion makes
        # that safe against a concurrent writer (retried on conflict).
        for _ in range(5):
            node = self._call("GET", f"/api/v1/nodes/{name}")
            taints = taints_for_readiness(node.get("spec", {}).get("taints") or [], ready)
            body = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            try:
                self._call("PATCH", f"/api/v1/nodes/{name}", body=body, content_type=MERGE_PATCH)
                return
            except _Conflict:
                continue
        raise RuntimeError(f"node {name}: taints kept changing under us")

    def _register_node(self, node: SimNode) -> None:
        obj = node_object(node, self._node_ips[node.name], now_rfc3339())
        try:
            created = self._call("POST", "/api/v1/nodes", body=obj, retries=4)
        except ApiException as e:
            if e.status != 409:
                raise
            created = {}  # left from an earlier run against the same cluster
        # The TaintNodesByCondition admission plugin gives every new Node the not-ready taint;
        # in a cluster the node-lifecycle controller lifts it once the kubelet reports Ready.
        if not created or (created["spec"].get("taints") or []) != obj["spec"]["taints"]:
            patch = {k: obj[k] for k in ("metadata", "spec")}
            path = f"/api/v1/nodes/{node.name}"
            self._call("PATCH", path, body=patch, content_type=MERGE_PATCH, retries=4)
        if not created.get("status", {}).get("conditions"):
            path = f"/api/v1/nodes/{node.name}/status"
            body = {"status": obj["status"]}
            self._call("PATCH", path, body=body, content_type=MERGE_PATCH, retries=4)

    # ----------------------------------------------------------------- hooks

    def set_init_outcome(self, hook: InitOutcome | None) -> None:
        """Replaces the hook; pods seen before keep the outcome they got."""
        self._init_outcome = hook

    @contextlib.contextmanager
    def using_init_outcome(self, hook: InitOutcome | None) -> Iterator[None]:
        """Uses `hook` inside the block, the previous one after it."""
        previous = self._init_outcome
        self._init_outcome = hook
        try:
            yield
        finally:
            self._init_outcome = previous

    def pod_ip(self, uid: str) -> str | None:
        with self._lock:
            st = self._pods.get(uid)
            return st.ip if st else None

    # ----------------------------------------------------------------- the watch

    def _watch_loop(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                rv = self._relist()
                self._synced.set()
                delay = 0.2
                self._watch_from(rv)
            except _Gone:
                continue  # our resourceVersion was compacted away: list again
            except Exception as e:
                if self._stop.is_set():
                    return
                self._count("errors")
                # Losing the connection is expected (fault tests restart the apiserver; the
                # list is redone once it is back); anything else deserves its traceback.
                expected = isinstance(e, (OSError, urllib3.exceptions.HTTPError, ApiException))
                log.warning(
                    "node simulator: pod watch failed (%s); again in %.1fs",
                    e,
                    delay,
                    exc_info=not expected,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)

    def _relist(self) -> str:
        pods, rv = self._kube.list_all("/api/v1/pods", BOUND_PODS)
        self._count("relists")
        live = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            gone = [u for u in self._pods if u not in live and not self._pods[u].busy]
            ran = [u for u in gone if self._pods.pop(u).running]
        if self.runtime is not None:
            for uid in ran:  # deleted while we were not watching: its processes go too
                self.runtime.stop(uid, 0.0)
        for pod in pods:
            self._on_pod(pod)
        return rv

    def _watch_from(self, rv: str) -> None:
        """Follows pod events from `rv` until stopped; returns only by raising _Gone or on
        an error, reopening the watch whenever the apiserver ends it."""
        while not self._stop.is_set():
            query: dict[str, str | int] = {
                **BOUND_PODS,
                "resourceVersion": rv,
                "timeoutSeconds": WATCH_TIMEOUT_S,
            }
            try:
                resp = self._kube.open_watch("/api/v1/pods", query, WATCH_TIMEOUT_S + 30)
            except ApiException as e:
                if e.status == 410:
                    raise _Gone() from e
                raise
            self._watch_resp = resp
            if self._stop.is_set():  # stop() ran before the response was published
                resp.release_conn()
                return
            try:
                rv = self._consume(resp, rv)
            finally:
                self._watch_resp = None
                resp.release_conn()

    def _consume(self, resp: Any, rv: str) -> str:
        for event in watch_events(resp):
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone()
                raise RuntimeError(f"watch error: {obj.get('message')}")
            rv = obj.get("metadata", {}).get("resourceVersion", rv)
            if event.get("type") == "DELETED":
                self._forget(obj["metadata"]["uid"])
            elif event.get("type") in ("ADDED", "MODIFIED"):
                self._on_pod(obj)
        return rv

    def _close_watch(self) -> None:
        resp = self._watch_resp
        if resp is not None:
            # shutdown() unblocks a read in progress in the watch thread.
            with contextlib.suppress(Exception):
                resp.shutdown()

    # ----------------------------------------------------------------- per pod

    def _on_pod(self, pod: Json) -> None:
        """Decides what the pod needs and hands that to a worker, at most one per pod."""
        uid = pod["metadata"]["uid"]
        with self._lock:
            node = self._nodes.get(pod.get("spec", {}).get("nodeName") or "")
            if node is None or self._stop.is_set():
                return
            known = uid in self._pods
            if known and _rv(pod) < self._pods[uid].written_rv:
                return  # older than our own last write: a newer event follows
        # The hook is user code: never call it while holding the lock.
        failure = None if known else self._ask_hook(pod, node)
        runs = not known and failure is None and self._runs_in_runtime(pod)
        with self._lock:
            st = self._pods.get(uid)
            if st is None:
                ip = pod.get("status", {}).get("podIP") or next(self._pod_ips)
                st = self._pods[uid] = _PodState(
                    ip, failure, running=runs, stage=self._first_stage(pod)
                )
                if runs:
                    assert self.runtime is not None
                    self.runtime.start(
                        pod, ip, self._node_ips[node.name], partial(self._runtime_changed, uid)
                    )
            st.last = pod
            job = self._next_job(pod, node, st)
        if job is not None:
            assert self._pool is not None
            with contextlib.suppress(RuntimeError):  # the pool shut down during stop()
                self._pool.submit(self._run_job, uid, job)

    def _next_job(self, pod: Json, node: SimNode, st: _PodState) -> Callable[[], None] | None:
        """The write the pod needs now, if any; marks the pod busy. Called under the lock."""
        if st.busy:
            st.pending = pod
            return None
        if pod["metadata"].get("deletionTimestamp"):
            if st.deleting:
                return None
            st.deleting = st.busy = True
            return partial(self._stop_and_delete, pod)
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return None
        plan = PodPlan(
            st.ip,
            self._node_ips[node.name],
            self._node_ready[node.name],
            st.failure,
            stage=st.stage,
        )
        if st.running:
            plan = self._runtime_plan(pod, plan)
        if podstatus.status_matches(pod, plan):
            return None
        st.busy = True
        return partial(self._write_status, pod, plan)

    def _first_stage(self, pod: Json) -> Stage:
        """With staged status, a new pod starts at CREATING; one that already shows an IP
        (written before this simulator started) stays where it is."""
        if self.activity.pod_stage_delays_s is None or pod.get("status", {}).get("podIP"):
            return Stage.READY
        return Stage.CREATING

    def _advance(self, uid: str, stage: Stage) -> None:
        """The pod's stage is over: write the next one."""
        with self._lock:
            st = self._pods.get(uid)
            if st is None or st.stage != stage or st.deleting:
                return
            st.stage = Stage(stage + 1)
            pod = st.last
        self._count("stage_advances")
        if pod is not None:
            self._on_pod(pod)

    def _runs_in_runtime(self, pod: Json) -> bool:
        """Whether the pod's containers are to run: a runtime that knows all its images,
        and a pod neither finished nor being deleted. A pod of other images keeps the
        simulated status, and its logs say so."""
        runtime = self.runtime
        if runtime is None or pod["metadata"].get("deletionTimestamp"):
            return False
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return False
        unknown = runtime.unknown_images(pod)
        if unknown:
            runtime.note_simulated(pod, unknown)
        return not unknown

    def _runtime_plan(self, pod: Json, plan: PodPlan) -> PodPlan:
        assert self.runtime is not None
        snapshot = self.runtime.snapshot(pod["metadata"]["uid"])
        if isinstance(snapshot, InitFailure):
            return replace(plan, init_failure=snapshot)
        return replace(plan, run=snapshot or podstatus.PodRun.creating(pod))

    def _runtime_changed(self, uid: str) -> None:
        """The runtime saw a container start, end or change readiness: write the status."""
        with self._lock:
            st = self._pods.get(uid)
            pod = st.last if st is not None else None
        if pod is not None:
            self._on_pod(pod)

    def _stop_and_delete(self, pod: Json) -> None:
        """SIGTERM to the pod's processes, SIGKILL after its grace period (capped by the
        runtime), then the force-delete no kubelet will do for us."""
        if self.runtime is not None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
            self.runtime.stop(pod["metadata"]["uid"], float(grace))
        self._force_delete(pod)

    def _ask_hook(self, pod: Json, node: SimNode) -> InitFailure | None:
        hook = self._init_outcome
        if hook is None:
            return None
        try:
            outcome = hook(pod, node)
        except Exception as e:  # a broken hook should show on the pod, not kill the simulator
            log.exception("init_outcome hook failed")
            return InitFailure(1, f"init_outcome hook raised {e!r}")
        return InitFailure(int(outcome[0]), str(outcome[1])) if outcome else None

    def _run_job(self, uid: str, job: Callable[[], None]) -> None:
        try:
            job()
        except Exception:
            self._count("errors")
            log.exception("node simulator: write for pod %s failed", uid)
        with self._lock:
            st = self._pods.get(uid)
            if st is None:
                return
            if st.gone or st.deleting:
                # Done with this pod. Should a failed delete leave it behind, its next event
                # starts over (keeping the pod IP from its status).
                del self._pods[uid]
                return
            st.busy = False
            pending, st.pending = st.pending, None
        if pending is not None:
            self._on_pod(pending)

    def _write_status(self, pod: Json, plan: PodPlan) -> None:
        meta = pod["metadata"]
        status = podstatus.desired_status(pod, plan, now_rfc3339())
        # The UID makes the patch conditional: a StatefulSet pod re-created under the same
        # name must not receive the status meant for its predecessor.
        body = {"metadata": {"uid": meta["uid"]}, "status": status}
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        with contextlib.suppress(_NotFound, _Conflict):
            written = self._call("PATCH", path, body=body, content_type=MERGE_PATCH, retries=4)
            self._count("status_writes")
            self._wrote(meta["uid"], written, plan)

    def _wrote(self, uid: str, written: Json, plan: PodPlan) -> None:
        """Remembers the pod our write produced; a staged pod moves on after its delay."""
        with self._lock:
            st = self._pods.get(uid)
            if st is None:
                return
            st.written_rv = _rv(written)
            st.last = written
        delays = self.activity.pod_stage_delays_s
        if plan.staged and delays is not None and self._timers is not None:
            self._timers.call_later(delays[plan.stage], partial(self._advance, uid, plan.stage))

    def _force_delete(self, pod: Json) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        with contextlib.suppress(_NotFound, _Conflict):
            self._call("DELETE", path, body=body, retries=4)
            self._count("force_deletes")

    def _forget(self, uid: str) -> None:
        with self._lock:
            st = self._pods.get(uid)
            if st is None:
                return
            if st.running and self.runtime is not None and self._pool is not None:
                # Deleted by someone else (a force delete): its processes must go too.
                with contextlib.suppress(RuntimeError):
                    self._pool.submit(self.runtime.stop, uid, 0.0)
            if st.busy:
                st.gone = True  # _run_job drops it when the write returns
            else:
                del self._pods[uid]

    def _pods_on(self, node_name: str) -> list[Json]:
        pods, _ = self._kube.list_all(
            "/api/v1/pods", {"fieldSelector": f"spec.nodeName={node_name}"}
        )
        return pods

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    # ----------------------------------------------------------------- HTTP

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Json | None = None,
        content_type: str | None = None,
        retries: int = 0,
    ) -> Json:
        """One request, retried with backoff on errors worth retrying (the apiserver
        restarting, throttling); 404 and 409 surface as _NotFound/_Conflict."""
        delay = 0.1
        for attempt in range(retries + 1):
            try:
                return self._kube.request(method, path, body=body, content_type=content_type)
            except ApiException as e:
                if e.status == 404:
                    raise _NotFound() from e
                if e.status == 409 and method != "POST":
                    raise _Conflict() from e
                if not _retryable(e.status) or attempt == retries:
                    raise
            except (OSError, urllib3.exceptions.HTTPError):
                if attempt == retries:
                    raise
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, 2.0)
        raise RuntimeError(f"{method} {path}: stopped while retrying")


def _rv(obj: Json) -> int:
    """The object's resourceVersion as a number: etcd's revision, which only grows (opaque
    to clients in general; here the simulator only compares its own pods' versions)."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _retryable(status: int | None) -> bool:
    return status in (None, 0, 429, 500, 502, 503, 504)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410)."""


class _NotFound(Exception):
    pass


class _Conflict(Exception):
    pass


__all__ = ["FleetActivity", "InitOutcome", "NodeSimulator", "SimNode", "SimStats"]
