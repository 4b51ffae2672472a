"""Where a run's time goes (issue 39): at its end, pytest prints the wall time of each tier
(the tests/ subfolders), of the steps `make test` ran before pytest (PDD_MAKE_STEPS_MS), and
the slowest modules, so every change to the suite's speed shows its effect."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

import pytest

from helpers.suite_order import LONG_MODULES, work_unit

SLOWEST_MODULES = 15


class RunTimes:
    """Aggregates pytest's own per-phase durations by module and by tier."""

    def __init__(self) -> None:
        self.started = time.time()
        self.module_s: defaultdict[str, float] = defaultdict(float)
        self.tier_span: dict[str, tuple[float, float]] = {}
        self.tier_tests: defaultdict[str, set[str]] = defaultdict(set)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::")[0]  # tests/<tier>/.../test_x.py
        parts = module.split("/")
        tier = parts[1] if parts[0] == "tests" and len(parts) > 2 else parts[0]
        self.module_s[module] += report.duration
        self.tier_tests[tier].add(report.nodeid)
        # A tier's wall time is first start to last stop: pytest runs a folder's tests
        # together, and this counts the gaps between them too. Session fixtures (the
        # integration control plane) are torn down in the last test's teardown, so their
        # stop counts in the last tier that ran.
        first, last = self.tier_span.get(tier, (report.start, report.stop))
        self.tier_span[tier] = (min(first, report.start), max(last, report.stop))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.module_s:
            return
        write = terminalreporter.write_line
        terminalreporter.write_sep("-", "wall time per step and tier")
        write(f"{'step or tier':<16}{'tests':>8}{'seconds':>10}")
        for step, ms in _make_steps():
            write(f"{step + ' (make)':<16}{'-':>8}{ms / 1000:>10.1f}")
        for tier, (first, last) in sorted(self.tier_span.items(), key=lambda kv: kv[1][0]):
            write(f"{tier:<16}{len(self.tier_tests[tier]):>8}{last - first:>10.1f}")
        tests = sum(len(ids) for ids in self.tier_tests.values())
        write(f"{'pytest in all':<16}{tests:>8}{time.time() - self.started:>10.1f}")
        terminalreporter.write_sep("-", f"{SLOWEST_MODULES} slowest modules (setup+call+teardown)")
        slowest = sorted(self.module_s.items(), key=lambda kv: kv[1], reverse=True)
        for module, seconds in slowest[:SLOWEST_MODULES]:
            write(f"{seconds:>8.1f}  {module}")


def _make_steps() -> list[tuple[str, int]]:
    """The Makefile's timed steps: "lint=41234,other=12" in milliseconds."""
    raw = os.environ.get("PDD_MAKE_STEPS_MS", "")
    steps = [item.split("=", 1) for item in raw.split(",") if "=" in item]
    return [(name, int(ms)) for name, ms in steps]


def pytest_configure(config: pytest.Config) -> None:
    # A plugin object, not module globals: its tables live and die with this run's config.
    config.pluginmanager.register(RunTimes(), "pdd-run-times")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On parallel workers only: the long modules first, each module's tests kept together
    and in their order (a stable sort by module). A sequential run keeps pytest's order, which
    runs the quick tiers first and so fails fast."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first = {module: rank for rank, module in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; absent without the plugin
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (make test TEST_WORKERS=N), with the pod-heavy modules as one unit
    of work (helpers.suite_order) instead of one unit each."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PodHeavyModulesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return PodHeavyModulesTogether(config, log)
