"""Which test modules a parallel run hands out first (tests/conftest.py reads this; its own
test checks every name still exists). A module of its own, since `from conftest import` is
ambiguous under pytest: tests/nixl has a conftest.py too."""

from __future__ import annotations

# Modules that run a dozen engines, sidecars and routers as processes at once. On parallel
# workers they are one unit of work, run one after another on one worker: with one per
# worker, three of them started together and overloaded two cores until pods took minutes
# to become Ready (a 3-worker clean-clone run of 984face: 4 failures, each a deployment or
# rollout that missed its 240 s). They lead LONG_MODULES, so the unit starts first.
POD_HEAVY_MODULES = (
    "tests/integration/test_autoscaling_request_path.py",
    "tests/integration/test_request_path.py",
    "tests/integration/test_refengine_routers.py",
    "tests/integration/test_routing_policies.py",
)
POD_HEAVY_UNIT = "pod-heavy modules"

# Modules that take minutes, slowest first (the per-module table the summary prints; a clean-
# clone run on 4 workers of 010c5e2: the two request paths 810-890 s, the routers' module 730 s,
# the documented commands 500 s and the image tier 420 s, all under the other workers' load).
# Under parallel workers (`make test TEST_WORKERS=N`, --dist loadfile) a module is one unit of
# work, handed out in collection order: these go first, so none is the run's tail on a worker.
LONG_MODULES = (
    *POD_HEAVY_MODULES,
    "tests/docs/test_documented_commands.py",
    "tests/integration/test_operator_image.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_autoscaling_hpa.py",
    "tests/integration/test_secrets_unread.py",
    "tests/integration/test_kv_path_boundary.py",
    "tests/integration/test_name_conflicts.py",
    "tests/integration/test_multinode.py",
)


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to on parallel workers: its module, or the one unit of
    the pod-heavy modules."""
    module = nodeid.split("::", 1)[0]
    return POD_HEAVY_UNIT if module in POD_HEAVY_MODULES else module
