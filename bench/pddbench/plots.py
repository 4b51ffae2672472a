"""PNG plots of a bench run's results (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import itertools

import matplotlib.pyplot as plt

from pddbench import results_file as results_io

OP, DIRECT = "#1f77b4", "#ff7f0e"


def _latency_panel(a: Any, runs: list[Any], ns: list[Any], key: str, title: str) -> None:
    """p50 and p99 of one latency per deployment count, operator beside direct."""
    for arm, color, mark in (("operator", OP, "o"), ("direct", DIRECT, "s")):
        for q, style in (("p50", "-"), ("p99", "--")):
            a.plot(ns, [_get(r, arm, key, q) for r in runs], mark + style, c=color,
                   label=f"{arm} {q}")  # fmt: skip
    a.set(xscale="log", xlabel="deployments", ylabel="s", title=title)
    a.legend(fontsize=8)


def plot_all(results: dict[str, Any], out_dir: Path) -> list[Path]:
    files: list[Path] = []
    views = map(results_io.median_view, results.get("runs", []))
    runs = [r for r in views if "operator" in r or "operator_none" in r]
    if runs:
        files.append(_growth(runs, out_dir / "growth.png"))
        for run in runs:
            files.append(_timeline(run, out_dir / f"timeline_n{run['n']}.png"))
    if results.get("placement"):
        files.append(_placement(results["placement"], out_dir / "placement.png"))
    return files


def _get(d: dict[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)  # type: ignore[assignment]
    return d


def _growth(runs: list[dict[str, Any]], path: Path) -> Path:
    ns = [r["n"] for r in runs]
    fig, ax = plt.subplots(2, 3, figsize=(16, 9))

    a = ax[0][0]
    for i, (arm, color, mark, label) in enumerate(
        (
            ("operator", OP, "o", "operator (placement preferred)"),
            ("operator_none", "purple", "^", "operator (placement none)"),
            ("direct", DIRECT, "s", "children applied directly"),
        )
    ):
        xs, ys = [], []
        for r in runs:
            o = r.get(arm)
            if not o:
                continue
            if o.get("converge_s") is not None:
                xs.append(r["n"])
                ys.append(o["converge_s"])
                continue
            # Not converged: where it stood at the time limit.
            tl = _get(o, "series", "timeline") or []
            limit = _get(o, "config", "converge_timeout") or 0
            at = [p for p in tl if p[0] <= limit] or tl
            if at:
                a.plot([r["n"]], [limit], "x", c=color, ms=10)
                a.annotate(
                    f"{at[-1][2]}/{r['n']} ready", (r["n"], limit), fontsize=7, color=color,
                    textcoords="offset points", xytext=(-75, -14 * i - 4),
                )  # fmt: skip
        a.plot(xs, ys, mark + "-", c=color, label=label)
    a.set(
        xscale="log",
        xlabel="deployments",
        ylabel="s",
        title="whole set ready (x: not converged at the time limit)",
    )
    a.legend(fontsize=8)

    # From the burst's submission; runs before issue 16 only had the pick-up clock.
    clock = "submit" if any(_get(r, "operator", "submit_to_ready_s") for r in runs) else "apply"
    _latency_panel(ax[0][1], runs, ns, f"{clock}_to_children_s", f"{clock} -> children created")
    ax[0][1].set(yscale="log")
    _latency_panel(ax[0][2], runs, ns, f"{clock}_to_ready_s", f"{clock} -> workloads Ready")

    a = ax[1][0]
    a.plot(ns, [_get(r, "operator", "operator_process", "peak_rss_mib") for r in runs], "o-", c=OP)
    a.set(xscale="log", xlabel="deployments", ylabel="MiB", title="operator peak RSS")
    b = a.twinx()
    b.plot(
        ns, [_get(r, "operator", "operator_process", "cpu_seconds_run") for r in runs], "^:", c="k"
    )
    b.set_ylabel("CPU s during the run (dotted)")

    a = ax[1][1]
    verbs = sorted(
        {
            v
            for r in runs
            for v in (_get(r, "operator", "operator_requests", "per_reconcile_by_verb") or {})
        }
    )
    bottom = [0.0] * len(runs)
    xs = list(range(len(runs)))
    for verb in verbs:
        vals = [
            (_get(r, "operator", "operator_requests", "per_reconcile_by_verb") or {}).get(verb, 0)
            for r in runs
        ]
        a.bar(xs, vals, bottom=bottom, label=verb)
        bottom = [b_ + v for b_, v in zip(bottom, vals, strict=True)]
    a.set_xticks(xs, [str(n) for n in ns])
    a.set(xlabel="deployments", ylabel="requests", title="operator API requests per reconcile")
    a.legend(fontsize=8)

    a = ax[1][2]
    a.plot(
        ns,
        [_get(r, "operator", "noop_resync", "operator_reads_per_minute") for r in runs],
        "o-",
        c=OP,
        label="operator reads/min (steady)",
    )
    a.plot(
        ns,
        [_get(r, "operator", "noop_resync", "operator_writes_audit") for r in runs],
        "x--",
        c="r",
        label="operator writes in the steady window (no-op only if converged)",
    )
    a.set(xscale="log", xlabel="deployments", title="steady state (several resync periods)")
    a.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _timeline(run: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(1, 2, figsize=(14, 4.8))
    a = ax[0]
    for arm, color in (("operator", OP), ("operator_none", "purple"), ("direct", DIRECT)):
        tl = _get(run, arm, "series", "timeline") or []
        if not tl:
            continue
        t = [p[0] for p in tl]
        a.plot(t, [p[1] for p in tl], ":", c=color, label=f"{arm}: children created")
        a.plot(t, [p[2] for p in tl], "-", c=color, label=f"{arm}: workloads ready")
        if arm == "operator":
            a.plot(t, [p[3] for p in tl], "--", c=color, label="operator: PDDeployment Ready")
    a.set(xlabel="s since the first apply", ylabel="deployments", title=f"{run['n']} deployments")
    a.legend(fontsize=8)

    a = ax[1]
    proc = _get(run, "operator", "series", "proc") or {}
    for name, color in (
        ("operator", OP),
        ("kube-apiserver", "g"),
        ("etcd", "m"),
        ("kube-scheduler", "c"),
        ("kube-controller-manager", "y"),
        ("nodesim", "k"),
    ):
        pts = [p for p in proc.get(name) or [] if p[0] >= -5]
        if len(pts) < 2:
            continue
        t = [p[0] for p in pts[1:]]
        cpu = [
            max(0.0, (b[1] - a_[1]) / (b[0] - a_[0])) if b[0] > a_[0] else 0.0
            for a_, b in itertools.pairwise(pts)
        ]
        a.plot(t, cpu, c=color, label=name, lw=1)
    busy = _get(run, "operator", "series", "machine_busy") or []
    if busy:
        a.plot(
            [p[0] for p in busy],
            [p[1] * 2 for p in busy],
            c="grey",
            ls="--",
            lw=1,
            label="whole machine (cores busy)",
        )
    a.set(xlabel="s since the first apply", ylabel="cores", title="CPU during the operator arm")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _placement(p: dict[str, Any], path: Path) -> Path:
    arms = list(p["arms"])
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.5))
    a = ax[0]
    classes = [
        ("node", "same node"),
        ("clique", "same NVLink clique"),
        ("rack", "same rack"),
        ("cross-rack", "across racks"),
    ]
    bottom = [0.0] * len(arms)
    for cls, label in classes:
        vals = [p["arms"][arm]["share"][cls] for arm in arms]
        a.bar(arms, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    a.set(ylabel="share of prefill->decode pairs", title="where each P->D pair landed")
    a.legend(fontsize=8)
    a = ax[1]
    xs = list(range(len(arms)))
    a.bar(
        [x - 0.2 for x in xs],
        [p["arms"][arm]["kv_transfer_ms"]["mean"] for arm in arms],
        0.4,
        label="mean",
    )
    a.bar(
        [x + 0.2 for x in xs],
        [p["arms"][arm]["kv_transfer_ms"]["p99"] for arm in arms],
        0.4,
        label="p99",
    )
    a.set_xticks(xs, arms)
    a.set(ylabel="ms", title="KV transfer of a 4,096-token prompt (70B, 1.34 GB)")
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
