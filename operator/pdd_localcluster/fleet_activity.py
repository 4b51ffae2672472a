"""What a real fleet sends the apiserver besides our pods: kubelet heartbeats (node Leases and
node status reports), DaemonSet-like pods on every node, and foreign GPU pods that come and go.

An operator that watches every Node and every Pod pays for all of this; a simulated fleet
that sends none of it flatters such an operator. All of it is off by default (the test suite
stays fast); `FleetActivity.kubelet_defaults()` turns it on at the kubelet's default
intervals. Pod status in stages (Pending, then Running not Ready, then Ready, each its own
write) is in `pdd_localcluster.podstatus` and the simulator; its delays are set here too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from pdd_contract.resources import GPU_RESOURCE
from pdd_localcluster.kubejson import MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeJson
from pdd_localcluster.timers import Timers

log = logging.getLogger(__name__)

Json = dict[str, Any]

LEASE_NAMESPACE = "kube-node-lease"  # the apiserver creates it at start-up
DAEMON_NAMESPACE = "kube-system"
FOREIGN_NAMESPACE = "sim-foreign"
# The kubelet's defaults: a Lease renewed every 10 s (nodeLeaseDurationSeconds 40, renewed at
# a quarter of it) and a NodeStatus report every 5 min when nothing changed
# (nodeStatusReportFrequency).
KUBELET_LEASE_RENEW_S = 10.0
KUBELET_LEASE_DURATION_S = 40
KUBELET_STATUS_REPORT_S = 300.0
# The node agents a GPU node typically runs as DaemonSets, in the order they are added.
DAEMONS = (
    "kube-proxy",
    "nvidia-device-plugin",
    "node-exporter",
    "cni-agent",
    "dcgm-exporter",
    "gpu-feature-discovery",
)
NODE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
# A heartbeat this late (s) is counted: the simulator is not keeping the kubelet's pace.
HEARTBEAT_LATE_S = 1.0
FOREIGN_GPU_SIZES = (1, 2, 4, 8)  # GPUs of successive foreign pods, round-robin
LABEL_SIMULATED = "pdd.dev/simulated"  # "daemon" or "foreign": what the simulator made


@dataclass(frozen=True)
class FleetActivity:
    """Fleet traffic to simulate; every knob off (None or 0) by default.

    lease_renew_s: each node renews its Lease in kube-node-lease this often.
    node_status_report_s: each node reports its (unchanged) status this often; the kubelet
        writes between reports only when something changed, which nothing does here.
    daemon_pods_per_node: pods bound to each node at registration (kube-proxy, the device
        plugin, ...), in kube-system, as a DaemonSet would place them.
    foreign_gpu_pods: GPU pods of another tenant alive at any time, created unbound (the
        scheduler places them) and each deleted after `foreign_gpu_pod_lifetime_s` and
        replaced by a new one: a churn of foreign_gpu_pods / lifetime pods per second.
    pod_stage_delays_s: when set, pod status moves Pending (ContainerCreating) -> Running
        not Ready -> Ready as three writes, these (two) delays apart; None: one write to
        Ready, as before.
    """

    lease_renew_s: float | None = None
    node_status_report_s: float | None = None
    daemon_pods_per_node: int = 0
    foreign_gpu_pods: int = 0
    foreign_gpu_pod_lifetime_s: float = 300.0
    pod_stage_delays_s: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.daemon_pods_per_node <= len(DAEMONS):
            raise ValueError(f"daemon_pods_per_node: 0..{len(DAEMONS)}")
        if self.foreign_gpu_pods < 0 or self.foreign_gpu_pod_lifetime_s <= 0:
            raise ValueError("foreign_gpu_pods >= 0 and foreign_gpu_pod_lifetime_s > 0")
        for period in (self.lease_renew_s, self.node_status_report_s):
            if period is not None and period <= 0:
                raise ValueError("heartbeat periods must be > 0 (None turns one off)")

    @classmethod
    def kubelet_defaults(
        cls,
        *,
        daemon_pods_per_node: int = 3,
        foreign_gpu_pods: int = 0,
        foreign_gpu_pod_lifetime_s: float = 300.0,
        pod_stage_delays_s: tuple[float, float] = (1.0, 2.0),
    ) -> FleetActivity:
        """Heartbeats at the kubelet's default intervals, plus the given pods."""
        return cls(
            lease_renew_s=KUBELET_LEASE_RENEW_S,
            node_status_report_s=KUBELET_STATUS_REPORT_S,
            daemon_pods_per_node=daemon_pods_per_node,
            foreign_gpu_pods=foreign_gpu_pods,
            foreign_gpu_pod_lifetime_s=foreign_gpu_pod_lifetime_s,
            pod_stage_delays_s=pod_stage_delays_s,
        )

    @property
    def sends_requests(self) -> bool:
        """Whether any knob besides the pod stages is on (those need no runner)."""
        return (
            self.lease_renew_s is not None
            or self.node_status_report_s is not None
            or self.daemon_pods_per_node > 0
            or self.foreign_gpu_pods > 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# ----------------------------------------------------------------------------- the objects


def now_micro() -> str:
    """A Lease's MicroTime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_object(node: str, now: str) -> Json:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": KUBELET_LEASE_DURATION_S,
            "renewTime": now,
        },
    }


def heartbeat_patch(now: str) -> Json:
    """A status report that changes nothing but the conditions' heartbeat times (strategic
    merge: conditions merge by type, their other fields stay)."""
    return {
        "status": {"conditions": [{"type": t, "lastHeartbeatTime": now} for t in NODE_CONDITIONS]}
    }


def daemon_pod(node: str, daemon: str) -> Json:
    """A node agent bound to `node`, as the DaemonSet controller would create it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{daemon}-{node}",
            "namespace": DAEMON_NAMESPACE,
            "labels": {"app.kubernetes.io/name": daemon, LABEL_SIMULATED: "daemon"},
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": daemon,
                    "image": f"registry.example/{daemon}:sim",
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                }
            ],
        },
    }


def foreign_gpu_pod(index: int) -> Json:
    """Another tenant's GPU pod, unbound: the scheduler places it."""
    gpus = FOREIGN_GPU_SIZES[index % len(FOREIGN_GPU_SIZES)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"foreign-gpu-{index:06d}",
            "namespace": FOREIGN_NAMESPACE,
            "labels": {"app.kubernetes.io/name": "foreign-training", LABEL_SIMULATED: "foreign"},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:sim",
                    "resources": {
                        "requests": {GPU_RESOURCE: str(gpus), "cpu": "1", "memory": "4Gi"},
                        "limits": {GPU_RESOURCE: str(gpus)},
                    },
                }
            ],
        },
    }


def phase_offset(name: str, period: float) -> float:
    """Where in the period a node's heartbeat falls: spread over the period, stable per node
    (kubelets start at different times; 2,000 renewals in one instant would be a storm no
    real fleet sends)."""
    return (zlib.crc32(name.encode()) % 10_000) / 10_000 * period


# ----------------------------------------------------------------------------- the runner


class FleetActivityRunner:
    """Sends the traffic of a `FleetActivity` for the nodes a simulator has.

    The simulator calls `node_added` for each node it registers; `has_node(name)` is asked at
    every heartbeat, so a deleted node stops sending; `count(name)` adds one to a simulator
    counter."""

    def __init__(
        self,
        kubeconfig: Path | str,
        activity: FleetActivity,
        has_node: Callable[[str], bool],
        count: Callable[[str], None],
        workers: int = 4,
    ) -> None:
        self.activity = activity
        self._has_node = has_node
        self._count = count
        self._kube = KubeJson(kubeconfig, pool_size=workers + 2)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="fleet-activity")
        self._timers = Timers(self._pool, name="fleet-activity-timers")
        self._stop = threading.Event()
        self._foreign_seq = itertools.count()

    def start(self) -> FleetActivityRunner:
        self._timers.start()
        if self.activity.foreign_gpu_pods:
            self._ensure_namespace(FOREIGN_NAMESPACE)
            # Staggered over one lifetime, so the churn is even from the start.
            step = self.activity.foreign_gpu_pod_lifetime_s / self.activity.foreign_gpu_pods
            for i in range(self.activity.foreign_gpu_pods):
                self._timers.call_later(i * step, _logged(self._foreign_pod_cycle))
        return self

    def stop(self) -> None:
        """Stops the traffic; the foreign pods go with it (they would hold GPUs of a fleet
        the next user counts on). Daemon pods stay with their nodes."""
        self._stop.set()
        self._timers.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.activity.foreign_gpu_pods:
            with contextlib.suppress(ApiException, OSError, urllib3.exceptions.HTTPError):
                self._kube.request(
                    "DELETE",
                    f"/api/v1/namespaces/{FOREIGN_NAMESPACE}/pods",
                    # At once: no simulated kubelet is left to confirm a graceful end.
                    query={"labelSelector": f"{LABEL_SIMULATED}=foreign", "gracePeriodSeconds": 0},
                )
        self._kube.close()

    # ------------------------------------------------------------------ per node

    def node_added(self, node: str) -> None:
        """Creates the node's daemon pods and starts its heartbeats."""
        for daemon in DAEMONS[: self.activity.daemon_pods_per_node]:
            self._create(f"/api/v1/namespaces/{DAEMON_NAMESPACE}/pods", daemon_pod(node, daemon))
            self._count("daemon_pods_created")
        beats = (
            (self.activity.lease_renew_s, self._renew_lease, "lease_renewals"),
            (self.activity.node_status_report_s, self._report_status, "node_status_reports"),
        )
        for period, action, counter in beats:
            if period is not None:
                due = time.monotonic() + phase_offset(node, period)
                self._arm(_Beat(node, period, action, counter), due)

    def node_removed(self, node: str) -> None:
        """The kubelet is gone: its Lease goes (the heartbeats stop by themselves)."""
        with contextlib.suppress(ApiException):
            self._kube.request(
                "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}"
            )

    def _arm(self, beat: _Beat, due: float) -> None:
        self._timers.call_later(due - time.monotonic(), _logged(partial(self._run_beat, beat, due)))

    def _run_beat(self, beat: _Beat, due: float) -> None:
        """One heartbeat, and the next one period after this one was due (not after it ran,
        so a slow apiserver shows as lateness instead of a longer period)."""
        if self._stop.is_set() or not self._has_node(beat.node):
            return
        now = time.monotonic()
        if now - due > HEARTBEAT_LATE_S:
            self._count("heartbeats_late")
        try:
            beat.action(beat.node)
            self._count(beat.counter)
        finally:
            if not self._stop.is_set():
                self._arm(beat, max(due + beat.period, now))

    def _renew_lease(self, node: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}"
        now = now_micro()
        try:
            self._kube.request(
                "PATCH", path, body={"spec": {"renewTime": now}}, content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status != 404:
                raise
            self._create(
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases",
                lease_object(node, now),
            )

    def _report_status(self, node: str) -> None:
        self._kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            body=heartbeat_patch(datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")),
            content_type=STRATEGIC_MERGE_PATCH,
        )

    # ------------------------------------------------------------------ foreign pods

    def _foreign_pod_cycle(self) -> None:
        """Creates one foreign pod and, a lifetime later, deletes it and starts the next."""
        if self._stop.is_set():
            return
        body = foreign_gpu_pod(next(self._foreign_seq))
        name = body["metadata"]["name"]
        # Armed first: a failed create must not shrink the population for good.
        self._timers.call_later(
            self.activity.foreign_gpu_pod_lifetime_s, _logged(partial(self._foreign_pod_ends, name))
        )
        self._create(f"/api/v1/namespaces/{FOREIGN_NAMESPACE}/pods", body)
        self._count("foreign_pods_created")

    def _foreign_pod_ends(self, name: str) -> None:
        if self._stop.is_set():
            return
        # A graceful delete, as a finished job's pod gets; the simulated kubelet confirms it.
        with contextlib.suppress(ApiException):
            self._kube.request("DELETE", f"/api/v1/namespaces/{FOREIGN_NAMESPACE}/pods/{name}")
            self._count("foreign_pods_deleted")
        self._foreign_pod_cycle()

    # ------------------------------------------------------------------ helpers

    def _ensure_namespace(self, name: str) -> None:
        self._create("/api/v1/namespaces", {"metadata": {"name": name}})

    def _create(self, path: str, body: Json) -> None:
        """POST, where an object left from an earlier run (409) counts as created."""
        try:
            self._kube.request("POST", path, body=body)
        except ApiException as e:
            if e.status != 409:
                raise


@dataclass(frozen=True)
class _Beat:
    """A node's periodic request: its Lease renewal or its status report."""

    node: str
    period: float
    action: Callable[[str], None]
    counter: str


def _logged(fn: Callable[[], None]) -> Callable[[], None]:
    """A timer callback whose errors are logged, not lost in a Future nobody reads."""

    def run() -> None:
        try:
            fn()
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as e:
            log.warning("fleet activity: %s", e)
        except Exception:
            log.exception("fleet activity failed")

    return run
