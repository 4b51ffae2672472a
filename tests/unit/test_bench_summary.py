"""bench/pddbench/summary.py: summary.json from a run's raw results (issue 16's keys); and
bench/report.py's table of the CPU each process used."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from pddbench.analysis import rss_drift_pct
from pddbench.results_file import median_view
from pddbench.summary import AFTERCARE_KEYS, build_summary, median_pair_index
from report import cpu_tables

PER_SIZE_KEYS = {
    "operator_cpu_s_per_deployment",
    "passes_per_deployment",
    "requests_per_deployment",
    "ratio_median",
    "ratio_min",
    "ratio_max",
    "converged",
    "rss_mib_peak",
    "noop_writes",
}
TOP_KEYS = {
    "commit",
    "machine",
    "startup_s_2000_nodes",
    "restart_first_reconcile_s",
    "restart_all_verified_s",
    "restart_writes",
    "idle_cpu_pct",
    "soak_rss_drift_pct",
}


def operator_arm(
    converge_s: float | None, cpu_s: float, rss: float, writes: int, n: int
) -> dict[str, Any]:
    return {
        "converged": converge_s is not None,
        "converge_s": converge_s,
        "operator_ready_s": 4.0,
        "operator_process": {"cpu_seconds_run": cpu_s, "peak_rss_mib": rss},
        "reconciles": {"per_deployment": 2.0},
        "operator_requests": {"during_run_by_verb": {"create": 5 * n, "patch": 3 * n}},
        "noop_resync": {
            "operator_writes_audit": writes,
            "operator_cpu_seconds": 1.5,
            "window_s": 30,
        },
    }


def direct_arm(converge_s: float | None, cpu_s: float) -> dict[str, Any]:
    return {
        "converged": converge_s is not None,
        "converge_s": converge_s,
        "applier_process": {"cpu_seconds_run": cpu_s},
    }


def results(pairs: list[dict[str, Any]], n: int = 10, nodes: int = 96) -> dict[str, Any]:
    return {
        "source": {"commit": "abc1234", "operator_dirty": False},
        "machine": {"cpus": 2},
        "fleet": {"nodes": nodes},
        "runs": [{"n": n, "pairs": pairs, "median_pair": median_pair_index(pairs)}],
    }


def three_pairs(n: int = 10) -> list[dict[str, Any]]:
    """Ratios 3, 2, 5 (operator 30/20/50 s against a direct 10 s)."""
    return [
        {
            "pair": 0,
            "operator": operator_arm(30.0, 4.0, 300, 0, n),
            "direct": direct_arm(10.0, 1.0),
        },
        {
            "pair": 1,
            "operator": operator_arm(20.0, 2.0, 310, 2, n),
            "direct": direct_arm(10.0, 2.0),
        },
        {
            "pair": 2,
            "operator": operator_arm(50.0, 9.0, 290, 1, n),
            "direct": direct_arm(10.0, 3.0),
        },
    ]


def test_every_key_the_issue_asks_for_is_there() -> None:
    summary = build_summary(results(three_pairs()))
    assert set(summary) >= TOP_KEYS
    assert set(summary["sizes"]["10"]) >= PER_SIZE_KEYS


def test_medians_and_spread_over_pairs() -> None:
    s = build_summary(results(three_pairs()))["sizes"]["10"]
    assert (s["ratio_median"], s["ratio_min"], s["ratio_max"]) == (3.0, 2.0, 5.0)
    assert s["operator_cpu_s_per_deployment"] == 0.4  # median of 4, 2, 9 CPU-s over 10
    assert s["operator_cpu_s_per_deployment_pairs"] == [0.4, 0.2, 0.9]
    assert s["direct_cpu_s_per_deployment"] == 0.2
    assert s["requests_per_deployment"] == 8.0
    assert s["passes_per_deployment"] == 2.0
    assert s["rss_mib_peak"] == 310 and s["noop_writes"] == 2  # the worst pair, not a median
    assert s["idle_cpu_pct"] == 5.0
    assert s["converged"] is True


def test_a_pair_that_did_not_converge_has_no_ratio_and_the_size_is_not_converged() -> None:
    pairs = three_pairs()
    pairs[2]["operator"] = operator_arm(None, 9.0, 290, 1, 10)
    s = build_summary(results(pairs))["sizes"]["10"]
    assert s["ratios"] == [3.0, 2.0]
    assert s["ratio_median"] == 2.5
    assert s["converged"] is False


def test_the_median_pair_stands_for_the_size_in_tables() -> None:
    run = results(three_pairs())["runs"][0]
    assert run["median_pair"] == 0  # ratio 3 of 2, 3, 5
    view = median_view(run)
    assert view["operator"]["converge_s"] == 30.0 and view["n"] == 10
    old_style = {"n": 5, "operator": {"converge_s": 1.0}}
    assert median_view(old_style) is old_style


@pytest.mark.parametrize(("nodes", "expected"), [(2000, 4.0), (96, None)])
def test_startup_on_2000_nodes_only_when_the_fleet_had_2000(
    nodes: int, expected: float | None
) -> None:
    summary = build_summary(results(three_pairs(), nodes=nodes))
    assert summary["startup_s_2000_nodes"] == expected
    assert summary["startup_s"] == 4.0


def test_what_no_run_measures_is_null_not_invented() -> None:
    summary = build_summary(results(three_pairs()))
    assert all(summary[k] is None for k in AFTERCARE_KEYS)
    assert summary["soak_leaked_deployments"] is None
    assert summary["idle_cpu_pct"] == 5.0  # without an idle step: the no-op window's
    empty = build_summary({"runs": []})
    assert empty["sizes"] == {} and empty["idle_cpu_pct"] is None


AFTERCARE = {
    "n": 10,
    "idle": {"window_s": 60.0, "cpu_pct": 0.0, "writes": 0},
    "restart": {"first_reconcile_s": 3.2, "all_verified_s": 7.5, "writes": 0, "rss_mib_peak": 190},
    "soak": {"duration_s": 120.0, "rss_drift_pct": 4.2, "tracked_before": 11, "tracked_after": 13},
}


def test_the_aftercare_of_the_largest_size_fills_the_restart_idle_and_soak_keys() -> None:
    small, large = three_pairs(10), three_pairs(50)
    small[0]["operator"]["aftercare"] = {"n": 10, "restart": {"writes": 99}}
    large[0]["operator"]["aftercare"] = {**AFTERCARE, "n": 50}
    doc = results(small)
    doc["runs"].append({"n": 50, "pairs": large})
    summary = build_summary(doc)
    assert summary["aftercare_n"] == 50
    assert (summary["restart_first_reconcile_s"], summary["restart_all_verified_s"]) == (3.2, 7.5)
    assert summary["restart_writes"] == 0
    assert summary["restart_rss_mib_peak"] == 190
    # A measured 0 % stands; the no-op window's figure is only for a run without the step.
    assert summary["idle_cpu_pct"] == 0.0 and summary["idle_writes"] == 0
    assert summary["soak_rss_drift_pct"] == 4.2
    assert summary["soak_leaked_deployments"] == 2


@pytest.mark.parametrize(
    ("samples", "warmup", "expected"),
    [
        # The climb during the warm-up is not drift: from 120 (t=30) to 126 is 5 %.
        ([(0, 80.0), (10, 110.0), (30, 120.0), (60, 123.0), (90, 126.0)], 30, 5.0),
        ([(0, 100.0), (40, 100.0), (80, 90.0)], 30, -10.0),  # it may shrink
        ([(0, 100.0), (10, 200.0)], 30, None),  # nothing after the warm-up
        ([(0, 100.0), (40, 200.0)], 30, None),  # one sample is no drift
        ([], 30, None),
    ],
)
def test_rss_drift_is_the_last_sample_against_the_first_after_the_warm_up(
    samples: list[tuple[float, float]], warmup: float, expected: float | None
) -> None:
    assert rss_drift_pct(samples, warmup) == expected


def test_the_cpu_table_counts_each_process_from_the_first_apply_to_convergence() -> None:
    """Samples before the first apply (t < 0) and after convergence are left out."""
    pairs = three_pairs()
    arm = pairs[0]["operator"]  # the median pair (ratio 3), converged after 30 s
    arm["series"] = {
        "proc": {
            "operator": [[-5.0, 1.0, 90], [0.0, 2.0, 90], [30.0, 5.5, 95], [40.0, 9.0, 95]],
            "kube-apiserver": [[0.0, 10.0, 900], [15.0, 20.0, 900], [29.9, 34.0, 900]],
        },
        "machine_busy": [[-1.0, 0.1], [10.0, 0.9], [20.0, 1.0], [35.0, 0.2]],
    }
    row = next(
        line for line in cpu_tables(results(pairs)).splitlines() if line.startswith("| 10 |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["10", "operator", "30.0", "3.5", "—"]
    assert cells[5] == "24.0"  # the API server: 34 - 10
    assert cells[-2:] == ["27.5", "95%"]


def busy_series(cpu_at_end: float, end: float) -> dict[str, Any]:
    """An API server and a scheduler that use `cpu_at_end` CPU-s between them by `end`, and
    a bench process whose CPU is not the machine's work for the arm."""
    half = cpu_at_end / 2
    return {
        "proc": {
            "kube-apiserver": [[0.0, 0.0, 1], [end, half, 1], [end + 20, half + 9, 1]],
            "kube-scheduler": [[0.0, 5.0, 1], [end, 5.0 + half, 1]],
            "bench": [[0.0, 0.0, 1], [end, 99.0, 1]],
        }
    }


def test_the_machine_cpu_ratio_counts_every_process_but_the_bench_until_converged() -> None:
    pairs = three_pairs()
    cpu = [(60.0, 40.0), (50.0, 50.0), (0.0, 40.0)]
    for pair, (op_cpu, direct_cpu) in zip(pairs, cpu, strict=True):
        pair["operator"]["series"] = busy_series(op_cpu, pair["operator"]["converge_s"])
        pair["direct"]["series"] = busy_series(direct_cpu, pair["direct"]["converge_s"])
    s = build_summary(results(pairs))["sizes"]["10"]
    assert s["machine_cpu_ratios"] == [1.5, 1.0, None]  # no CPU used is no ratio
    del pairs[1]["direct"]["series"]
    assert build_summary(results(pairs))["sizes"]["10"]["machine_cpu_ratios"][1] is None
