"""Walk one reconcile pass down its calls and count the rooms it visits (issue 42).

A room is a module of the operator (``--rooms modules``) or a package (``--rooms packages``:
``pdd_operator.reconcile``, ``pdd_operator.planning``, ...). Every call into the operator's
code is a step; consecutive steps in the same room are one stay. A stay in a room the walk
had already left is a return. Nothing is timed: the counts depend only on the code.

The pass is the first pass of the suite's sample deployment (placed in a domain, the router
on) against tests/helpers/fake_cluster.py, the test double of the operator's own two ports;
``--pass second`` walks the pass after the children exist and are ready (the steady state).
Only calls within ``--depth`` calls of the pass's entry are steps (default 2: the parts the
pass runs and what they call), so the leaves of rendering and status do not drown the shape.

    .venv/bin/python bench/pass_walk.py [--rooms modules|packages] [--pass first|second]
        [--depth N] [--stays]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from helpers.factories import BASE_BODY  # noqa: E402
from helpers.fake_cluster import FakeCluster, reconciler_for  # noqa: E402
from pdd_operator.planning.placement import Fleet, NodeFacts  # noqa: E402

KEY = ("team-a", "llama")
LEVEL = "nvidia.com/gpu.clique"


def sample() -> dict[str, Any]:
    body = copy.deepcopy(BASE_BODY)
    body["metadata"].update(resourceVersion="1")
    body["spec"]["topology"] = {"placement": "required", "levels": [LEVEL]}
    return body


def room_of(module: str, rooms: str) -> str:
    if rooms == "packages":
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else module
    return module


ENTRY = "_converge"  # the pass, once the spec parsed (Reconciler._converge)


def depth_below_entry(frame: FrameType | None, package: str) -> int | None:
    """How many of the package's frames lie between this call and the pass's entry (1: the
    entry calls it), None outside the pass. A resumed coroutine's frames chain through the
    coroutines awaiting it, so a part awaited by the entry still counts from the entry."""
    depth = 0
    while frame is not None:
        if frame.f_code.co_name == ENTRY and frame.f_globals.get("__name__", "").startswith(
            package + "."
        ):
            return depth
        if frame.f_globals.get("__name__", "").startswith(package + "."):
            depth += 1
        frame = frame.f_back
    return None


@contextmanager
def calls_into(package: str, max_depth: int, steps: list[str]) -> Iterator[None]:
    """Record the module of every call into ``package`` within ``max_depth`` calls of the
    pass's entry (the libraries' calls are not steps; worker threads are not followed)."""

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(package + "."):
            return
        depth = depth_below_entry(frame.f_back, package)
        if depth is not None and depth < max_depth:
            steps.append(module)

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def walk(steps: list[str], rooms: str) -> dict[str, Any]:
    stays: list[str] = []
    for module in steps:
        room = room_of(module, rooms)
        if not stays or stays[-1] != room:
            stays.append(room)
    returns = sum(1 for i, room in enumerate(stays) if room in stays[:i])
    return {
        "steps": len(steps),
        "stays": len(stays),
        "rooms": len(set(stays)),
        "returns": returns,
        "first_stays": stays[:40],
    }


async def one_pass(which: str, max_depth: int) -> list[str]:
    cluster = FakeCluster(sample())
    cluster.fleet_snapshot = Fleet(NodeFacts(f"node-{i}", {LEVEL: "a"}, 8, 0) for i in range(2))
    rec = reconciler_for(cluster)
    if which == "second":
        await rec.reconcile(KEY)
        cluster.deliver_pdd_watch()
        cluster.workloads_ready("team-a")
    steps: list[str] = []
    with calls_into("pdd_operator", max_depth, steps):
        await rec.reconcile(KEY)
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", choices=("modules", "packages"), default="modules")
    parser.add_argument("--pass", dest="which", choices=("first", "second"), default="first")
    parser.add_argument("--depth", type=int, default=2, help="calls below the entry (2)")
    parser.add_argument("--stays", action="store_true", help="print the first 40 stays too")
    args = parser.parse_args()
    steps = asyncio.run(one_pass(args.which, args.depth))
    result = walk(steps, args.rooms)
    if not args.stays:
        result.pop("first_stays")
    header = {"rooms_are": args.rooms, "pass": args.which, "depth": args.depth}
    print(json.dumps({**header, **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
