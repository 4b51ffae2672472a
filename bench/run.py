"""`make bench`: the operator at scale on the real control plane with simulated GPU nodes,
side by side with the same workloads applied directly, and placement quality.

    .venv/bin/python bench/run.py --scale small|full --out bench/results

Writes bench/results/<scale>/results.json.gz (raw, compressed), summary.md and PNG plots;
logs, audit-derived data and profiles go under bench/results/raw/<scale>/ (not committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO / "operator"), str(BENCH)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO / "operator"), str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])]
)

from pddbench import results_file as results_io  # noqa: E402
from pddbench.analysis import categorize_profile, summarize_profile  # noqa: E402
from pddbench.cluster import FleetSpec  # noqa: E402
from pddbench.placement import PlacementConfig, run_placement  # noqa: E402
from pddbench.plots import plot_all  # noqa: E402
from pddbench.scale import (  # noqa: E402
    ScaleConfig,
    run_direct_arm,
    run_operator_arm,
    startup_probe,
)
from report import render as render_summary  # noqa: E402

SCALES: dict[str, dict[str, Any]] = {
    # ~100 nodes, 10 and 50 deployments: a few minutes.
    "small": {
        "fleet": FleetSpec(cliques=6, nodes_per_clique=16, racks_per_clique=2),
        "sizes": [10, 50],
        "converge_timeout": {10: 60.0, 50: 120.0},
        "resync_seconds": 3.0,
        "settle_seconds": 5.0,
        "steady_seconds": 10.0,
        "profile_sizes": [50],
        "none_sizes": [],
        "placement": PlacementConfig(
            fleet=FleetSpec(cliques=6, nodes_per_clique=6, cliques_per_rack=2),
            deployments=10,
            bind_timeout=20.0,
        ),
    },
    # 2,000 nodes (125 NVLink cliques of 16, two racks each); 10, 100, 1,000 deployments.
    "full": {
        "fleet": FleetSpec(cliques=125, nodes_per_clique=16, racks_per_clique=2),
        "sizes": [10, 100, 1000],
        "converge_timeout": {10: 120.0, 100: 240.0, 1000: 360.0},
        "resync_seconds": 10.0,
        "settle_seconds": 10.0,
        "steady_seconds": 30.0,
        "profile_sizes": [100, 1000],
        "none_sizes": [100],
        "placement": PlacementConfig(
            fleet=FleetSpec(cliques=8, nodes_per_clique=8, cliques_per_rack=2),
            deployments=24,
            bind_timeout=20.0,
        ),
    },
}


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--out", default=str(BENCH / "results"))
    ap.add_argument("--sizes", help="comma-separated deployment counts (override)")
    ap.add_argument("--controller-qps", type=int, default=400)
    ap.add_argument(
        "--skip", default="", help="comma list: probe,scale,operator,direct,operator-none,placement"
    )
    ap.add_argument("--converge-timeout", type=float)
    ap.add_argument("--profile", action="store_true", help="py-spy the operator at every size")
    ap.add_argument("--none-sizes", help="sizes that also get the placement-none operator arm")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep what an earlier (interrupted) run of this scale recorded; run only the rest",
    )
    ap.add_argument(
        "--replot",
        action="store_true",
        help="only redo the derived parts (profile summaries, plots) of a results.json.gz",
    )
    args = ap.parse_args()

    preset = SCALES[args.scale]
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else preset["sizes"]
    skip = set(filter(None, args.skip.split(",")))
    none_sizes = (
        [int(x) for x in args.none_sizes.split(",") if x]
        if args.none_sizes is not None
        else preset["none_sizes"]
    )
    out_dir = Path(args.out).resolve() / args.scale
    raw_dir = Path(args.out).resolve() / "raw" / args.scale
    work_dir = Path(os.environ.get("PDD_BENCH_WORK", REPO / ".tmp" / "bench")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    if args.replot:
        return replot(out_dir, raw_dir)

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.0f}s] {msg}", flush=True)

    results: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "bench/run.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": _machine(),
        "source": _source(),
        "scale": args.scale,
        "controller_qps": args.controller_qps,
        "runs": [],
    }
    results_file = out_dir / results_io.NAME
    done_sizes: set[int] = set()
    if args.resume and results_file.exists():
        earlier = results_io.load(results_file)
        results["runs"] = [r for r in earlier.get("runs", []) if "operator" in r and "direct" in r]
        done_sizes = {r["n"] for r in results["runs"]}
        for key in ("startup_probe", "placement"):
            if key in earlier:
                results[key] = earlier[key]
        results["resumed"] = {
            "earlier_command": earlier.get("command"),
            "earlier_started": earlier.get("started"),
            "earlier_source": earlier.get("source"),
            "kept_sizes": sorted(done_sizes),
        }
        log(f"resuming: keeping sizes {sorted(done_sizes)} from {earlier.get('started')}")

    def save() -> None:
        results["wall_seconds"] = round(time.monotonic() - t_start, 1)
        results_io.save(results_file, results)

    if "probe" not in skip and "startup_probe" not in results:
        log(f"start-up probe: the operator as shipped on {preset['fleet'].nodes} nodes")
        results["startup_probe"] = startup_probe(
            preset["fleet"], args.controller_qps, work_dir, raw_dir, log
        )
        log(f"  {results['startup_probe']}")
        save()

    if "scale" not in skip:
        for n in [n for n in sizes if n not in done_sizes]:
            cfg = ScaleConfig(
                n=n,
                fleet=preset["fleet"],
                controller_qps=args.controller_qps,
                converge_timeout=args.converge_timeout or preset["converge_timeout"].get(n, 300.0),
                resync_seconds=preset["resync_seconds"],
                settle_seconds=preset["settle_seconds"],
                steady_seconds=preset["steady_seconds"],
                profile=args.profile or n in preset["profile_sizes"],
            )
            run: dict[str, Any] = {"n": n}
            results["runs"].append(run)
            op: dict[str, Any] = {}
            handoff: dict[str, Any] = {}
            if "operator" not in skip:
                log(f"scale n={n} on {cfg.fleet.nodes} nodes: operator arm")
                op, handoff = run_operator_arm(cfg, work_dir, raw_dir / f"n{n}", log)
                log(f"  operator: {_brief(op)}")
                run["operator"] = op
                save()
            if "direct" not in skip:
                log(f"scale n={n}: direct arm (rendered children applied by hand)")
                direct = run_direct_arm(cfg, work_dir, raw_dir / f"n{n}", handoff, log)
                log(f"  direct: {_brief(direct)}")
                run["direct"] = direct
                if op.get("converge_s") and direct.get("converge_s"):
                    run["overhead_ratio"] = round(op["converge_s"] / direct["converge_s"], 2)
                if op.get("converge_pdd_ready_s") and direct.get("converge_s"):
                    run["overhead_ratio_pdd_ready"] = round(
                        op["converge_pdd_ready_s"] / direct["converge_s"], 2
                    )
                save()
            if "operator-none" not in skip and n in none_sizes:
                log(f"scale n={n}: operator arm with topology.placement none (no planner)")
                none, _ = run_operator_arm(
                    dataclasses.replace(cfg, placement="none"),
                    work_dir,
                    raw_dir / f"n{n}-none",
                    log,
                )
                log(f"  operator (placement none): {_brief(none)}")
                run["operator_none"] = none
                save()

    if "placement" not in skip and "placement" not in results:
        log("placement quality: planner vs the default scheduler on a fragmented fleet")
        results["placement"] = run_placement(preset["placement"], work_dir, raw_dir, log)
        save()

    plot_all(results, out_dir)
    save()
    (out_dir / "summary.md").write_text(render_summary(results))
    log(f"done: {results_file}")
    if os.environ.get("PDD_BENCH_KEEP_WORK") != "1":
        shutil.rmtree(work_dir / "cluster", ignore_errors=True)
    return 0


def replot(out_dir: Path, raw_dir: Path) -> int:
    results_file = out_dir / results_io.NAME
    results = results_io.load(results_file)
    for run in results.get("runs", []):
        for arm, sub in (("operator", f"n{run['n']}"), ("operator_none", f"n{run['n']}-none")):
            prof = raw_dir / sub / "operator-profile.txt"
            if arm in run and prof.exists():
                raw = prof.read_text()
                run[arm]["profile"] = {
                    **summarize_profile(raw),
                    "by_category": categorize_profile(raw),
                }
    results_io.save(results_file, results)
    (out_dir / "summary.md").write_text(render_summary(results))
    for f in plot_all(results, out_dir):
        print(f)
    return 0


def _brief(r: dict[str, Any]) -> str:
    lat = r.get("apply_to_children_s", {})
    return (
        f"converge {r.get('converge_s')}s (PDD Ready {r.get('converge_pdd_ready_s')}s), "
        f"ready {r.get('ready_count')}, children p50 {lat.get('p50')}s p99 {lat.get('p99')}s, "
        f"RSS {r.get('operator_process', {}).get('peak_rss_mib')} MiB, "
        f"no-op writes {r.get('noop_resync', {}).get('operator_writes_audit')}"
    )


def _source() -> dict[str, Any]:
    """The operator code measured: HEAD and whether operator/ had uncommitted changes."""
    import subprocess

    def git(*a: str) -> str:
        res = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return res.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "subject": git("log", "-1", "--format=%s"),
        "operator_dirty": bool(git("status", "--porcelain", "operator/pdd_operator")),
    }


def _machine() -> dict[str, Any]:
    load = Path("/proc/loadavg").read_text().split()[:3]
    mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(int(mem) / 2**20, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_at_start": load,
    }


if __name__ == "__main__":
    sys.exit(main())
