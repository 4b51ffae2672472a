"""Table-driven tests of slices: the leader's count spread over domains, newest emptied first."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.planning.slices import Slice, plan_slices, slices_possible

LEVEL = "nvidia.com/gpu.clique"


def follow_half(n: int) -> int:
    """prefill follows decode at 1:2 (ceil), 0 with no decode."""
    return math.ceil(n / 2)


def room(gpus: Mapping[str, int], per_pod: int = 1) -> Any:
    """A room model: each domain holds `gpus[domain]` GPUs, every pod takes `per_pod`."""

    def fits(domain: str, counts: Mapping[str, int]) -> bool:
        return sum(counts.values()) * per_pod <= gpus.get(domain, 0)

    return fits


def slices(*spec: tuple[str, int]) -> list[Slice]:
    """Running slices from (domain, decode) pairs, prefill following at 1:2."""
    return [Slice(i, LEVEL, d, follow_half(n), n) for i, (d, n) in enumerate(spec)]


def shape(plan_slices_: Any) -> list[tuple[int, str, int, int]]:
    return [(s.index, s.domain, s.prefill, s.decode) for s in plan_slices_.slices]


@pytest.mark.parametrize(
    ("running", "wanted", "gpus", "candidates", "expected"),
    [
        # Room at home: no slice opened.
        ([("a", 2)], 4, {"a": 6, "b": 8}, ["b"], [(0, "a", 2, 4)]),
        # Home holds 6 pods (decode 4 + prefill 2); the rest opens slice 1 in b, ratio per slice.
        ([("a", 2)], 8, {"a": 6, "b": 8}, ["b"], [(0, "a", 2, 4), (1, "b", 2, 4)]),
        # Next best: the first ranked candidate that holds all the growth (b is too small).
        ([("a", 4)], 6, {"a": 6, "b": 2, "c": 3}, ["b", "c"], [(0, "a", 2, 4), (1, "c", 1, 2)]),
        # None holds all: the one holding most, then the next.
        (
            [("a", 4)],
            10,
            {"a": 6, "b": 3, "c": 6},
            ["b", "c"],
            [(0, "a", 2, 4), (1, "c", 2, 4), (2, "b", 1, 2)],
        ),
        # Growth fills slice 0, then slice 1, before slice 2 opens.
        (
            [("a", 2), ("b", 2)],
            8,
            {"a": 6, "b": 6, "c": 9},
            ["c"],
            [(0, "a", 2, 4), (1, "b", 2, 4)],
        ),
        # Shrinking empties the newest slice first ...
        ([("a", 4), ("b", 4)], 6, {"a": 6, "b": 6}, [], [(0, "a", 2, 4), (1, "b", 1, 2)]),
        # ... and removes it at 0 before slice 0 shrinks.
        ([("a", 4), ("b", 4)], 3, {"a": 6, "b": 6}, [], [(0, "a", 2, 3)]),
        # Counts never move between running slices, even where home has room again.
        ([("a", 4), ("b", 2)], 6, {"a": 60, "b": 6}, [], [(0, "a", 2, 4), (1, "b", 1, 2)]),
        # To zero: slice 0 stays, empty.
        ([("a", 4), ("b", 2)], 0, {"a": 6, "b": 6}, [], [(0, "a", 0, 0)]),
    ],
)
def test_slices_grow_in_order_and_shrink_newest_first(
    running: list[tuple[str, int]],
    wanted: int,
    gpus: Mapping[str, int],
    candidates: list[str],
    expected: list[tuple[int, str, int, int]],
) -> None:
    plan = plan_slices("decode", wanted, follow_half, slices(*running), room(gpus), candidates)
    assert shape(plan) == expected
    assert plan.note == ""
    assert plan.total("decode") == wanted


def test_growth_without_room_anywhere_is_cut_with_a_note_and_never_below_what_runs() -> None:
    plan = plan_slices("decode", 20, follow_half, slices(("a", 4)), room({"a": 6, "b": 3}), ["b"])
    assert shape(plan) == [(0, "a", 2, 4), (1, "b", 1, 2)]
    assert plan.note.startswith("asked for 20, runs 6: no room for more in nvidia.com/gpu.clique=a")
    # A slice that no longer fits its domain (capacity lost) keeps what it runs.
    plan = plan_slices("decode", 6, follow_half, slices(("a", 4)), room({"a": 2}), [])
    assert shape(plan) == [(0, "a", 2, 4)]


def test_prefill_as_leader_spreads_prefill_and_decode_follows() -> None:
    running = [Slice(0, LEVEL, "a", 2, 4)]
    plan = plan_slices("prefill", 4, lambda n: 2 * n, running, room({"a": 6, "b": 6}), ["b"])
    assert shape(plan) == [(0, "a", 2, 4), (1, "b", 2, 4)]


def test_every_plan_keeps_the_ratio_in_each_slice_and_fits_each_domain() -> None:
    gpus = {"a": 7, "b": 5, "c": 9}
    fits = room(gpus, per_pod=1)
    running = slices(("a", 2))
    for wanted in range(0, 20):
        plan = plan_slices("decode", wanted, follow_half, running, fits, ["b", "c"])
        assert [s.index for s in plan.slices] == list(range(len(plan.slices)))
        assert len({s.domain for s in plan.slices}) == len(plan.slices)
        for s in plan.slices:
            assert s.prefill == follow_half(s.decode)
            assert s.index == 0 or fits(s.domain, s.counts)
        running = list(plan.slices)  # the next ask starts from what this one runs


DECODE_LEADS = {
    "decode": {"minReplicas": 0, "maxReplicas": 16},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}


@pytest.mark.parametrize(
    ("patch", "possible"),
    [
        ({"autoscaling": DECODE_LEADS}, True),
        ({}, False),  # not autoscaled
        ({"autoscaling": {**DECODE_LEADS, "follower": "none"}}, False),  # no ratio to keep
        ({"autoscaling": DECODE_LEADS, "topology": {"placement": "none"}}, False),
        ({"autoscaling": DECODE_LEADS, "decode": {"nodesPerInstance": 2}}, False),
    ],
)
def test_slices_need_a_follower_a_placement_and_single_node_instances(
    patch: dict[str, Any], possible: bool
) -> None:
    assert slices_possible(make_pdd(patch).spec) is possible
