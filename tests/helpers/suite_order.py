"""Which test modules a parallel run hands out first (tests/conftest.py reads this; its own
test checks every name still exists). A module of its own, since `from conftest import` is
ambiguous under pytest: tests/nixl has a conftest.py too."""

from __future__ import annotations

# Modules that take minutes, slowest first (the per-module table this summary prints: clean-
# clone runs of 9d5711f and 647d6a0 put the two request paths at 390-670 s and the CD health
# table, with its Go build on a fresh machine, at about 420 s). Under parallel workers
# (`make test TEST_WORKERS=N`, --dist loadfile) a module is one unit of work, handed out in
# collection order: these go first, so none of them is the run's tail on a single worker.
LONG_MODULES = (
    "tests/integration/test_autoscaling_request_path.py",
    "tests/integration/test_request_path.py",
    "tests/integration/test_cd_health.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_refengine_routers.py",
    "tests/integration/test_autoscaling_hpa.py",
    "tests/integration/test_multinode.py",
)
