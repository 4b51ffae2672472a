"""Markdown tables from a bench run's raw results (for docs/benchmarks-operator.md).

.venv/bin/python bench/report.py bench/results/full/results.json.gz

`bench/run.py` writes the same tables as ``summary.md`` beside the results.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pddbench import results_file as results_io
from pddbench.summary import aftercare, build_summary, cpu_within


def _g(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _verbs(d: dict[str, float] | None) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in (d or {}).items()) or "—"


def _ready_at_limit(o: dict[str, Any]) -> Any:
    """Workloads ready at the arm's time limit (the timeline goes on while a slow client is
    still applying, so the last point can be later than the limit)."""
    limit = _g(o, "config", "converge_timeout") or 0
    tl = [p for p in _g(o, "series", "timeline") or [] if p[0] <= limit + 1]
    return tl[-1][2] if tl else o.get("ready_count")


ALL_ARMS = ("operator", "operator_none", "direct")
OPERATOR_ARMS = ("operator", "operator_none")


def _arms(r: dict[str, Any], arms: tuple[str, ...]) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(deployments, arm, the arm's results) for every run and every arm it recorded."""
    for run in map(results_io.median_view, r.get("runs", [])):
        for arm in arms:
            if run.get(arm):
                yield run["n"], arm, run[arm]


def profile_tables(r: dict[str, Any]) -> str:
    rows: dict[str, dict[str, float]] = {}
    cols = []
    for n, arm, o in _arms(r, OPERATOR_ARMS):
        cats = _g(o, "profile", "by_category", "categories")
        if not cats:
            continue
        col = f"n={n} {'preferred' if arm == 'operator' else 'none'}"
        cols.append(col)
        for c in cats:
            if c.get("share_of_busy") is not None:
                rows.setdefault(c["category"], {})[col] = c["share_of_busy"]
    if not cols:
        return ""
    out = ["| where the operator's busy samples go | " + " | ".join(cols) + " |"]
    out.append("|---|" + "---|" * len(cols))
    for cat, vals in sorted(rows.items(), key=lambda kv: -max(kv[1].values())):
        out.append(
            f"| {cat} | " + " | ".join(f"{vals[c]:.0%}" if c in vals else "—" for c in cols) + " |"
        )
    return "\n".join(out)


def apiserver_profile_tables(r: dict[str, Any]) -> str:
    """The API server's CPU-s by work, arm beside arm (median pair): what the operator asks
    of the server beyond the children themselves."""
    cols: list[str] = []
    rows: dict[str, dict[str, float]] = {}
    for n, arm, o in _arms(r, ALL_ARMS):
        profile = o.get("apiserver_profile") or {}
        if not profile.get("by_work_s"):
            continue
        col = f"n={n} {arm}"
        cols.append(col)
        rows.setdefault("all", {})[col] = profile["cpu_s"]
        for name, value in profile["by_work_s"].items():
            rows.setdefault(name, {})[col] = value
    if not cols:
        return ""
    out = ["| API server CPU-s by work | " + " | ".join(cols) + " |"]
    out.append("|---|" + "---|" * len(cols))
    for name, vals in sorted(rows.items(), key=lambda kv: -max(kv[1].values())):
        out.append(f"| {name} | " + " | ".join(_f(vals.get(c)) for c in cols) + " |")
    return "\n".join(out)


def _latency(o: dict[str, Any], what: str) -> dict[str, Any]:
    """From the burst's submission; runs before issue 16 have only the clock that started
    when a client thread picked the deployment up (their tables said apply→)."""
    found: dict[str, Any] = o.get(f"submit_to_{what}_s") or o.get(f"apply_to_{what}_s") or {}
    return found


def scale_tables(r: dict[str, Any]) -> str:
    out = []
    out.append(
        "| deployments | arm | converged | whole set ready (s) | PDDeployments Ready (s) | "
        "submit→children p50 / p99 (s) | submit→ready p50 / p99 (s) | peak RSS of the arm's "
        "process (MiB) | its CPU, submission to convergence (s) |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    labels = {
        "operator": "operator (placement preferred)",
        "operator_none": "operator (placement none)",
        "direct": "rendered children applied directly",
    }
    for n, arm, o in _arms(r, ALL_ARMS):
        ch, rd = _latency(o, "children"), _latency(o, "ready")
        # The operator, or the direct arm's applying client (a process since issue 16).
        proc = o.get("operator_process") or o.get("applier_process")
        conv = "yes" if o.get("converged") else f"no: {_ready_at_limit(o)}/{n} ready at the limit"
        out.append(
            f"| {n} | {labels[arm]} | {conv} | {_f(o.get('converge_s'))} | "
            f"{_f(o.get('converge_pdd_ready_s'))} | {_f(ch.get('p50'), 2)} / "
            f"{_f(ch.get('p99'), 2)} | {_f(rd.get('p50'), 1)} / {_f(rd.get('p99'), 1)} | "
            f"{_f(_g(proc, 'peak_rss_mib'))} | {_f(_g(proc, 'cpu_seconds_run'))} |"
        )
    out.append("")
    out.append(
        "| deployments | overhead ratio (operator / direct, workloads ready) | "
        "same, until every PDDeployment reports Ready | placement none / direct |"
    )
    out.append("|---|---|---|---|")
    for run in map(results_io.median_view, r.get("runs", [])):
        none_ratio = None
        if _g(run, "operator_none", "converge_s") and _g(run, "direct", "converge_s"):
            none_ratio = round(run["operator_none"]["converge_s"] / run["direct"]["converge_s"], 2)
        out.append(
            f"| {run['n']} | {_f(run.get('overhead_ratio'), 2)} | "
            f"{_f(run.get('overhead_ratio_pdd_ready'), 2)} | {_f(none_ratio, 2)} |"
        )
    return "\n".join(out)


def api_tables(r: dict[str, Any]) -> str:
    out = [
        "| deployments | arm | reconciles / deployment | operator requests / reconcile "
        "(audit, by verb) | operator requests / deployment | StatefulSet domain moves | "
        "all-client apiserver requests / deployment |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, arm, o in _arms(r, ALL_ARMS):
        out.append(
            f"| {n} | {arm} | {_f(_g(o, 'reconciles', 'per_deployment'))} | "
            f"{_verbs(_g(o, 'operator_requests', 'per_reconcile_by_verb'))} | "
            f"{_verbs(_g(o, 'operator_requests', 'per_deployment_by_verb'))} | "
            f"{_f(o.get('sts_domain_changes'))} | "
            f"{_verbs(_g(o, 'apiserver_requests_all_clients', 'per_deployment_by_verb'))} |"
        )
    return "\n".join(out)


def steady_tables(r: dict[str, Any]) -> str:
    out = [
        "| deployments | arm | converged before the window | window (s) / resync (s) | "
        "reconciles in window | operator writes (audit) | by resource | writes by anyone to "
        "operator resources | PDDeployments written | probe requests renewed | operator reads/min "
        "|",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, arm, o in _arms(r, OPERATOR_ARMS):
        if "noop_resync" not in o:
            continue
        s = o["noop_resync"]
        out.append(
            f"| {n} | {arm} | {'yes' if o.get('converged') else 'no'} | "
            f"{s['window_s']} / {s['resync_seconds']} | {s['reconciles']} | "
            f"{s['operator_writes_audit']} | "
            f"{_verbs(s.get('operator_writes_audit_by_resource'))} | "
            f"{s['writes_all_clients_operator_resources']} | "
            f"{s.get('deployments_written', '—')} | {s.get('probe_requests_renewed', '—')} | "
            f"{s['operator_reads_per_minute']} |"
        )
    return "\n".join(out)


def aftercare_tables(r: dict[str, Any]) -> str:
    """Restart, idle and soak on the largest size's converged cluster (pddbench.aftercare)."""
    care = aftercare(r)
    if not care:
        return "not run"
    idle, restart, soak = (care.get(k) or {} for k in ("idle", "restart", "soak"))
    rows = [
        ("restart: old process stopped (s) / new one alive (s)",
         f"{_f(restart.get('stop_s'), 2)} / {_f(restart.get('alive_s'), 2)}"),
        ("restart: first reconcile (s from start)", _f(restart.get("first_reconcile_s"), 2)),
        ("restart: all re-verified (s from start)",
         f"{_f(restart.get('all_verified_s'), 2)} ({_f(restart.get('verified'))} of "
         f"{_f(restart.get('deployments'))})"),
        ("restart: operator RSS peak / settled (MiB)",
         f"{_f(restart.get('rss_mib_peak'))} / {_f(restart.get('rss_mib_settled'))}"),
        ("restart: writes (by resource) / reads, audit", f"{_f(restart.get('writes'))} "
         f"({_verbs(restart.get('writes_by_resource'))}) / {_f(restart.get('reads'))}"),
        ("idle: window (s) / resync (s)", f"{_f(idle.get('window_s'))} / "
         f"{_f(idle.get('resync_seconds'))}"),
        ("idle: operator CPU (% of a core)", _f(idle.get("cpu_pct"), 2)),
        ("idle: reconciles / writes / reads", f"{_f(idle.get('reconciles'))} / "
         f"{_f(idle.get('writes'))} / {_f(idle.get('reads'))}"),
        ("soak: duration (s), churn created, at most alive, lifetime (s)",
         f"{_f(soak.get('duration_s'))}, {_f(soak.get('created'))}, "
         f"{_f(soak.get('extra_at_most'))}, {_f(soak.get('lifetime_s'))}"),
        ("soak: RSS first / last (MiB), drift after warm-up (%)",
         f"{_f(soak.get('rss_mib_first'))} / {_f(soak.get('rss_mib_last'))}, "
         f"{_f(soak.get('rss_drift_pct'), 2)}"),
        ("soak: deployments tracked before / churning / after (back after s)",
         f"{_f(soak.get('tracked_before'))} / {_f(soak.get('tracked_churning'))} / "
         f"{_f(soak.get('tracked_after'))} ({_f(soak.get('tracked_back_s'))})"),
        ("soak: per-deployment metric samples before / after",
         f"{_f(soak.get('deployment_series_before'))} / "
         f"{_f(soak.get('deployment_series_after'))}"),
    ]  # fmt: skip
    errors = [f"{k}: {v['error']}" for k, v in care.items() if isinstance(v, dict) and "error" in v]
    out = [f"{care.get('n')} deployments converged, steps {care.get('steps')}", "",
           "| measure | value |", "|---|---|"]  # fmt: skip
    out += [f"| {k} | {v} |" for k, v in rows] + [f"\nerror {e}" for e in errors]
    return "\n".join(out)


def placement_tables(r: dict[str, Any]) -> str:
    p = r.get("placement")
    if not p:
        return ""
    out = [
        f"Fleet: {p['config']['nodes']} nodes; fillers use {p['fillers']['gpus_used']} of "
        f"{p['fillers']['gpus_total']} GPUs; the {len(p['shapes'])} deployments need "
        f"{p['fillers']['demand_gpus']} GPUs. Free GPUs per node (count of nodes): "
        f"{p['fillers']['free_per_node_histogram']}.",
        "",
        "| arm | P→D pairs | same node | same clique (other node) | same rack (other clique) | "
        "across racks | in the best domain with room | KV transfer mean / p99 (ms) | "
        "same, spine 2:1 (ms) | deployments fully bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in p["arms"].items():
        sh = a["share"]
        label = {"required": "planner, required", "preferred": "planner, preferred",
                 "none": "default scheduler alone"}.get(arm, arm)  # fmt: skip
        out.append(
            f"| {label} | {a['pairs']} | {sh['node']:.1%} | {sh['clique']:.1%} | "
            f"{sh['rack']:.1%} | {sh['cross-rack']:.1%} | {a['share_in_best_domain']:.1%} | "
            f"{a['kv_transfer_ms']['mean']} / {a['kv_transfer_ms']['p99']} | "
            f"{a['kv_transfer_ms_spine_2to1']['mean']} / "
            f"{a['kv_transfer_ms_spine_2to1']['p99']} | "
            f"{a['deployments_fully_bound']}/{len(a['per_deployment'])} |"
        )
    return "\n".join(out)


def burst_pairs(r: dict[str, Any]) -> str:
    out = [
        "| deployments | arm | pairs within a clique | across racks | KV mean / p99 (ms) |",
        "|---|---|---|---|---|",
    ]
    for n, arm, o in _arms(r, ALL_ARMS):
        q = o.get("pair_quality")
        if not q or not q.get("pairs"):
            continue
        out.append(
            f"| {n} | {arm} | {q['share_within_clique']:.1%} | "
            f"{q['share']['cross-rack']:.1%} | {q['kv_transfer_ms']['mean']} / "
            f"{q['kv_transfer_ms']['p99']} |"
        )
    return "\n".join(out)


def pair_tables(r: dict[str, Any]) -> str:
    """The headline over interleaved pairs (summary.json's numbers)."""
    sizes = build_summary(r)["sizes"]
    if not sizes:
        return "(no interleaved pairs in this run)"
    out = [
        "| deployments | pairs | converged | ratio median [min, max] | operator CPU-s / "
        "deployment | direct CPU-s / deployment | passes / deployment | operator requests / "
        "deployment | operator peak RSS (MiB) | no-op writes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, s in sizes.items():
        out.append(
            f"| {n} | {s['pairs']} | {'yes' if s['converged'] else 'no'} | "
            f"{_f(s['ratio_median'], 2)} [{_f(s['ratio_min'], 2)}, {_f(s['ratio_max'], 2)}] | "
            f"{_f(s['operator_cpu_s_per_deployment'], 3)} | "
            f"{_f(s['direct_cpu_s_per_deployment'], 3)} | {_f(s['passes_per_deployment'], 2)} | "
            f"{_f(s['requests_per_deployment'], 1)} | {_f(s['rss_mib_peak'])} | "
            f"{_f(s['noop_writes'])} |"
        )
    out.append("")
    out.append("The tables below show each size's median pair.")
    return "\n".join(out)


CPU_PROCESSES = (
    ("operator", "operator"),
    ("direct-applier", "direct client"),
    ("kube-apiserver", "kube-apiserver"),
    ("etcd", "etcd"),
    ("kube-scheduler", "scheduler"),
    ("kube-controller-manager", "controllers"),
    ("nodesim", "simulated kubelets"),
)


def cpu_tables(r: dict[str, Any]) -> str:
    """Where the machine's cores went from the first apply to convergence, process by
    process: on a machine the control plane shares, the operator's cost is its own CPU and
    the API server's for its requests and watches, and both lengthen convergence."""
    head = " | ".join(label for _, label in CPU_PROCESSES)
    out = [
        f"| deployments | arm | converged after (s) | {head} | all (CPU-s) | machine busy |",
        "|---|---|---|" + "---|" * len(CPU_PROCESSES) + "---|---|",
    ]
    for n, arm, o in _arms(r, ALL_ARMS):
        end, series = o.get("converge_s"), _g(o, "series", "proc")
        if not end or not series:
            continue
        used = {name: cpu_within(series.get(name) or [], end) for name, _ in CPU_PROCESSES}
        busy = [b for t, b in _g(o, "series", "machine_busy") or [] if 0 <= t <= end]
        cells = " | ".join(_f(used[name]) for name, _ in CPU_PROCESSES)
        total = sum(v for v in used.values() if v is not None)
        share = f"{sum(busy) / len(busy):.0%}" if busy else "—"
        out.append(f"| {n} | {arm} | {_f(end)} | {cells} | {_f(total)} | {share} |")
    return "\n".join(out)


def render(r: dict[str, Any]) -> str:
    """Every table of one run, as Markdown."""
    parts = [
        f"command: `{r.get('command')}`, wall {r.get('wall_seconds')} s, machine {r['machine']}\n",
        f"source: {r.get('source')}\n",
        f"fleet activity: {r.get('fleet_activity')}\n",
        f"start-up probe: {r.get('startup_probe')}\n\n",
    ]
    for title, fn in (
        ("Interleaved pairs", pair_tables),
        ("Scale", scale_tables),
        ("CPU by process, first apply to convergence (median pair)", cpu_tables),
        ("API requests", api_tables),
        ("Steady state", steady_tables),
        ("After the largest size: restart, idle, soak", aftercare_tables),
        ("Placement quality", placement_tables),
        ("Operator profile (py-spy)", profile_tables),
        ("API server profile (Go pprof, create to converged)", apiserver_profile_tables),
        ("P->D pairs in the scale runs (burst apply)", burst_pairs),
    ):
        parts.append(f"### {title}\n\n{fn(r)}\n\n")
    return "".join(parts)


def main() -> int:
    print(render(results_io.load(Path(sys.argv[1]))), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
