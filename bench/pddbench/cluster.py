"""A benchmark cluster: the real local control plane (with an audit log of the clients under
test), simulated GPU nodes in a separate process, and a sampler of every process's CPU and RSS.

Registering 2,000 simulated nodes costs about a minute on a 2-core machine, and every run
wants a fresh cluster. So the fleet is registered once per fleet shape and etcd's data
directory is kept as a snapshot; each run copies it back and starts the control plane on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pdd_localcluster.controlplane import LocalControlPlane, parse_samples
from pdd_localcluster.fleet_activity import DAEMON_NAMESPACE, LABEL_SIMULATED, FleetActivity
from pdd_localcluster.kubejson import KubeJson
from pdd_localcluster.nodes import SimNode, gpu_fleet
from pdd_localcluster.nodesim import NodeSimulator

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO = BENCH_DIR.parent
OPERATOR_USER = "pdd-operator"
APPLY_USER = "bench-apply"  # the "applied by hand" arm's client
RACK_LABEL = "topology.kubernetes.io/rack"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
CLK_TCK = os.sysconf("SC_CLK_TCK")

AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}", "{APPLY_USER}"]
- level: None
"""


@dataclass(frozen=True)
class FleetSpec:
    """`cliques` NVLink cliques of `nodes_per_clique` 8-GPU nodes. A rack holds
    `cliques_per_rack` whole cliques (0: racks inside a clique, `racks_per_clique` of them)."""

    cliques: int
    nodes_per_clique: int
    racks_per_clique: int = 2
    cliques_per_rack: int = 0

    @property
    def nodes(self) -> int:
        return self.cliques * self.nodes_per_clique

    @property
    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:10]

    def build(self) -> list[SimNode]:
        extra = None
        if self.cliques_per_rack:
            npc, cpr = self.nodes_per_clique, self.cliques_per_rack

            def extra(index: int, _name: str) -> Mapping[str, str]:
                return {RACK_LABEL: f"rack-{index // npc // cpr:03d}"}

        return gpu_fleet(
            self.cliques,
            self.nodes_per_clique,
            racks_per_clique=1 if self.cliques_per_rack else self.racks_per_clique,
            zone="zone-a",
            extra_labels=extra,
        )


def node_domains(nodes: Iterable[SimNode]) -> dict[str, tuple[str, str]]:
    """node name -> (clique, rack)."""
    return {n.name: (n.labels[CLIQUE_LABEL], n.labels[RACK_LABEL]) for n in nodes}


class ProcSampler:
    """Samples CPU seconds and RSS of named pids once a second (from /proc)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.pids: dict[str, int] = {}
        self.series: dict[str, list[tuple[float, float, float]]] = {}  # t, cpu_s, rss_mib
        self.peak_rss: dict[str, float] = {}
        self.loadavg: list[tuple[float, float]] = []
        self.machine: list[tuple[float, float, float]] = []  # t, busy jiffies, total jiffies
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = time.monotonic()

    def add(self, name: str, pid: int | None) -> None:
        if pid:
            self.pids[name] = pid
            self.series.setdefault(name, [])

    def start(self) -> ProcSampler:
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        t = time.monotonic() - self.t0
        for name, pid in list(self.pids.items()):
            stats = proc_stats(pid)
            if stats is None:
                continue
            cpu, rss, hwm = stats
            self.series[name].append((t, cpu, rss))
            self.peak_rss[name] = max(self.peak_rss.get(name, 0.0), hwm, rss)
        with contextlib.suppress(OSError):
            self.loadavg.append((t, float(Path("/proc/loadavg").read_text().split()[0])))
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            idle = fields[3] + fields[4]
            self.machine.append((t, sum(fields) - idle, sum(fields)))

    def cpu_seconds(self, name: str, t_from: float = 0.0, t_to: float = 1e18) -> float:
        pts = [p for p in self.series.get(name, []) if t_from <= p[0] <= t_to]
        return pts[-1][1] - pts[0][1] if len(pts) > 1 else 0.0

    def last_cpu(self, name: str) -> float:
        pts = self.series.get(name) or []
        return pts[-1][1] if pts else 0.0

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, pts in self.series.items():
            if not pts:
                continue
            out[name] = {
                "cpu_seconds": round(pts[-1][1] - pts[0][1], 2),
                "cpu_seconds_total": round(pts[-1][1], 2),
                "peak_rss_mib": round(self.peak_rss.get(name, 0.0), 1),
                "last_rss_mib": round(pts[-1][2], 1),
            }
        if self.loadavg:
            vals = [v for _, v in self.loadavg]
            out["loadavg1"] = {"mean": round(sum(vals) / len(vals), 2), "max": max(vals)}
        return out


def proc_stats(pid: int) -> tuple[float, float, float] | None:
    """(cpu seconds user+system, RSS MiB, peak RSS MiB) of one process, None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    kb = {}
    for line in status.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            kb[key] = int(value.split()[0])
    return cpu, kb.get("VmRSS", 0) / 1024, kb.get("VmHWM", 0) / 1024


class BenchCluster:
    """One fresh cluster on a snapshot of a registered fleet; use as a context manager.

    `activity`: the fleet's own traffic (heartbeats, daemon pods, foreign pods, staged pod
    status). Its daemon pods are part of the snapshot, Running on every node before a run
    starts; the rest runs in the simulator process during the run."""

    def __init__(
        self,
        work_dir: Path,
        fleet: FleetSpec,
        *,
        controller_qps: int,
        sim_workers: int = 16,
        activity: FleetActivity | None = None,
        apiserver_profiling: bool = False,
        log: Any = print,
    ) -> None:
        self.work_dir = work_dir
        # /debug/pprof on the API server (off by default, as in the local control plane).
        self.apiserver_profiling = apiserver_profiling
        self.fleet = fleet
        self.nodes = fleet.build()
        self.controller_qps = controller_qps
        self.sim_workers = sim_workers
        self.activity = activity or FleetActivity()
        self.log = log
        daemons = self.activity.daemon_pods_per_node
        key = fleet.key + (f"-d{daemons}" if daemons else "")
        self.snapshot = work_dir / "snapshots" / key / "etcd"
        self.state_dir = work_dir / "cluster"
        self.cp: LocalControlPlane | None = None
        self.sim_proc: subprocess.Popen[bytes] | None = None
        self.sampler = ProcSampler()
        self.kube: KubeJson | None = None
        self.start_seconds = 0.0

    # ------------------------------------------------------------------ snapshot

    def ensure_snapshot(self) -> float:
        """Registers the fleet on an empty cluster once and keeps etcd's data; returns the
        seconds that took (0 when the snapshot existed)."""
        if (self.snapshot / "member").is_dir():
            return 0.0
        t0 = time.monotonic()
        tmp = self.work_dir / "snapshot-build"
        shutil.rmtree(tmp, ignore_errors=True)
        daemons_only = FleetActivity(daemon_pods_per_node=self.activity.daemon_pods_per_node)
        with (
            LocalControlPlane(tmp, controller_qps=self.controller_qps) as cp,
            NodeSimulator(
                cp.kubeconfig, self.nodes, workers=self.sim_workers, activity=daemons_only
            ) as sim,
        ):
            want = len(self.nodes) * sim.activity.daemon_pods_per_node
            if want:
                _wait_daemon_pods_running(cp.kubeconfig, want)
        self.snapshot.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.snapshot, ignore_errors=True)
        shutil.copytree(tmp / "etcd", self.snapshot)
        shutil.rmtree(tmp, ignore_errors=True)
        seconds = time.monotonic() - t0
        self.log(f"  registered {len(self.nodes)} nodes once (snapshot) in {seconds:.0f}s")
        return seconds

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> BenchCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "audit.log"

    def start(self) -> BenchCluster:
        t0 = time.monotonic()
        self.ensure_snapshot()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
        shutil.copytree(self.snapshot, self.state_dir / "etcd")
        self.audit_log.unlink(missing_ok=True)
        # Not audit-policy.yaml: LocalControlPlane writes its own (writes only) under that name.
        policy = self.state_dir / "bench-audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        self.cp = LocalControlPlane(
            self.state_dir,
            controller_qps=self.controller_qps,
            users={OPERATOR_USER: ["system:masters"], APPLY_USER: ["system:masters"]},
            extra_apiserver_args=[
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
                *(["--profiling=true"] if self.apiserver_profiling else []),
            ],
            reset=False,
        ).start()
        self._start_sim()
        self.kube = KubeJson(self.cp.kubeconfig, pool_size=8)
        for name, comp in self.cp._components.items():
            self.sampler.add(name, comp.pid)
        assert self.sim_proc is not None
        self.sampler.add("nodesim", self.sim_proc.pid)
        self.sampler.add("bench", os.getpid())
        self.sampler.start()
        self.start_seconds = time.monotonic() - t0
        return self

    def sim_activity(self) -> FleetActivity:
        """What the simulator process sends: everything but the daemon pods (in the
        snapshot already)."""
        return dataclasses.replace(self.activity, daemon_pods_per_node=0)

    def _start_sim(self) -> None:
        assert self.cp is not None
        fleet_file = self.state_dir / "fleet.json"
        fleet_file.write_text(
            json.dumps(
                [
                    {"name": n.name, "labels": dict(n.labels), "capacity": dict(n.capacity)}
                    for n in self.nodes
                ]
            )
        )
        ready = self.state_dir / "nodesim.ready"
        ready.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{BENCH_DIR}"}
        log = (self.state_dir / "logs" / "nodesim.log").open("ab")
        self.sim_proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pddbench.nodesim_main",
                "--kubeconfig",
                str(self.cp.kubeconfig),
                "--fleet",
                str(fleet_file),
                "--workers",
                str(self.sim_workers),
                "--ready-file",
                str(ready),
                "--stats-file",
                str(self.state_dir / "nodesim-stats.json"),
                "--activity",
                json.dumps(self.sim_activity().as_dict()),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while not ready.exists():
            if self.sim_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node simulator did not start; see {log.name}")
            time.sleep(0.1)

    def stop(self) -> None:
        try:
            self.sampler.stop()
            if self.sim_proc is not None and self.sim_proc.poll() is None:
                os.killpg(self.sim_proc.pid, signal.SIGTERM)
                try:
                    self.sim_proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.sim_proc.pid, signal.SIGKILL)
                    self.sim_proc.wait()
            if self.kube is not None:
                self.kube.close()
        finally:
            if self.cp is not None:
                self.cp.stop()

    def sim_stats(self) -> dict[str, Any]:
        path = self.state_dir / "nodesim-stats.json"
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(path.read_text()))
        return {}

    # ------------------------------------------------------------------ helpers

    def kubeconfig_for(self, user: str) -> Path:
        assert self.cp is not None
        return self.cp.kubeconfig_for(user)

    def create_namespace(self, name: str) -> None:
        assert self.kube is not None
        self.kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.kube.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
                return
            except Exception:
                time.sleep(0.1)
        raise TimeoutError(f"namespace {name}: no default ServiceAccount")

    def request_totals(self) -> dict[tuple[str, str], float]:
        """apiserver_request_total summed by (verb, resource[/subresource]), every client."""
        assert self.cp is not None
        out: dict[tuple[str, str], float] = {}
        for labels, value in parse_samples(self.cp.metrics(), "apiserver_request_total"):
            res = labels.get("resource", "")
            if labels.get("subresource"):
                res += "/" + labels["subresource"]
            key = (labels.get("verb", ""), res)
            out[key] = out.get(key, 0.0) + value
        return out


def _wait_daemon_pods_running(kubeconfig: Path, want: int, timeout: float = 600) -> None:
    """Until `want` daemon pods show a pod IP (their status was written)."""
    kube = KubeJson(kubeconfig, pool_size=2)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods, _ = kube.list_all(
                f"/api/v1/namespaces/{DAEMON_NAMESPACE}/pods",
                {"labelSelector": f"{LABEL_SIMULATED}=daemon"},
            )
            if sum(1 for p in pods if (p.get("status") or {}).get("podIP")) >= want:
                return
            time.sleep(1)
        raise TimeoutError(f"daemon pods: fewer than {want} running after {timeout:.0f}s")
    finally:
        kube.close()


def read_audit(path: Path, users: Iterable[str]) -> list[dict[str, Any]]:
    """One record per request of the given users: verb, resource, wall-clock time (s)."""
    wanted = set(users)
    seen: set[str] = set()
    out = []
    with contextlib.suppress(FileNotFoundError), path.open() as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            user = ev.get("user", {}).get("username", "")
            if user not in wanted or ev.get("auditID") in seen:
                continue
            seen.add(ev["auditID"])
            ref = ev.get("objectRef") or {}
            res = ref.get("resource", "")
            if ref.get("subresource"):
                res += "/" + ref["subresource"]
            out.append(
                {
                    "user": user,
                    "verb": ev.get("verb", ""),
                    "resource": res,
                    "name": ref.get("name", ""),
                    "t": _rfc3339(ev.get("requestReceivedTimestamp", "")),
                    "code": (ev.get("responseStatus") or {}).get("code", 0),
                }
            )
    return out


def _rfc3339(ts: str) -> float:
    from datetime import datetime

    if not ts:
        return 0.0
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def count_by(records: Iterable[Mapping[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r[key]] = out.get(r[key], 0) + 1
    return dict(sorted(out.items()))
