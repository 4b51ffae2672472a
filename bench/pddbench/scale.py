"""Scale runs: N PDDeployments through the operator, and the same workloads applied directly
as the rendered children; each arm on a fresh cluster started from the same fleet snapshot."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config as kconfig

from pdd_localcluster.controlplane import parse_samples
from pdd_localcluster.fleet_activity import FleetActivity
from pdd_operator.api import names
from pdd_operator.kube.client import KubeApi
from pdd_operator.planning.placement import Placement
from pddbench import analysis
from pddbench.apiserver_profile import ApiServerProfiler
from pddbench.apiserver_profile import summarize as apiserver_summary
from pddbench.cluster import (
    APPLY_USER,
    OPERATOR_USER,
    BenchCluster,
    FleetSpec,
    count_by,
    node_domains,
    read_audit,
)
from pddbench.summary import MACHINE_PROCESSES
from pddbench.watch import Watcher
from pddbench.workload import (
    SCALE_MIX,
    Shape,
    pdd_body,
    pick_shapes,
    render_plain,
    with_defaults,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import itertools

from helpers.operator_proc import NAME_GUARD_ENV, OperatorProcess, install_crd, install_name_guard

NAMESPACE = "bench"
# The resources the operator writes: writes to these during a no-op resync must be 0.
OPERATOR_RESOURCES = {
    "pddeployments",
    "pddeployments/status",
    "statefulsets",
    "services",
    "deployments",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "networkpolicies",
    "poddisruptionbudgets",
    "secrets",
    "events",
    "resourceclaimtemplates",
}
# The operator runs as shipped: as the chart runs it, with the name-guard policy installed and
# named to it (`install_operator`). (Until the fix, its default PDD_WORKER_LIMIT=64 deadlocked
# kopf at start-up on a cluster with more than 64 Nodes, and the runs had to lift it;
# `startup_probe` checks the shipped settings on the bench's fleet.)
OPERATOR_ENV: dict[str, str] = dict(NAME_GUARD_ENV)


def install_operator(cl: BenchCluster) -> None:
    """What a Helm install puts in the cluster before the operator starts: the CRDs and the
    name-guard policy (once the API server enforces it)."""
    assert cl.cp is not None
    admin = kconfig.new_client_from_config(config_file=str(cl.cp.kubeconfig))
    try:
        install_crd(admin)
        install_name_guard(admin)
    finally:
        admin.close()


READ_VERBS = ("get", "list", "watch")
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


@dataclass(frozen=True)
class ScaleConfig:
    n: int
    fleet: FleetSpec
    controller_qps: int
    converge_timeout: float
    resync_seconds: float
    settle_seconds: float
    steady_seconds: float
    apply_workers: int = 8  # client threads creating PDDeployments (one request each)
    # Client threads applying the rendered children in the direct arm: as many as the
    # operator's API pool, so the baseline measures the control plane, not a slow client.
    direct_apply_workers: int = 32
    placement: str = "preferred"
    seed: int = 7
    profile: bool = False
    # py-spy samples per second; it runs on the same cores, so the default keeps its share small.
    profile_rate: int = 25
    # Go CPU profiles of the API server over each arm's create -> converged window.
    apiserver_profile: bool = False
    # The fleet's own traffic during the run (off: as quiet as the bench was before).
    activity: FleetActivity = field(default_factory=FleetActivity)


def deployment_names(n: int) -> list[str]:
    return [f"llm-{i:04d}" for i in range(n)]


class Arm:
    """What both arms share: the cluster, the apply stream, the wait, the collection."""

    def __init__(self, cfg: ScaleConfig, arm: str, work_dir: Path, raw_dir: Path, log: Any):
        self.cfg = cfg
        self.arm = arm
        self.work_dir = work_dir
        self.raw_dir = raw_dir
        self.log = log
        self.names = deployment_names(cfg.n)
        self.shapes = dict(zip(self.names, pick_shapes(cfg.n, SCALE_MIX, cfg.seed), strict=True))
        self.t_apply: dict[str, float] = {}
        self.t_applied: dict[str, float] = {}
        self.apply_errors: list[str] = []
        self.timeline: list[tuple[float, int, int, int]] = []
        self.t0 = 0.0
        self.t0_wall = 0.0
        self._sampling = threading.Event()

    def start_clock(self, watcher: Watcher) -> None:
        """t0: the whole burst is submitted now; the timeline samples from here."""
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self._sampling = threading.Event()
        threading.Thread(target=self._sample_loop, args=(watcher,), daemon=True).start()

    def apply_stream(self, apply_one: Any, watcher: Watcher) -> None:
        self.start_clock(watcher)

        def one(name: str) -> None:
            self.t_apply[name] = time.monotonic()
            try:
                apply_one(name)
            except Exception as err:
                self.apply_errors.append(f"{name}: {err}")
            self.t_applied[name] = time.monotonic()

        with ThreadPoolExecutor(self.cfg.apply_workers) as pool:
            list(pool.map(one, self.names))

    def _counts(self, watcher: Watcher) -> tuple[dict[str, Any], int, int, int]:
        times = {n: watcher.deployment_times(n) for n in self.names}
        created = sum(1 for t in times.values() if t["children"])
        ready = sum(1 for t in times.values() if t["ready"])
        pdd_ready = sum(1 for t in times.values() if t["pdd_ready"])
        return times, created, ready, pdd_ready

    def _sample_loop(self, watcher: Watcher) -> None:
        """The timeline for the plots, once a second from the first apply on."""
        while not self._sampling.wait(1.0):
            _, created, ready, pdd_ready = self._counts(watcher)
            self.timeline.append((round(time.monotonic() - self.t0, 2), created, ready, pdd_ready))

    def wait_converged(self, watcher: Watcher, need_pdd: bool) -> dict[str, Any]:
        deadline = self.t0 + self.cfg.converge_timeout
        next_log = time.monotonic() + 15
        while True:
            now = time.monotonic()
            times, created, ready, pdd_ready = self._counts(watcher)
            done = ready == len(self.names) and (not need_pdd or pdd_ready == len(self.names))
            if done or now > deadline:
                self._sampling.set()
                self.timeline.append((round(now - self.t0, 2), created, ready, pdd_ready))
                break
            if now > next_log:
                self.log(
                    f"    {self.arm} n={self.cfg.n} t={now - self.t0:.0f}s: children "
                    f"{created}, workloads ready {ready}"
                    + (f", PDDeployments Ready {pdd_ready}" if need_pdd else "")
                    + f" / {len(self.names)}"
                )
                next_log = now + 15
            time.sleep(0.5)
        return times

    def latencies(self, times: dict[str, dict[str, float | None]]) -> dict[str, Any]:
        """`submit_to_*`: from the burst's submission (t0), the client's own queue included,
        the same clock for both arms. `apply_to_*`: from when a client thread picked the
        deployment up (the operator's queue is in it, the direct client's is not)."""
        out: dict[str, Any] = {}
        for key in ("children", "ready", "pdd_ready"):
            vals = [
                t[key] - self.t_apply[n]  # type: ignore[operator]
                for n, t in times.items()
                if t[key] is not None and n in self.t_apply
            ]
            out[f"apply_to_{key}_s"] = analysis.dist(vals)
            done = [t[key] - self.t0 for t in times.values() if t[key] is not None]
            out[f"submit_to_{key}_s"] = analysis.dist(done)  # type: ignore[arg-type]
        ends = [t["ready"] for t in times.values() if t["ready"]]
        pdd_ends = [t["pdd_ready"] for t in times.values() if t["pdd_ready"]]
        n = len(self.names)
        out["converged"] = len(ends) == n
        out["converge_s"] = round(max(ends) - self.t0, 2) if len(ends) == n else None
        out["converge_pdd_ready_s"] = (
            round(max(pdd_ends) - self.t0, 2) if len(pdd_ends) == n else None
        )
        out["ready_count"] = len(ends)
        out["pdd_ready_count"] = len(pdd_ends)
        out["children_count"] = sum(1 for t in times.values() if t["children"])
        out["apply_stream_s"] = round(max(self.t_applied.values()) - self.t0, 2)
        out["apply_errors"] = self.apply_errors[:20]
        out["apply_error_count"] = len(self.apply_errors)
        return out

    def pair_quality(self, cluster: BenchCluster) -> dict[str, Any]:
        pods = _list(cluster, f"/api/v1/namespaces/{NAMESPACE}/pods")
        pairs = analysis.deployment_pairs(pods, node_domains(cluster.nodes))
        return analysis.pair_summary(pairs)

    def workload_summary(self) -> dict[str, Any]:
        shapes = list(self.shapes.values())
        return {
            "deployments": len(shapes),
            "pods": sum(s.pods for s in shapes),
            "gpus": sum(s.gpus for s in shapes),
            "by_shape": count_by([{"s": s.name} for s in shapes], "s"),
        }


def _delta(
    after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]
) -> dict[str, int]:
    by_verb: dict[str, int] = {}
    for key, value in after.items():
        d = value - before.get(key, 0.0)
        if d:
            by_verb[key[0]] = by_verb.get(key[0], 0) + int(d)
    return dict(sorted(by_verb.items()))


def _operator_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def _metric_sum(text: str, name: str) -> float:
    return sum(v for _, v in parse_samples(text, name))


def _reconcile_histogram(text: str) -> dict[str, Any]:
    buckets = [
        (float(labels["le"]), v)
        for labels, v in parse_samples(text, "pdd_operator_reconcile_duration_seconds_bucket")
    ]
    count = _metric_sum(text, "pdd_operator_reconcile_duration_seconds_count")
    total = _metric_sum(text, "pdd_operator_reconcile_duration_seconds_sum")
    return {
        "count": int(count),
        "mean_ms": round(total / count * 1000, 2) if count else None,
        "p50_ms": _ms(analysis.histogram_quantile(buckets, 0.5)),
        "p99_ms": _ms(analysis.histogram_quantile(buckets, 0.99)),
        "seconds_total": round(total, 2),
    }


def _ms(v: float | None) -> float | None:
    return round(v * 1000, 2) if v is not None else None


def _writes_by_kind(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for labels, v in parse_samples(text, "pdd_operator_api_writes_total"):
        out[f"{labels.get('verb')}/{labels.get('kind')}"] = int(v)
    return dict(sorted(out.items()))


def _pass_requests(text: str) -> dict[str, int]:
    """Passes asked for by cause over the operator's life (it starts with the run)."""
    found = parse_samples(text, "pdd_operator_pass_requests_total")
    return dict(sorted((labels.get("cause", ""), int(v)) for labels, v in found))


def _by_verb_resource(records: list[dict[str, Any]]) -> dict[str, int]:
    pairs = Counter(f"{r['verb']} {r['resource']}" for r in records)
    return dict(sorted(pairs.items(), key=lambda kv: -kv[1]))


def _per(counts: dict[str, int], n: float) -> dict[str, float]:
    return {k: round(v / n, 2) for k, v in counts.items()} if n else {}


def _window(records: list[dict[str, Any]], t_from: float, t_to: float) -> list[dict[str, Any]]:
    return [r for r in records if t_from <= r["t"] < t_to]


# ---------------------------------------------------------------------------- operator arm


# After the measurements, on the converged cluster (pddbench.aftercare): given the cluster and
# the operator, returns its results and the operator process alive then.
AfterConverged = Callable[[BenchCluster, OperatorProcess], tuple[dict[str, Any], OperatorProcess]]


def run_operator_arm(
    cfg: ScaleConfig,
    work_dir: Path,
    raw_dir: Path,
    log: Any,
    after: AfterConverged | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns (results, what the direct arm needs: server bodies, placements, hashes)."""
    arm = Arm(cfg, "operator", work_dir, raw_dir, log)
    raw_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"arm": "operator", "config": _cfg_dict(cfg)}
    with _cluster(cfg, work_dir, log) as cl:
        assert cl.cp is not None and cl.kube is not None
        out["cluster_start_s"] = round(cl.start_seconds, 1)
        cl.create_namespace(NAMESPACE)
        install_operator(cl)
        _wait_crd_served(cl)
        op_log = raw_dir / "operator.log"
        op_log.unlink(missing_ok=True)
        t_op = time.monotonic()
        op = OperatorProcess(
            cl.kubeconfig_for(OPERATOR_USER),
            op_log,
            resync_seconds=cfg.resync_seconds,
            extra_env=OPERATOR_ENV,
        ).start()
        assert op.proc is not None
        out["operator_start_s"] = round(time.monotonic() - t_op, 2)
        cl.sampler.add("operator", op.proc.pid)
        watcher = Watcher(str(cl.cp.kubeconfig), NAMESPACE, pdds=True).start()
        profiler = None
        server_profiler: ApiServerProfiler | None = None
        t_after: float | None = None
        try:
            # The operator handles nothing until kopf has indexed every Node and Pod; a canary
            # deployment (not measured) shows when that is done.
            out["operator_ready_s"] = _warm_up(cl, t_op, cfg.converge_timeout)
            log(f"    operator ready (canary reconciled) {out['operator_ready_s']}s after start")
            time.sleep(2)
            m_before = _operator_metrics(op.metrics_port)
            req_before = cl.request_totals()
            cpu_before = _proc_cpu(cl, "operator")
            if cfg.profile:
                profiler = _start_profiler(op.proc.pid, raw_dir / "operator-profile.txt", cfg, log)
            server_profiler = _start_apiserver_profiler(cl, raw_dir, "operator", cfg)
            apply_kube = KubeApi(
                kconfig.new_client_from_config(config_file=str(cl.kubeconfig_for(APPLY_USER))),
                "bench-user",
            )
            bodies = {n: pdd_body(n, NAMESPACE, arm.shapes[n], cfg.placement) for n in arm.names}
            arm.apply_stream(lambda name: apply_kube.apply(bodies[name]), watcher)
            times = arm.wait_converged(watcher, need_pdd=True)
            t_conv_wall = time.time()
            t_conv = time.monotonic()
            if profiler is not None:
                _stop_profiler(profiler)
                profiler = None
            _stop_apiserver_profiler(server_profiler)
            m_conv = _operator_metrics(op.metrics_port)
            req_conv = cl.request_totals()
            cpu_conv = _proc_cpu(cl, "operator")
            out.update(arm.latencies(times))
            out["workload"] = arm.workload_summary()
            out["sts_template_changes"] = watcher.sts_template_changes
            out["sts_domain_changes"] = watcher.sts_domain_changes
            out["sts_partition_changes"] = watcher.sts_partition_changes
            out["watch_errors"] = watcher.errors

            # -------- steady state: no-op resyncs must write nothing
            time.sleep(cfg.settle_seconds)
            w_before = {r: cl.cp.mutating_requests({r}) for r in OPERATOR_RESOURCES}
            probes_before = _best_effort("probe snapshot", lambda: _probe_requests(cl), {}, log)
            watcher.record_status_churn = True
            rec_before = _metric_sum(
                _operator_metrics(op.metrics_port), "pdd_operator_reconciles_total"
            )
            req_w0 = cl.request_totals()
            tw0 = time.time()
            cpu_w0 = _proc_cpu(cl, "operator")
            time.sleep(cfg.steady_seconds)
            tw1 = time.time()
            cpu_w1 = _proc_cpu(cl, "operator")
            w_after = {r: cl.cp.mutating_requests({r}) for r in OPERATOR_RESOURCES}
            probes_after = _best_effort("probe snapshot", lambda: _probe_requests(cl), {}, log)
            watcher.record_status_churn = False
            m_end = _operator_metrics(op.metrics_port)
            rec_after = _metric_sum(m_end, "pdd_operator_reconciles_total")
            req_w1 = cl.request_totals()

            audit = read_audit(cl.audit_log, [OPERATOR_USER, APPLY_USER])
            op_audit = [r for r in audit if r["user"] == OPERATOR_USER]
            rec_run = _metric_sum(m_conv, "pdd_operator_reconciles_total") - _metric_sum(
                m_before, "pdd_operator_reconciles_total"
            )
            run_recs = _window(op_audit, arm.t0_wall, t_conv_wall)
            by_verb = count_by(run_recs, "verb")
            steady = _window(op_audit, tw0, tw1)
            steady_reads = [r for r in steady if r["verb"] in READ_VERBS]
            steady_writes = [r for r in steady if r["verb"] in WRITE_VERBS]
            minutes = (tw1 - tw0) / 60
            out["reconciles"] = {
                "during_run": int(rec_run),
                "per_deployment": round(rec_run / cfg.n, 2),
                "duration": _reconcile_histogram(m_conv),
                "asked_for_by_cause_per_deployment": _per(_pass_requests(m_conv), cfg.n),
            }
            out["operator_requests"] = {
                "source": "apiserver audit log, user pdd-operator",
                "during_run_by_verb": by_verb,
                "per_reconcile_by_verb": _per(by_verb, rec_run),
                "per_deployment_by_verb": _per(by_verb, cfg.n),
                "during_run_by_resource": count_by(run_recs, "resource"),
                "per_deployment_by_verb_resource": _per(_by_verb_resource(run_recs), cfg.n),
                "whole_life_by_verb": count_by(op_audit, "verb"),
                "writes_metric": _writes_by_kind(m_conv),
            }
            apply_recs = [r for r in audit if r["user"] == APPLY_USER]
            out["client_requests_by_verb"] = count_by(apply_recs, "verb")
            all_run = _delta(req_conv, req_before)
            out["apiserver_requests_all_clients"] = {
                "during_run_by_verb": all_run,
                "per_reconcile_by_verb": _per(all_run, rec_run),
                "per_deployment_by_verb": _per(all_run, cfg.n),
            }
            writes_delta = {r: w_after[r] - w_before[r] for r in OPERATOR_RESOURCES}
            out["noop_resync"] = {
                "window_s": round(tw1 - tw0, 1),
                "resync_seconds": cfg.resync_seconds,
                "reconciles": int(rec_after - rec_before),
                "resync_passes": round((rec_after - rec_before) / cfg.n, 2),
                "writes_all_clients_operator_resources": sum(writes_delta.values()),
                "writes_by_resource": {k: v for k, v in writes_delta.items() if v},
                "operator_writes_audit": len(steady_writes),
                "operator_writes_audit_by_resource": count_by(steady_writes, "resource"),
                "deployments_written": len(
                    {r["name"].rsplit("-prefill", 1)[0] for r in steady_writes if r["name"]}
                ),
                "probe_requests_renewed": sum(
                    1 for k, v in probes_after.items() if v and v != probes_before.get(k)
                ),
                "status_fields_changed": dict(
                    sorted(watcher.status_churn.items(), key=lambda kv: -kv[1])[:15]
                ),
                "operator_reads": len(steady_reads),
                "operator_reads_per_minute": round(len(steady_reads) / minutes, 1),
                "operator_reads_by_verb": count_by(steady_reads, "verb"),
                "operator_reads_by_resource": count_by(steady_reads, "resource"),
                "apiserver_reads_per_minute_all_clients": {
                    v: round(c / minutes, 1)
                    for v, c in _delta(req_w1, req_w0).items()
                    if v in ("GET", "LIST", "WATCH")
                },
                "operator_cpu_seconds": round(cpu_w1 - cpu_w0, 2),
            }
            out["operator_process"] = {
                "cpu_seconds_run": round(cpu_conv - cpu_before, 2),
                "cpu_seconds_total": round(cpu_w1, 2),
                "peak_rss_mib": round(cl.sampler.peak_rss.get("operator", 0.0), 1),
                "log_warnings": _count_warnings(op_log),
            }
            out["pair_quality"] = _best_effort(
                "pair quality", lambda: arm.pair_quality(cl), {}, log
            )
            handoff = _best_effort("handoff", lambda: _handoff(cl, watcher), {}, log)
            out["final_placements"] = _placement_spread(handoff, arm)
            out["t_conv_s"] = round(t_conv - arm.t0, 2)
            t_after = time.monotonic()
            if after is not None:
                out["aftercare"], op = after(cl, op)
        finally:
            if profiler is not None:
                _stop_profiler(profiler)
            _stop_apiserver_profiler(server_profiler)
            watcher.stop()
            op.kill()
        out["processes"] = cl.sampler.summary()
        out["nodesim"] = cl.sim_stats()
        out["series"] = _series(cl, arm, until=t_after)
    out["apiserver_profile"] = _apiserver_profile_summary(server_profiler, log)
    if cfg.profile and (raw_dir / "operator-profile.txt").exists():
        raw = (raw_dir / "operator-profile.txt").read_text()
        out["profile"] = {
            **analysis.summarize_profile(raw),
            "by_category": analysis.categorize_profile(raw),
        }
    return out, handoff


def _cluster(cfg: ScaleConfig, work_dir: Path, log: Any) -> BenchCluster:
    """The same cluster for either arm: the fleet, its activity, the controllers' QPS."""
    return BenchCluster(
        work_dir,
        cfg.fleet,
        controller_qps=cfg.controller_qps,
        activity=cfg.activity,
        apiserver_profiling=cfg.apiserver_profile,
        log=log,
    )


def _placement_spread(handoff: dict[str, Any], arm: Arm) -> dict[str, Any]:
    """How the planner spread the burst: deployments per chosen domain at the end, and the
    GPUs they need against the GPUs a domain has."""
    per: dict[str, list[str]] = {}
    for name, body in handoff.get("bodies", {}).items():
        ps = (body.get("status") or {}).get("placement") or {}
        if name in arm.shapes:
            per.setdefault(ps.get("domain") or "(none)", []).append(name)
    gpus = {d: sum(arm.shapes[n].gpus for n in names_) for d, names_ in per.items()}
    domain_gpus = arm.cfg.fleet.nodes_per_clique * 8
    return {
        "domains_used": len(per),
        "max_deployments_per_domain": max((len(v) for v in per.values()), default=0),
        "max_gpus_asked_of_one_domain": max(gpus.values(), default=0),
        "gpus_per_domain": domain_gpus,
        "domains_overcommitted": sum(
            1 for d, g in gpus.items() if d != "(none)" and g > domain_gpus
        ),
    }


def _warm_up(cl: BenchCluster, t_start: float, timeout: float) -> float | None:
    assert cl.kube is not None
    canary = Shape("canary", 1, 1, 1, 1, 0.0)
    cl.kube.request(
        "POST",
        f"/apis/pdd.dev/v1alpha1/namespaces/{NAMESPACE}/pddeployments",
        body=pdd_body("canary", NAMESPACE, canary, "none"),
    )
    deadline = time.monotonic() + timeout
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/canary-decode"
    while time.monotonic() < deadline:
        try:
            cl.kube.request("GET", path)
            return round(time.monotonic() - t_start, 2)
        except Exception:
            time.sleep(0.5)
    return None


def _wait_crd_served(cl: BenchCluster, timeout: float = 60.0) -> None:
    """Until the new CRD's storage answers a list: for a few seconds after its creation the
    API server refuses with 429 "storage is (re)initializing", which would count against the
    operator's start-up (a real operator starts against CRDs installed long before)."""
    assert cl.kube is not None
    deadline = time.monotonic() + timeout
    for plural in ("pddrolescalers", "pddeployments"):
        while True:
            try:
                cl.kube.request("GET", f"/apis/pdd.dev/v1alpha1/namespaces/{NAMESPACE}/{plural}")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _list(cl: BenchCluster, path: str) -> list[dict[str, Any]]:
    """One unpaged LIST (served by etcd, so a lagging watch cache cannot answer 504 "too large
    resource version" as it does for paged lists), with a long timeout and retries."""
    assert cl.kube is not None
    for attempt in range(4):
        try:
            return list(cl.kube.request("GET", path, timeout=180).get("items") or [])
        except Exception:
            if attempt == 3:
                raise
            time.sleep(5)
    return []


def _best_effort(what: str, fn: Any, default: Any, log: Any) -> Any:
    """Diagnostics after the measurement proper must not lose the run when the apiserver is
    too busy to answer them."""
    try:
        return fn()
    except Exception as err:
        log(f"    {what} failed ({type(err).__name__}: {str(err)[:200]}); recorded as missing")
        return default


def _probe_requests(cl: BenchCluster) -> dict[str, str]:
    """status.transfer.requestedAt of every PDDeployment: a no-op window must not renew it
    (the verification interval is an hour)."""
    items = _list(cl, f"/apis/pdd.dev/v1alpha1/namespaces/{NAMESPACE}/pddeployments")
    return {
        i["metadata"]["name"]: str(
            ((i.get("status") or {}).get("transfer") or {}).get("requestedAt", "")
        )
        for i in items
    }


def _handoff(cl: BenchCluster, watcher: Watcher) -> dict[str, Any]:
    items = _list(cl, f"/apis/pdd.dev/v1alpha1/namespaces/{NAMESPACE}/pddeployments")
    with watcher.lock:
        hashes = {name: st.extra.get("hash", "") for name, st in watcher.sts.items()}
    return {"bodies": {i["metadata"]["name"]: i for i in items}, "hashes": hashes}


# ---------------------------------------------------------------------------- direct arm


def run_direct_arm(
    cfg: ScaleConfig, work_dir: Path, raw_dir: Path, handoff: dict[str, Any], log: Any
) -> dict[str, Any]:
    """The same workloads as the rendered children, applied directly, no operator running.
    Each is rendered with the placement the operator chose for it (its status), so the
    objects are the operator's (same applied-hash) minus the ownerReferences."""
    arm = Arm(cfg, "direct", work_dir, raw_dir, log)
    out: dict[str, Any] = {"arm": "direct", "config": _cfg_dict(cfg)}
    plans: dict[str, list[dict[str, Any]]] = {}
    placed = 0
    for name in arm.names:
        body = pdd_body(name, NAMESPACE, arm.shapes[name], cfg.placement)
        server = handoff.get("bodies", {}).get(name)
        ps = ((server or {}).get("status") or {}).get("placement") or {}
        placement = Placement(
            mode=cfg.placement, level=ps.get("level", ""), domain=ps.get("domain", "")
        )
        placed += bool(placement.domain)
        plans[name] = render_plain(with_defaults(body, server), placement)
    hashes = handoff.get("hashes", {})
    same = differ = 0
    for objs in plans.values():
        for obj in objs:
            if obj["kind"] != "StatefulSet" or obj["metadata"]["name"] not in hashes:
                continue
            h = obj["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH]
            same += h == hashes[obj["metadata"]["name"]]
            differ += h != hashes[obj["metadata"]["name"]]
    out["rendered"] = {
        "objects_per_deployment": round(sum(len(v) for v in plans.values()) / cfg.n, 2),
        "with_operator_placement": placed,
        "statefulsets_identical_to_operator": same,
        "statefulsets_differing": differ,
    }
    with _cluster(cfg, work_dir, log) as cl:
        assert cl.cp is not None
        out["cluster_start_s"] = round(cl.start_seconds, 1)
        cl.create_namespace(NAMESPACE)
        applier = DirectApplier(cl, plans, arm.names, cfg.direct_apply_workers, raw_dir)
        watcher = Watcher(str(cl.cp.kubeconfig), NAMESPACE, pdds=False).start()
        profiler = None
        server_profiler: ApiServerProfiler | None = None
        try:
            cl.sampler.add("direct-applier", applier.pid)
            time.sleep(1)
            req_before = cl.request_totals()
            cpu_before = _proc_cpu(cl, "direct-applier")
            if cfg.profile:
                profiler = _start_profiler(applier.pid, raw_dir / "direct-profile.txt", cfg, log)
            server_profiler = _start_apiserver_profiler(cl, raw_dir, "direct", cfg)
            arm.start_clock(watcher)
            applier.go()
            applied = applier.wait_applied(cfg.converge_timeout)
            arm.t_apply.update(applied["t_apply"])
            arm.t_applied.update(applied["t_applied"])
            arm.apply_errors.extend(applied["errors"])
            times = arm.wait_converged(watcher, need_pdd=False)
            if profiler is not None:
                _stop_profiler(profiler)
                profiler = None
            _stop_apiserver_profiler(server_profiler)
            req_conv = cl.request_totals()
            cpu_conv = _proc_cpu(cl, "direct-applier")
            out.update(arm.latencies(times))
            out["workload"] = arm.workload_summary()
            out["sts_template_changes"] = watcher.sts_template_changes
            out["watch_errors"] = watcher.errors
            out["applier_process"] = {
                "cpu_seconds_run": round(cpu_conv - cpu_before, 2),
                "peak_rss_mib": round(cl.sampler.peak_rss.get("direct-applier", 0.0), 1),
            }
            audit = read_audit(cl.audit_log, [APPLY_USER])
            out["client_requests_by_verb"] = count_by(audit, "verb")
            all_run = _delta(req_conv, req_before)
            out["apiserver_requests_all_clients"] = {
                "during_run_by_verb": all_run,
                "per_deployment_by_verb": _per(all_run, cfg.n),
            }
            out["pair_quality"] = _best_effort(
                "pair quality", lambda: arm.pair_quality(cl), {}, log
            )
        finally:
            if profiler is not None:
                _stop_profiler(profiler)
            _stop_apiserver_profiler(server_profiler)
            applier.close()
            watcher.stop()
        out["processes"] = cl.sampler.summary()
        out["nodesim"] = cl.sim_stats()
        out["series"] = _series(cl, arm)
    out["apiserver_profile"] = _apiserver_profile_summary(server_profiler, log)
    if cfg.profile and (raw_dir / "direct-profile.txt").exists():
        raw = (raw_dir / "direct-profile.txt").read_text()
        out["profile"] = {
            **analysis.summarize_profile(raw),
            "by_category": analysis.categorize_profile(raw),
        }
    return out


class DirectApplier:
    """`pddbench.direct_apply` in a process of its own, started with the plans loaded and
    its client built, waiting for `go`."""

    def __init__(
        self,
        cl: BenchCluster,
        plans: dict[str, list[dict[str, Any]]],
        names_in_order: list[str],
        workers: int,
        raw_dir: Path,
    ) -> None:
        raw_dir.mkdir(parents=True, exist_ok=True)
        plans_file = raw_dir / "direct-plans.json"
        plans_file.write_text(json.dumps({n: plans[n] for n in names_in_order}))
        self.result_file = raw_dir / "direct-result.json"
        self.result_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "pddbench.direct_apply",
                "--kubeconfig", str(cl.kubeconfig_for(APPLY_USER)),
                "--plans", str(plans_file),
                "--workers", str(workers),
                "--result", str(self.result_file),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        self._expect("ready", 120)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait_applied(self, timeout: float) -> dict[str, Any]:
        self._expect("done", timeout)
        result: dict[str, Any] = json.loads(self.result_file.read_text())
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _expect(self, word: str, timeout: float) -> None:
        assert self.proc.stdout is not None
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline().strip()
        finally:
            timer.cancel()
        if line != word:
            raise RuntimeError(f"direct applier: expected {word!r}, got {line!r}")


# ---------------------------------------------------------------------------- helpers


def _cfg_dict(cfg: ScaleConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["activity"] = cfg.activity.as_dict()
    d["fleet"]["nodes"] = cfg.fleet.nodes
    d["fleet"]["gpus"] = cfg.fleet.nodes * 8
    return d


def _proc_cpu(cl: BenchCluster, name: str) -> float:
    cl.sampler.sample()
    return cl.sampler.last_cpu(name)


def _series(cl: BenchCluster, arm: Arm, until: float | None = None) -> dict[str, Any]:
    """Time series relative to the first apply, for the plots; up to `until` (monotonic),
    where the arm's own measurements ended and the aftercare began."""
    off = arm.t0 - cl.sampler.t0
    end = (until - arm.t0) if until is not None else float("inf")
    proc = {}
    for name in (*MACHINE_PROCESSES, "bench"):
        pts = cl.sampler.series.get(name) or []
        proc[name] = [
            (round(t - off, 1), round(c, 2), round(r, 1)) for t, c, r in pts if t - off <= end
        ]
    return {
        "timeline": arm.timeline[:: max(1, len(arm.timeline) // 600)],
        "proc": proc,
        "loadavg": [(round(t - off, 1), v) for t, v in cl.sampler.loadavg if t - off <= end],
        "machine_busy": [p for p in _busy(cl.sampler.machine, off) if p[0] <= end],
    }


def _busy(points: list[tuple[float, float, float]], off: float) -> list[tuple[float, float]]:
    out = []
    for (_t0, b0, a0), (t1, b1, a1) in itertools.pairwise(points):
        if a1 > a0:
            out.append((round(t1 - off, 1), round((b1 - b0) / (a1 - a0), 3)))
    return out


def _count_warnings(path: Path) -> dict[str, int]:
    counts = {"WARNING": 0, "ERROR": 0}
    with contextlib.suppress(OSError), path.open(errors="replace") as f:
        for line in f:
            for level in counts:
                if f" {level} " in line:
                    counts[level] += 1
    return counts


def _py_spy() -> str | None:
    """py-spy beside the interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _start_profiler(
    pid: int, out: Path, cfg: ScaleConfig, log: Any
) -> subprocess.Popen[bytes] | None:
    """Samples of the thread holding the GIL only (`--gil`): where the process spends CPU, not
    its threads waiting for the GIL or for the network."""
    spy = _py_spy()
    if spy is None:
        log("    py-spy not found (venv or PATH): this arm is not profiled")
        return None
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", str(cfg.profile_rate), "--gil",
         "--format", "raw", "--nonblocking", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def _start_apiserver_profiler(
    cl: BenchCluster, raw_dir: Path, arm: str, cfg: ScaleConfig
) -> ApiServerProfiler | None:
    if not cfg.apiserver_profile:
        return None
    assert cl.kube is not None
    return ApiServerProfiler(cl.kube, raw_dir / "apiserver-profile", arm).start()


def _stop_apiserver_profiler(profiler: ApiServerProfiler | None) -> None:
    """Stop at convergence; again (a no-op) on the way out should the arm have failed."""
    if profiler is not None:
        profiler.stop()


def _apiserver_profile_summary(profiler: ApiServerProfiler | None, log: Any) -> dict[str, Any]:
    """Summarized once the cluster is gone, so `go tool pprof` takes no CPU from the run."""
    if profiler is None or not (profiler.files or profiler.errors):
        return {}
    files, errors = profiler.files, profiler.errors
    summary = _best_effort("API server profile", lambda: apiserver_summary(files), {}, log)
    return {**summary, "window_errors": errors[:5]} if errors else summary


def _stop_profiler(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = ["ScaleConfig", "run_direct_arm", "run_operator_arm"]


def startup_probe(fleet: FleetSpec, controller_qps: int, work_dir: Path, raw_dir: Path,
                  log: Any, wait_s: float = 120.0,
                  activity: FleetActivity | None = None) -> dict[str, Any]:  # fmt: skip
    """The operator as shipped on the fleet: does it reconcile one PDDeployment, and how soon?
    (With a kopf worker limit below the number of Nodes it never did: the start-up indexing
    deadlock described at OPERATOR_ENV.)"""
    raw_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"nodes": fleet.nodes, "wait_s": wait_s}
    with BenchCluster(
        work_dir, fleet, controller_qps=controller_qps, activity=activity, log=log
    ) as cl:
        assert cl.cp is not None and cl.kube is not None
        cl.create_namespace(NAMESPACE)
        install_operator(cl)
        _wait_crd_served(cl)
        t_process = time.monotonic()
        op = OperatorProcess(
            cl.kubeconfig_for(OPERATOR_USER),
            raw_dir / "startup-probe-operator.log",
            300.0,
            extra_env=OPERATOR_ENV,
        ).start()
        try:
            body = pdd_body("probe", NAMESPACE, SCALE_MIX[0], "preferred")
            cl.kube.request(
                "POST",
                f"/apis/pdd.dev/v1alpha1/namespaces/{NAMESPACE}/pddeployments",
                body=body,
            )
            t0 = time.monotonic()
            created = None
            while time.monotonic() - t0 < wait_s:
                items, _ = cl.kube.list_all(
                    f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets", {}
                )
                if len(items) >= 2:
                    created = round(time.monotonic() - t0, 2)
                    break
                time.sleep(0.5)
            out["children_created_s"] = created
            # From the operator's process start (its imports and its lists included).
            out["from_process_start_s"] = (
                round(created + t0 - t_process, 2) if created is not None else None
            )
            out["reconciles"] = int(
                _metric_sum(_operator_metrics(op.metrics_port), "pdd_operator_reconciles_total")
            )
            out["deadlocked"] = created is None and out["reconciles"] == 0
        finally:
            op.kill()
    return out
