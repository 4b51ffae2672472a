"""bench/pddbench/apiserver_profile.py: `go tool pprof -traces` output read into CPU-s by
work; the summary's and the report's view of it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from pddbench.apiserver_profile import WORK_RULES, classify, parse_traces
from pddbench.summary import build_summary, median_pair_index
from report import apiserver_profile_tables

# The layout pprof's printTraces writes: a header, then per sample a separator, its labels,
# and its stack from leaf to root with the value on the first line.
TRACES = """\
File: kube-apiserver
Type: cpu
Duration: 3s, Total samples = 1.27s (42.33%)
-----------+-------------------------------------------------------
      20ms   github.com/google/cel-go/interpreter.(*evalAnd).Eval
             k8s.io/apiserver/pkg/admission/plugin/policy/validating.(*dispatcher).Dispatch
             k8s.io/apiserver/pkg/endpoints/handlers.(*patcher).patchResource
             k8s.io/apiserver/pkg/endpoints/handlers.PatchResource.func1
-----------+-------------------------------------------------------
   service:  apiserver
      1.20s   encoding/json.(*encodeState).marshal
             k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP
-----------+-------------------------------------------------------
      50ms   runtime.scanobject
             runtime.gcDrain
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
"""


def test_each_sample_is_read_with_its_value_and_its_stack_leaf_first() -> None:
    stacks = list(parse_traces(TRACES))
    assert [round(v, 3) for v, _ in stacks] == [0.02, 1.2, 0.05]
    assert stacks[0][1][0] == "github.com/google/cel-go/interpreter.(*evalAnd).Eval"
    assert stacks[0][1][-1].endswith("PatchResource.func1")
    assert all("service:" not in frame for _, frames in stacks for frame in frames)


def test_a_sample_is_put_under_the_most_specific_work_its_stack_shows() -> None:
    cel, watch, gc = (frames for _, frames in parse_traces(TRACES))
    assert classify(cel, WORK_RULES) == "admission policies (CEL)"  # not "patch"
    assert classify(watch, WORK_RULES) == "watch: events to watchers"  # not "encode"
    assert classify(gc, WORK_RULES) == "garbage collection"
    assert classify(["main.main"], WORK_RULES) == "other"


def arm(converge_s: float, profile_cpu_s: float) -> dict[str, object]:
    return {
        "converged": True,
        "converge_s": converge_s,
        "apiserver_profile": {
            "cpu_s": profile_cpu_s,
            "by_work_s": {"watch: events to watchers": profile_cpu_s / 2},
        },
    }


def test_the_summary_and_the_report_show_both_arms_of_the_median_pair() -> None:
    pairs = [
        {"pair": i, "operator": arm(op_s, op_s), "direct": arm(10.0, 10.0 + i)}
        for i, op_s in enumerate((30.0, 20.0, 50.0))
    ]
    run = {"n": 10, "pairs": pairs, "median_pair": median_pair_index(pairs)}
    summary = build_summary({"source": {}, "machine": {}, "fleet": {}, "runs": [run]})
    profile = summary["sizes"]["10"]["apiserver_profile"]
    assert profile["operator"]["cpu_s"] == 30.0  # ratio 3 of 2, 3, 5: pair 0
    assert profile["direct"]["cpu_s"] == 10.0
    table = apiserver_profile_tables({"runs": [run]})
    assert "| all | 30.0 | 10.0 |" in table
    assert "| watch: events to watchers | 15.0 | 5.0 |" in table
