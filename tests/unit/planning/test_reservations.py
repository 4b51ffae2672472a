"""The placement reservation ledger (pure): what deployments planned but not yet bound hold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus
from pdd_operator.planning.placement import Fleet, NodeFacts, Placement, PlacementResult
from pdd_operator.planning.reservations import Reservation, ReservationLedger, reservation_for

CLIQUE = "nvidia.com/gpu.clique"
RACK = "topology.kubernetes.io/rack"
A, B, C, D = ("ns", "a"), ("ns", "b"), ("ns", "c"), ("ns", "d")


def spec(gpus: int = 8, placement: str = "required") -> PDDeploymentSpec:
    """One prefill and one decode instance of gpus/2 GPUs each."""
    return make_pdd(
        {
            "prefill": {"replicas": 1, "gpusPerInstance": gpus // 2},
            "decode": {"replicas": 1, "gpusPerInstance": gpus // 2},
            "topology": {"placement": placement, "levels": [CLIQUE]},
        }
    ).spec


def clique(name: str, free: int, nodes: int = 1) -> list[NodeFacts]:
    """`nodes` nodes of 8 GPUs in clique `name`, `free` GPUs free in all (first nodes first)."""
    out = []
    for i in range(nodes):
        here = max(min(free - 8 * i, 8), 0)
        out.append(NodeFacts(f"{name}-{i}", {CLIQUE: name}, 8, 8 - here))
    return out


def ledger_with(marks: Mapping[tuple[str, str], Reservation]) -> ReservationLedger:
    ledger = ReservationLedger()
    for key, mark in marks.items():
        ledger.set(key, mark)
    return ledger


def nonzero(reserved: Mapping[Any, int]) -> dict[Any, int]:
    """A zero entry and no entry mean the same to plan_placement."""
    return {where: gpus for where, gpus in reserved.items() if gpus}


@pytest.mark.parametrize(
    ("marks", "held", "key", "expected"),
    [
        pytest.param({A: Reservation(CLIQUE, "c1", 8)}, {}, A, {}, id="its-own-only"),
        pytest.param(
            {A: Reservation(CLIQUE, "c1", 8), B: Reservation(CLIQUE, "c1", 4)},
            {},
            B,
            {(CLIQUE, "c1"): 8},
            id="another-planned-slice-counts-whole",
        ),
        pytest.param(
            {A: Reservation(CLIQUE, "c1", 8)},
            {A: {"c1-0": 6}},
            B,
            {(CLIQUE, "c1"): 2},
            id="bound-pods-count-in-the-snapshot-not-here",
        ),
        pytest.param(
            {A: Reservation(CLIQUE, "c1", 8)},
            {A: {"c1-0": 8, "c1-1": 4}},
            B,
            {},
            id="fully-bound-reserves-nothing",
        ),
        pytest.param(
            {
                A: Reservation(CLIQUE, "c1", 8),
                B: Reservation(CLIQUE, "c1", 4),
                C: Reservation(CLIQUE, "c2", 6),
            },
            {B: {"c1-0": 1}},
            D,
            {(CLIQUE, "c1"): 11, (CLIQUE, "c2"): 6},
            id="summed-per-domain",
        ),
        pytest.param(
            {A: Reservation(RACK, "r1", 4), B: Reservation(CLIQUE, "r1", 2)},
            {},
            C,
            {(RACK, "r1"): 4, (CLIQUE, "r1"): 2},
            id="same-name-on-another-level-is-another-domain",
        ),
    ],
)
def test_reserved_elsewhere(
    marks: Mapping[tuple[str, str], Reservation],
    held: Mapping[tuple[str, str], Mapping[str, int]],
    key: tuple[str, str],
    expected: dict[tuple[str, str], int],
) -> None:
    fleet = Fleet(clique("c1", 16, nodes=2), held)
    assert nonzero(ledger_with(marks).reserved_elsewhere(key, fleet)) == expected


def test_sums_follow_a_changed_reservation_within_one_snapshot() -> None:
    ledger = ledger_with({A: Reservation(CLIQUE, "c1", 8)})
    fleet = Fleet(clique("c1", 16, nodes=2))
    assert nonzero(ledger.reserved_elsewhere(B, fleet)) == {(CLIQUE, "c1"): 8}
    ledger.set(C, Reservation(CLIQUE, "c1", 2))
    assert nonzero(ledger.reserved_elsewhere(B, fleet)) == {(CLIQUE, "c1"): 10}
    ledger.release(A)
    assert nonzero(ledger.reserved_elsewhere(B, fleet)) == {(CLIQUE, "c1"): 2}
    # a new snapshot in which C's pods are bound
    bound = Fleet(fleet.nodes, {C: {"c1-0": 2}})
    assert nonzero(ledger.reserved_elsewhere(B, bound)) == {}


def test_two_slices_planned_on_one_snapshot_do_not_share_free_gpus() -> None:
    ledger = ReservationLedger()
    fleet = Fleet(clique("c1", 8))
    first = ledger.place(A, spec(8), PlacementStatus(), fleet)
    second = ledger.place(B, spec(8), PlacementStatus(), fleet)
    assert (first.placed, first.placement.domain) == (True, "c1")
    assert (second.placed, second.reason) == (False, "InsufficientCapacity")
    assert ledger.get(A) == Reservation(CLIQUE, "c1", 8)
    assert ledger.get(B) is None

    ledger.release(A)  # A was deleted before its pods bound
    again = ledger.place(B, spec(8), PlacementStatus(), fleet)
    assert (again.placed, again.placement.domain) == (True, "c1")


def test_the_reservation_stands_in_for_a_status_not_written_back_yet() -> None:
    ledger = ReservationLedger()
    assert ledger.place(A, spec(8), PlacementStatus(), Fleet(clique("c1", 8))).placement.domain
    # c2 is now the best fit (fewest free GPUs that fit) and c1 still has room.
    later = Fleet([*clique("c1", 12, nodes=2), *clique("c2", 8)])
    assert ReservationLedger().place(A, spec(8), PlacementStatus(), later).placement.domain == "c2"
    assert ledger.place(A, spec(8), PlacementStatus(), later).placement.domain == "c1"


def test_a_slice_that_no_longer_fits_anywhere_gives_its_reservation_up() -> None:
    ledger = ReservationLedger()
    ledger.place(A, spec(8), PlacementStatus(), Fleet(clique("c1", 8)))
    result = ledger.place(A, spec(8), PlacementStatus(), Fleet(clique("c9", 4)))
    assert not result.placed
    assert ledger.get(A) is None


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            PlacementResult(True, Placement("required", CLIQUE, "c1"), "Placed", ""),
            Reservation(CLIQUE, "c1", 12),
        ),
        (
            PlacementResult(True, Placement("preferred", CLIQUE, "c1"), "WaitingForCapacity", ""),
            Reservation(CLIQUE, "c1", 12),
        ),
        (PlacementResult(True, Placement("none"), "PlacementDisabled", ""), None),
        (PlacementResult(False, Placement("required"), "InsufficientCapacity", ""), None),
    ],
)
def test_a_placement_reserves_its_whole_slice_in_its_domain(
    result: PlacementResult, expected: Reservation | None
) -> None:
    assert reservation_for(spec(12), result) == expected


def test_slices_reserve_their_domains_and_held_gpus_count_per_domain() -> None:
    """A deployment with a slice in c2: its pods bound in c2 free c2's reservation only; the
    home reservation in c1 still counts what c1 lacks."""
    ledger = ledger_with({A: Reservation(CLIQUE, "c1", 8)})
    ledger.set_slices(A, (Reservation(CLIQUE, "c2", 6),))
    nodes = [*clique("c1", 16, nodes=2), *clique("c2", 16, nodes=2)]
    # A's 4 GPUs bound in c2: with per-domain counting, c1 still misses all 8 of its own.
    fleet = Fleet(nodes, held={A: {"c2-0": 4}})
    assert nonzero(ledger.reserved_elsewhere(B, fleet)) == {(CLIQUE, "c1"): 8, (CLIQUE, "c2"): 2}
    assert nonzero(ledger.reserved_elsewhere(A, fleet)) == {}
    ledger.set_slices(A, ())  # the slice emptied (its pods gone): c2 is free for others again
    fleet = Fleet(nodes)
    assert nonzero(ledger.reserved_elsewhere(B, fleet)) == {(CLIQUE, "c1"): 8}
    ledger.release(A)
    assert nonzero(ledger.reserved_elsewhere(B, fleet)) == {}


MARKS = st.builds(
    Reservation, st.sampled_from([CLIQUE, RACK]), st.sampled_from(["c1", "c2"]), st.integers(0, 9)
)
CHANGES = st.lists(
    st.tuples(
        st.sampled_from([A, B, C]),
        st.one_of(
            st.tuples(st.just("set"), st.one_of(st.none(), MARKS)),
            st.tuples(st.just("slices"), st.lists(MARKS, max_size=2).map(tuple)),
            st.tuples(st.just("release"), st.none()),
            st.tuples(st.just("read"), st.none()),
            st.tuples(st.just("new snapshot"), st.none()),
        ),
    ),
    max_size=25,
)
# Snapshots in turn: pods bound between them change what each reservation still misses.
SNAPSHOTS = [
    Fleet(clique("c1", 16, nodes=2), {A: {"c1-0": 3}, B: {"c1-1": 1}}),
    Fleet(clique("c1", 16, nodes=2), {A: {"c1-0": 5}, C: {"c1-1": 2}}),
]


@given(CHANGES)
def test_sums_kept_current_through_changes_match_sums_made_afresh(
    changes: list[tuple[tuple[str, str], tuple[str, Any]]],
) -> None:
    ledger = ReservationLedger()
    home: dict[tuple[str, str], Reservation | None] = {}
    slices: dict[tuple[str, str], tuple[Reservation, ...]] = {}
    snapshot = 0
    for key, (what, value) in changes:
        if what == "set":
            ledger.set(key, value)
            home[key] = value
        elif what == "slices":
            ledger.set_slices(key, value)
            slices[key] = value
        elif what == "release":
            ledger.release(key)
            home[key], slices[key] = None, ()
        elif what == "new snapshot":
            snapshot = 1 - snapshot
        else:
            ledger.reserved_elsewhere(key, SNAPSHOTS[snapshot])  # sums kept from here on
    afresh = ReservationLedger()
    for key in (A, B, C):
        afresh.set(key, home.get(key))
        afresh.set_slices(key, slices.get(key, ()))
    fleet = SNAPSHOTS[snapshot]
    for key in (A, B, C, D):
        assert ledger.reserved_elsewhere(key, fleet) == afresh.reserved_elsewhere(key, fleet)
