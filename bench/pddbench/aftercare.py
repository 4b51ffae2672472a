"""After the largest size converged, on its operator arm's cluster (issue 16, items 4-5): the
operator restarted, the operator idle, and a soak of bounded create/delete churn.

Each step is named in `--after-largest` and runs in that order; a step that fails records
its error and the next one runs. The restart replaces the operator process, so the steps
hand the live one back to the arm, which stops it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddbench.analysis import rss_drift_pct
from pddbench.cluster import OPERATOR_USER, BenchCluster, count_by, read_audit
from pddbench.scale import (
    NAMESPACE,
    OPERATOR_ENV,
    READ_VERBS,
    WRITE_VERBS,
    OperatorProcess,
    ScaleConfig,
    _list,
    _metric_sum,
    _operator_metrics,
    _proc_cpu,
    _window,
)
from pddbench.workload import SCALE_MIX, pdd_body, pick_shapes

STEPS = ("restart", "idle", "soak")
# The restarted operator resyncs as the chart's default does (resyncSeconds), not as the
# arms' operator (every few seconds, to test no-op passes): an idle window after the restart
# then measures the operator as shipped, resync rounds included.
SHIPPED_RESYNC_S = 300.0
PDDS = f"/apis/pdd.dev/v1alpha1/namespaces/{NAMESPACE}/pddeployments"
RECONCILES = "pdd_operator_reconciles_total"
# Gauges of the operator process: deployments that had a pass in it, and deployments its
# reconciler holds state for.
RECONCILED = "pdd_operator_deployments_reconciled"
TRACKED = "pdd_operator_deployments_tracked"


@dataclass(frozen=True)
class AftercareConfig:
    steps: tuple[str, ...]
    idle_s: float
    soak_s: float
    soak_extra: int  # churn deployments alive at most (K)
    soak_lifetime_s: float  # each lives about this long: one is created every lifetime/K s
    poll_s: float = 0.2  # how often the restart polls the new process's metrics
    restart_resync_s: float = SHIPPED_RESYNC_S


@dataclass
class Scene:
    """What the steps share; `op` and `proc_name` follow the restart."""

    care: AftercareConfig
    cfg: ScaleConfig
    cl: BenchCluster
    op: OperatorProcess
    raw_dir: Path
    log: Any
    proc_name: str = "operator"  # the sampler's name of the live operator process

    def metrics(self) -> str:
        return _operator_metrics(self.op.metrics_port)

    def operator_requests(self, t_from: float, t_to: float) -> dict[str, Any]:
        """The operator's requests between two wall-clock times, from the audit log."""
        recs = _window(read_audit(self.cl.audit_log, [OPERATOR_USER]), t_from, t_to)
        writes = [r for r in recs if r["verb"] in WRITE_VERBS]
        return {
            "writes": len(writes),
            "writes_by_resource": count_by(writes, "resource"),
            # Which objects, so that a write where none was expected can be explained.
            "write_records": [
                f"{r['verb']} {r['resource']} {r['name']} -> {r['code']}" for r in writes[:40]
            ],
            "reads": sum(1 for r in recs if r["verb"] in READ_VERBS),
        }


def run_aftercare(
    care: AftercareConfig,
    cfg: ScaleConfig,
    cl: BenchCluster,
    op: OperatorProcess,
    raw_dir: Path,
    log: Any,
) -> tuple[dict[str, Any], OperatorProcess]:
    """The steps' results, and the operator process alive now (for the arm to stop)."""
    scene = Scene(care, cfg, cl, op, raw_dir, log)
    out: dict[str, Any] = {"n": cfg.n, "steps": list(care.steps)}
    try:
        for step in care.steps:
            log(f"  after n={cfg.n}: {step}")
            try:
                out[step] = STEP_FUNCTIONS[step](scene)
            except Exception as err:
                out[step] = {"error": f"{type(err).__name__}: {err}"[:400]}
            log(f"    {step}: { {k: v for k, v in out[step].items() if k != 'rss_mib'} }")
    except BaseException:
        scene.op.kill()  # interrupted: stop the process this module may have started
        raise
    return out, scene.op


def idle(scene: Scene) -> dict[str, Any]:
    """The operator's CPU and requests over a window in which nothing changes."""
    rec0 = _metric_sum(scene.metrics(), RECONCILES)
    cpu0, t0 = _proc_cpu(scene.cl, scene.proc_name), time.time()
    time.sleep(scene.care.idle_s)
    cpu1, t1 = _proc_cpu(scene.cl, scene.proc_name), time.time()
    rec1 = _metric_sum(scene.metrics(), RECONCILES)
    time.sleep(1)  # the audit log is written after the response
    return {
        "window_s": round(t1 - t0, 1),
        "cpu_seconds": round(cpu1 - cpu0, 2),
        "cpu_pct": round(100.0 * (cpu1 - cpu0) / (t1 - t0), 2),
        "reconciles": int(rec1 - rec0),
        "resync_seconds": scene.op.resync_seconds,
        **scene.operator_requests(t0, t1),
    }


def restart(scene: Scene) -> dict[str, Any]:
    """SIGTERM the operator, start a fresh one on the same cluster; seconds from its start to
    its first pass (pdd_operator_reconciles_total > 0) and until every PDDeployment had a pass
    in it (pdd_operator_deployments_reconciled reaches their number), both polled from its
    metrics every poll_s; its writes until then and a settle period after."""
    cfg, care, cl = scene.cfg, scene.care, scene.cl
    expected = len(_list(cl, PDDS))  # the N deployments and the arm's canary
    t_stop = time.monotonic()
    scene.op.kill()
    stop_s = time.monotonic() - t_stop
    scene.op = OperatorProcess(
        cl.kubeconfig_for(OPERATOR_USER),
        scene.raw_dir / "operator-restart.log",
        resync_seconds=care.restart_resync_s,
        extra_env=OPERATOR_ENV,
    )
    t0, t0_wall = time.monotonic(), time.time()
    scene.op.start()
    assert scene.op.proc is not None
    scene.proc_name = "operator-restarted"
    cl.sampler.add(scene.proc_name, scene.op.proc.pid)
    alive_s = time.monotonic() - t0
    first = verified = None
    reconciled = 0.0
    deadline = t0 + max(120.0, cfg.converge_timeout)
    while verified is None and time.monotonic() < deadline:
        try:
            text = scene.metrics()
        except OSError:
            text = ""
        now = round(time.monotonic() - t0, 2)
        if first is None and _metric_sum(text, RECONCILES) > 0:
            first = now
        reconciled = _metric_sum(text, RECONCILED)
        if reconciled >= expected:
            verified = now
        time.sleep(care.poll_s)
    cpu = _proc_cpu(cl, scene.proc_name)
    time.sleep(cfg.settle_seconds)  # a write the passes cause lands in the window too
    t1_wall = time.time()
    rec = _metric_sum(scene.metrics(), RECONCILES)
    # The fresh process lists everything at once: its memory then, and once settled.
    rss = _rss_samples(scene, t0, time.monotonic())
    time.sleep(1)
    return {
        "deployments": expected,
        "resync_seconds": care.restart_resync_s,
        "stop_s": round(stop_s, 2),
        "alive_s": round(alive_s, 2),
        "first_reconcile_s": first,
        "all_verified_s": verified,
        "verified": int(reconciled),
        "cpu_seconds_to_verified": round(cpu, 2),
        "rss_mib_peak": max((mib for _, mib in rss), default=None),
        "rss_mib_settled": rss[-1][1] if rss else None,
        "reconciles": int(rec),
        "window_s": round(t1_wall - t0_wall, 1),
        **scene.operator_requests(t0_wall, t1_wall),
    }


def soak(scene: Scene) -> dict[str, Any]:
    """Bounded churn: a round every lifetime/K seconds deletes the oldest churn deployment
    once K are alive and creates one, so each lives about its lifetime; the operator's RSS
    sampled throughout. Then every churn deployment deleted, and the operator's
    per-deployment state (the tracked gauge) and its per-deployment metric series must come
    back to where they were before."""
    care, kube = scene.care, scene.cl.kube
    assert kube is not None
    before = scene.metrics()
    tracked0, series0 = _metric_sum(before, TRACKED), _deployment_series(before)
    rec0 = _metric_sum(before, RECONCILES)
    shapes = pick_shapes(care.soak_extra, SCALE_MIX, scene.cfg.seed + 1)
    alive: collections.deque[str] = collections.deque()
    created = errors = 0
    tick = max(0.2, care.soak_lifetime_s / max(1, care.soak_extra))
    t0, t0_wall = time.monotonic(), time.time()
    while time.monotonic() - t0 < care.soak_s:
        if len(alive) >= care.soak_extra:
            errors += not _try(kube.request, "DELETE", f"{PDDS}/{alive.popleft()}")
        name = f"churn-{created:05d}"
        body = pdd_body(name, NAMESPACE, shapes[created % len(shapes)], scene.cfg.placement)
        errors += not _try(kube.request, "POST", PDDS, body=body)
        alive.append(name)
        created += 1
        # Rounds on a schedule (t0 + k * tick): slow API answers must not thin the churn out.
        time.sleep(max(0.0, t0 + created * tick - time.monotonic()))
    t_end, t_end_wall = time.monotonic(), time.time()
    rss = _rss_samples(scene, t0, t_end)
    tracked_churning = _metric_sum(scene.metrics(), TRACKED)  # the gauge does move
    for name in alive:
        errors += not _try(kube.request, "DELETE", f"{PDDS}/{name}")
    back_s, after = _wait_tracked(scene, tracked0, timeout=max(60.0, care.soak_lifetime_s * 2))
    warmup = max(care.soak_lifetime_s, care.soak_s / 10)
    return {
        "duration_s": round(t_end - t0, 1),
        "extra_at_most": care.soak_extra,
        "lifetime_s": care.soak_lifetime_s,
        "created": created,
        "request_errors": errors,
        "reconciles": int(_metric_sum(after, RECONCILES) - rec0),
        "warmup_s": warmup,
        "rss_drift_pct": rss_drift_pct(rss, warmup),
        "rss_mib_first": rss[0][1] if rss else None,
        "rss_mib_last": rss[-1][1] if rss else None,
        # Per-deployment state: back to the level before the churn, or how many stayed.
        "tracked_before": int(tracked0),
        "tracked_churning": int(tracked_churning),
        "tracked_after": int(_metric_sum(after, TRACKED)),
        "tracked_back_s": back_s,
        "deployment_series_before": series0,
        "deployment_series_after": _deployment_series(after),
        "rss_mib": rss[:: max(1, len(rss) // 120)],
        **scene.operator_requests(t0_wall, t_end_wall),
    }


STEP_FUNCTIONS: dict[str, Callable[[Scene], dict[str, Any]]] = {
    "idle": idle,
    "restart": restart,
    "soak": soak,
}


def _try(request: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """One churn request; the apiserver being busy must not end the soak."""
    try:
        request(*args, **kwargs)
        return True
    except Exception:
        return False


def _rss_samples(scene: Scene, t_from: float, t_to: float) -> list[tuple[float, float]]:
    """(seconds since t_from, RSS MiB) of the live operator, from the arm's sampler."""
    off = scene.cl.sampler.t0
    pts = scene.cl.sampler.series.get(scene.proc_name) or []
    return [
        (round(t + off - t_from, 1), round(rss, 1))
        for t, _, rss in pts
        if t_from <= t + off <= t_to
    ]


def _wait_tracked(scene: Scene, level: float, timeout: float) -> tuple[float | None, str]:
    """Seconds until the tracked gauge is back at `level` (None: not within `timeout`), and
    the metrics text last read."""
    t0 = time.monotonic()
    while True:
        text = scene.metrics()
        if _metric_sum(text, TRACKED) <= level:
            return round(time.monotonic() - t0, 1), text
        if time.monotonic() - t0 > timeout:
            return None, text
        time.sleep(1)


def _deployment_series(metrics_text: str) -> int:
    """The operator's samples labelled by deployment (its KV-transfer gauges): one left
    behind by a deleted deployment would add to it. (The bench's simulated pods answer no
    transfer probe, so here it stays 0 unless a series appears that should not.)"""
    lines = metrics_text.splitlines()
    return sum(1 for line in lines if not line.startswith("#") and 'deployment="' in line)


__all__ = ["STEPS", "AftercareConfig", "run_aftercare"]
