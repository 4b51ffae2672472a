"""`make bench`: the operator at scale on the real control plane with simulated GPU nodes,
side by side with the same workloads applied directly, and placement quality.

    .venv/bin/python bench/run.py --scale small|full --out bench/results

Each deployment count runs `--pairs` interleaved pairs of arms (operator, then the same
workloads applied directly), each arm on a fresh cluster from the same fleet snapshot; the
fleet sends a kubelet's traffic (`--fleet-activity kubelet`, the default).

Writes bench/results/<scale>/results.json.gz (raw, compressed), summary.json (the headline
numbers over pairs), summary.md and PNG plots; logs, audit-derived data and profiles go
under bench/results/raw/<scale>/ (not committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
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
from pddbench.aftercare import STEPS, AftercareConfig, run_aftercare  # noqa: E402
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
from pddbench.summary import build_summary, median_pair_index, pair_ratio  # noqa: E402
from report import render as render_summary  # noqa: E402

from pdd_localcluster.fleet_activity import FleetActivity  # noqa: E402

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
        # 4 foreign GPU pods alive at a time, each for a minute.
        "foreign_gpu_pods": 4,
        "foreign_gpu_pod_lifetime_s": 60.0,
        "placement": PlacementConfig(
            fleet=FleetSpec(cliques=6, nodes_per_clique=6, cliques_per_rack=2),
            deployments=10,
            bind_timeout=20.0,
        ),
        # After the largest size: idle 1 min; soak 2 min, 5 churn deployments of 20 s each.
        "idle_seconds": 60.0,
        "soak_seconds": 120.0,
        "soak_extra": 5,
        "soak_lifetime_seconds": 20.0,
    },
    # 2,000 nodes (125 NVLink cliques of 16, two racks each); 10, 100, 1,000 deployments.
    "full": {
        "fleet": FleetSpec(cliques=125, nodes_per_clique=16, racks_per_clique=2),
        "sizes": [10, 100, 1000],
        # 1,000 deployments are 6,336 pods: 6-9 min at the 12-18 pods/s the control plane
        # moves here, before any operator cost.
        "converge_timeout": {10: 120.0, 100: 240.0, 1000: 900.0},
        # The chart's period: a shorter one adds a pass per deployment every period to what
        # create -> Ready costs (10 s was 100 passes/s at 1,000). No-op passes are checked by
        # the restart step, which re-verifies every deployment.
        "resync_seconds": 300.0,
        "settle_seconds": 10.0,
        "steady_seconds": 30.0,
        "profile_sizes": [100, 1000],
        "none_sizes": [100],
        # 100 foreign GPU pods alive at a time (one node in twenty), each for 5 minutes.
        "foreign_gpu_pods": 100,
        "foreign_gpu_pod_lifetime_s": 300.0,
        "placement": PlacementConfig(
            fleet=FleetSpec(cliques=8, nodes_per_clique=8, cliques_per_rack=2),
            deployments=24,
            bind_timeout=20.0,
        ),
        # After 1,000 converged (issue 16): idle 10 min; soak 1 h, 50 churn deployments of
        # 2 min each (one created and one deleted every 2.4 s).
        "idle_seconds": 600.0,
        "soak_seconds": 3600.0,
        "soak_extra": 50,
        "soak_lifetime_seconds": 120.0,
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
    ap.add_argument(
        "--pairs", type=int, default=3, help="interleaved (operator, direct) pairs per size"
    )
    ap.add_argument(
        "--fleet-activity",
        choices=("kubelet", "off"),
        default="kubelet",
        help="kubelet: Leases, node status reports, 3 daemon pods per node, foreign GPU pods, "
        "pod status in stages; off: the quiet fleet of the runs before issue 16",
    )
    ap.add_argument(
        "--after-largest",
        default=",".join(STEPS),
        help="comma list, run in this order on the largest size's first converged operator "
        "arm: restart (SIGTERM, a fresh operator at the chart's resync period: first pass, "
        "every deployment re-verified, writes), idle (CPU and writes over --idle-seconds), "
        "soak (--soak-seconds of bounded create/delete churn: RSS drift, per-deployment state "
        "left); empty: none",
    )
    ap.add_argument("--idle-seconds", type=float, help="idle window (preset: small 60, full 600)")
    ap.add_argument("--soak-seconds", type=float, help="the soak (preset: small 120, full 3600)")
    ap.add_argument("--soak-extra", type=int, help="churn deployments alive at most (5 / 50)")
    ap.add_argument("--soak-lifetime", type=float, help="seconds each lives (20 / 120)")
    ap.add_argument("--profile", action="store_true", help="py-spy the operator at every size")
    ap.add_argument("--profile-rate", type=int, default=25, help="py-spy samples per second")
    ap.add_argument(
        "--apiserver-profile",
        action="store_true",
        help="Go CPU profiles of the kube-apiserver over both arms (needs `go` on PATH)",
    )
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
    activity = fleet_activity(args.fleet_activity, preset)
    care = aftercare_config(args, preset)
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
        "fleet": {"nodes": preset["fleet"].nodes, **dataclasses.asdict(preset["fleet"])},
        "fleet_activity": {"preset": args.fleet_activity, **activity.as_dict()},
        "pairs_per_size": args.pairs,
        "runs": [],
    }
    results_file = out_dir / results_io.NAME
    done_sizes: set[int] = set()
    if args.resume and results_file.exists():
        earlier = results_io.load(results_file)
        results["runs"] = [
            r
            for r in earlier.get("runs", [])
            if len(r.get("pairs") or []) >= args.pairs
            and all("operator" in p and "direct" in p for p in r["pairs"])
        ]
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
        write_summary(out_dir, results)

    if "probe" not in skip and "startup_probe" not in results:
        log(f"start-up probe: the operator as shipped on {preset['fleet'].nodes} nodes")
        results["startup_probe"] = startup_probe(
            preset["fleet"], args.controller_qps, work_dir, raw_dir, log, activity=activity
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
                profile_rate=args.profile_rate,
                apiserver_profile=args.apiserver_profile,
                activity=activity,
            )
            run: dict[str, Any] = {"n": n, "pairs": []}
            results["runs"].append(run)
            for i in range(args.pairs):
                steps = care if n == max(sizes) and i == 0 and care.steps else None
                run["pairs"].append(run_pair(cfg, i, skip, work_dir, raw_dir, log, save, steps))
                run["median_pair"] = median_pair_index(run["pairs"])
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


def run_pair(
    cfg: ScaleConfig,
    index: int,
    skip: set[str],
    work_dir: Path,
    raw_dir: Path,
    log: Any,
    save: Any,
    care: AftercareConfig | None = None,
) -> dict[str, Any]:
    """One (operator, direct) pair: the direct arm applies the placements the operator arm
    chose, so both place the same workloads on the same nodes. `care`: the steps after the
    operator arm's measurements, on its converged cluster (its results' `aftercare`)."""
    n = cfg.n
    pair: dict[str, Any] = {"pair": index}
    where = raw_dir / f"n{n}" / f"pair{index}"
    handoff: dict[str, Any] = {}
    if "operator" not in skip:
        log(f"scale n={n} pair {index + 1} on {cfg.fleet.nodes} nodes: operator arm")
        after = care and functools.partial(run_aftercare, care, cfg, raw_dir=where, log=log)
        pair["operator"], handoff = run_operator_arm(cfg, work_dir, where, log, after)
        log(f"  operator: {_brief(pair['operator'])}")
    if "direct" not in skip:
        log(f"scale n={n} pair {index + 1}: direct arm (rendered children applied by hand)")
        pair["direct"] = run_direct_arm(cfg, work_dir, where, handoff, log)
        log(f"  direct: {_brief(pair['direct'])}")
    pair["overhead_ratio"] = pair_ratio(pair)
    op, direct = pair.get("operator") or {}, pair.get("direct") or {}
    if op.get("converge_pdd_ready_s") and direct.get("converge_s"):
        pair["overhead_ratio_pdd_ready"] = round(
            op["converge_pdd_ready_s"] / direct["converge_s"], 2
        )
    return pair


def aftercare_config(args: argparse.Namespace, preset: dict[str, Any]) -> AftercareConfig:
    steps = tuple(filter(None, args.after_largest.split(",")))
    if unknown := set(steps) - set(STEPS):
        raise SystemExit(f"--after-largest: unknown {sorted(unknown)}; known: {', '.join(STEPS)}")
    return AftercareConfig(
        steps=steps,
        idle_s=args.idle_seconds or preset["idle_seconds"],
        soak_s=args.soak_seconds or preset["soak_seconds"],
        soak_extra=args.soak_extra or preset["soak_extra"],
        soak_lifetime_s=args.soak_lifetime or preset["soak_lifetime_seconds"],
    )


def fleet_activity(preset_name: str, preset: dict[str, Any]) -> FleetActivity:
    """The fleet's own traffic during the runs: a kubelet's defaults (Lease every 10 s,
    status report every 5 min), three daemon pods per node, the preset's foreign GPU pods,
    and pod status in stages 1 s and 2 s apart."""
    if preset_name == "off":
        return FleetActivity()
    return FleetActivity.kubelet_defaults(
        daemon_pods_per_node=3,
        foreign_gpu_pods=preset["foreign_gpu_pods"],
        foreign_gpu_pod_lifetime_s=preset["foreign_gpu_pod_lifetime_s"],
        pod_stage_delays_s=(1.0, 2.0),
    )


def write_summary(out_dir: Path, results: dict[str, Any]) -> None:
    summary = build_summary(results)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def replot(out_dir: Path, raw_dir: Path) -> int:
    results_file = out_dir / results_io.NAME
    results = results_io.load(results_file)
    for run in results.get("runs", []):
        n = run["n"]
        found = [(run, "operator_none", raw_dir / f"n{n}-none" / "operator-profile.txt")]
        for pair in run.get("pairs") or []:
            where = raw_dir / f"n{n}" / f"pair{pair['pair']}"
            found.append((pair, "operator", where / "operator-profile.txt"))
            found.append((pair, "direct", where / "direct-profile.txt"))
        for holder, arm, prof in found:
            if arm in holder and prof.exists():
                raw = prof.read_text()
                holder[arm]["profile"] = {
                    **summarize_profile(raw),
                    "by_category": categorize_profile(raw),
                }
    results_io.save(results_file, results)
    write_summary(out_dir, results)
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
        f"no-op writes {r.get('noop_resync', {}).get('operator_writes_audit')}, "
        f"apply errors {r.get('apply_error_count')} {r.get('apply_errors', [])[:1]}"
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
