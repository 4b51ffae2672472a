"""`summary.json`: the headline numbers of a bench run, per deployment count, from its raw
results. Pure: a dict in, a dict out.

Each deployment count runs interleaved pairs of arms (operator, then direct on the
operator's placements), so every number here is over pairs: the median, and for the
converge ratio its spread. A key the run did not measure is null, never a guess.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

# Measured after the largest size converged (pddbench.aftercare), null when its step did
# not run: summary key -> (step, key of the step's results).
AFTERCARE_KEYS = {
    "restart_first_reconcile_s": ("restart", "first_reconcile_s"),
    "restart_all_verified_s": ("restart", "all_verified_s"),
    "restart_writes": ("restart", "writes"),
    "restart_rss_mib_peak": ("restart", "rss_mib_peak"),
    "idle_writes": ("idle", "writes"),
    "idle_window_s": ("idle", "window_s"),
    "soak_s": ("soak", "duration_s"),
    "soak_rss_drift_pct": ("soak", "rss_drift_pct"),
}
FULL_FLEET_NODES = 2000


def _g(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _median(values: Iterable[float | None], digits: int = 3) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), digits) if vals else None


def _max(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _per(value: float | None, n: int) -> float | None:
    return value / n if value is not None and n else None


def pair_ratio(pair: dict[str, Any]) -> float | None:
    """Operator / direct time until every workload was ready, None unless both converged."""
    op, direct = _g(pair, "operator", "converge_s"), _g(pair, "direct", "converge_s")
    return round(op / direct, 3) if op and direct else None


def median_pair_index(pairs: Sequence[dict[str, Any]]) -> int:
    """The pair whose ratio is the median (the lower middle of an even count); the first
    pair when none has a ratio. Its arms stand for the size in tables and plots."""
    ranked = sorted((r, i) for i, p in enumerate(pairs) if (r := pair_ratio(p)) is not None)
    return ranked[(len(ranked) - 1) // 2][1] if ranked else 0


# Every process of a run but the bench's own: what the machine's cores did for an arm.
MACHINE_PROCESSES = (
    "operator",
    "direct-applier",
    "kube-apiserver",
    "etcd",
    "kube-scheduler",
    "kube-controller-manager",
    "nodesim",
)


def cpu_within(points: list[list[float]], end: float) -> float | None:
    """CPU-s a process used between t=0 (the first apply) and `end`, from (t, cpu, rss)."""
    inside = [p for p in points if 0 <= p[0] <= end]
    return inside[-1][1] - inside[0][1] if len(inside) > 1 else None


def machine_cpu_s(arm: dict[str, Any]) -> float | None:
    """CPU-s of every process from the first apply until every workload was ready."""
    end, series = arm.get("converge_s"), _g(arm, "series", "proc")
    if not end or not series:
        return None
    return sum(cpu_within(series.get(name) or [], end) or 0.0 for name in MACHINE_PROCESSES)


def machine_cpu_ratio(pair: dict[str, Any]) -> float | None:
    """Operator / direct CPU-s of the whole machine until converged: while both cores are
    busy, the converge ratio follows it."""
    op, direct = machine_cpu_s(pair.get("operator") or {}), machine_cpu_s(pair.get("direct") or {})
    return round(op / direct, 3) if op and direct else None


def _requests(op: dict[str, Any]) -> float | None:
    verbs = _g(op, "operator_requests", "during_run_by_verb")
    return float(sum(verbs.values())) if isinstance(verbs, dict) else None


def _idle_cpu_pct(op: dict[str, Any]) -> float | None:
    """Operator CPU while nothing changes (the no-op resync window after convergence)."""
    cpu, window = _g(op, "noop_resync", "operator_cpu_seconds"), _g(op, "noop_resync", "window_s")
    return 100.0 * cpu / window if cpu is not None and window else None


def size_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one deployment count over its pairs."""
    n = int(run["n"])
    pairs = run.get("pairs") or []
    ops = [p.get("operator") or {} for p in pairs]
    directs = [p.get("direct") or {} for p in pairs]
    ratios = [r for r in (pair_ratio(p) for p in pairs) if r is not None]
    arms = [a for a in ops + directs if a]  # an arm skipped (--skip) is not judged
    cpu = [_per(_g(o, "operator_process", "cpu_seconds_run"), n) for o in ops]
    stands_for = pairs[median_pair_index(pairs)] if pairs else {}
    return {
        "pairs": len(pairs),
        "operator_cpu_s_per_deployment": _median(cpu),
        "operator_cpu_s_per_deployment_pairs": [
            round(c, 4) if c is not None else None for c in cpu
        ],
        "direct_cpu_s_per_deployment": _median(
            _per(_g(d, "applier_process", "cpu_seconds_run"), n) for d in directs
        ),
        "passes_per_deployment": _median(_g(o, "reconciles", "per_deployment") for o in ops),
        "requests_per_deployment": _median(_per(_requests(o), n) for o in ops),
        "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        "ratio_min": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        "ratios": ratios,
        "machine_cpu_ratios": [machine_cpu_ratio(p) for p in pairs],
        "converged": bool(arms) and all(a.get("converged") for a in arms),
        "rss_mib_peak": _max(_g(o, "operator_process", "peak_rss_mib") for o in ops),
        "noop_writes": _max(_g(o, "noop_resync", "operator_writes_audit") for o in ops),
        "idle_cpu_pct": _median((_idle_cpu_pct(o) for o in ops), 2),
        "operator_ready_s": _median((o.get("operator_ready_s") for o in ops), 2),
        # Where the requests and passes come from, in the pair that stands for the size.
        "requests_per_deployment_by_verb_resource": _g(
            stands_for.get("operator"), "operator_requests", "per_deployment_by_verb_resource"
        ),
        "passes_asked_for_by_cause_per_deployment": _g(
            stands_for.get("operator"), "reconciles", "asked_for_by_cause_per_deployment"
        ),
        # What the API server did in each arm of that pair (with --apiserver-profile).
        "apiserver_profile": {
            arm: profile
            for arm in ("operator", "direct")
            if (profile := _g(stands_for.get(arm), "apiserver_profile"))
        },
    }


def aftercare(results: dict[str, Any]) -> dict[str, Any]:
    """The aftercare of the largest size that has one ({} when none ran)."""
    for run in sorted(results.get("runs", []), key=lambda r: -int(r["n"])):
        for pair in run.get("pairs") or []:
            if care := _g(pair, "operator", "aftercare"):
                return dict(care)
    return {}


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _soak_leaked(care: dict[str, Any]) -> int | None:
    """Deployments whose reconciler state outlived the soak's churn (0: none leaked)."""
    before, after = _g(care, "soak", "tracked_before"), _g(care, "soak", "tracked_after")
    return after - before if before is not None and after is not None else None


def build_summary(results: dict[str, Any]) -> dict[str, Any]:
    """summary.json from a run's results (see the module docstring)."""
    runs = [r for r in results.get("runs", []) if r.get("pairs")]
    sizes = {str(r["n"]): size_summary(r) for r in sorted(runs, key=lambda r: r["n"])}
    nodes = _g(results, "fleet", "nodes")
    startups = [s["operator_ready_s"] for s in sizes.values() if s["operator_ready_s"] is not None]
    startup = _median(startups, 2)
    largest = sizes[max(sizes, key=int)] if sizes else {}
    care = aftercare(results)
    return {
        "commit": _g(results, "source", "commit"),
        "operator_dirty": _g(results, "source", "operator_dirty"),
        "machine": results.get("machine"),
        "scale": results.get("scale"),
        "fleet_nodes": nodes,
        "fleet_activity": results.get("fleet_activity"),
        "sizes": sizes,
        # Operator start to its first deployment reconciled (the arms' canary), median.
        "startup_s": startup,
        "startup_s_2000_nodes": startup if nodes == FULL_FLEET_NODES else None,
        # After the largest size converged: the idle window, else its (short) no-op window.
        "idle_cpu_pct": _first(_g(care, "idle", "cpu_pct"), largest.get("idle_cpu_pct")),
        "aftercare_n": care.get("n"),
        **{key: _g(care, *where) for key, where in AFTERCARE_KEYS.items()},
        "soak_leaked_deployments": _soak_leaked(care),
    }


__all__ = [
    "AFTERCARE_KEYS",
    "aftercare",
    "build_summary",
    "median_pair_index",
    "pair_ratio",
    "size_summary",
]
