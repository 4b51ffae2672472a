"""Table-driven tests of the autoscaling policy: asks of the scale targets -> counts run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.planning.autoscaling import (
    fit_to_room,
    hold_decode_growth,
    initial_replicas,
    plan_scaling,
    scale_target_roles,
    with_hold,
    with_replicas,
)
from pdd_operator.planning.placement import Fleet, NodeFacts, fits_domain


def spec(autoscaling: dict[str, Any] | None, prefill: int = 2, decode: int = 4) -> PDDeploymentSpec:
    patch: dict[str, Any] = {
        "prefill": {"replicas": prefill, "gpusPerInstance": 2},
        "decode": {"replicas": decode, "gpusPerInstance": 2},
    }
    if autoscaling is not None:
        patch["autoscaling"] = autoscaling
    return make_pdd(patch).spec


DECODE_LEADS = {
    "decode": {"minReplicas": 1, "maxReplicas": 16},
    "prefill": {"minReplicas": 1, "maxReplicas": 6},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}
INDEPENDENT = {
    "decode": {"minReplicas": 0, "maxReplicas": 8},
    "prefill": {"minReplicas": 0, "maxReplicas": 8},
    "ratioBounds": {"minPrefillPerDecode": 0.5, "maxPrefillPerDecode": 1},
}


@pytest.mark.parametrize(
    ("autoscaling", "roles"),
    [
        (None, ()),
        (DECODE_LEADS, ("decode",)),
        ({**DECODE_LEADS, "follower": "decode"}, ("prefill",)),
        (INDEPENDENT, ("prefill", "decode")),
        ({"decode": {"maxReplicas": 4}}, ("decode",)),
    ],
)
def test_scale_targets_are_the_listed_roles_that_do_not_follow(
    autoscaling: dict[str, Any] | None, roles: tuple[str, ...]
) -> None:
    assert scale_target_roles(spec(autoscaling)) == roles


@pytest.mark.parametrize(
    ("autoscaling", "asked", "want"),
    [
        # No autoscaling: the spec's counts.
        (None, {}, {"prefill": 2, "decode": 4}),
        # Decode leads, prefill follows 1:2, rounded up, within prefill's bounds.
        (DECODE_LEADS, {"decode": 4}, {"prefill": 2, "decode": 4}),
        (DECODE_LEADS, {"decode": 5}, {"prefill": 3, "decode": 5}),
        (DECODE_LEADS, {"decode": 16}, {"prefill": 6, "decode": 16}),  # prefill at its max
        (DECODE_LEADS, {"decode": 40}, {"prefill": 6, "decode": 16}),  # decode at its max
        (DECODE_LEADS, {"decode": 1}, {"prefill": 1, "decode": 1}),
        # Before the target exists: it asks for spec.decode.replicas.
        (DECODE_LEADS, {}, {"prefill": 2, "decode": 4}),
        # Prefill leads, decode follows 2:1 the other way.
        (
            {**DECODE_LEADS, "follower": "decode", "decode": {"maxReplicas": 16}},
            {"prefill": 3},
            {"prefill": 3, "decode": 6},
        ),
        # A follower is 0 while its leader is 0, whatever its minReplicas.
        (
            {**DECODE_LEADS, "decode": {"minReplicas": 0, "maxReplicas": 8}},
            {"decode": 0},
            {"prefill": 0, "decode": 0},
        ),
        # Independent, within ratioBounds 0.5..1 prefill per decode.
        (INDEPENDENT, {"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 4}),
        (INDEPENDENT, {"prefill": 1, "decode": 6}, {"prefill": 3, "decode": 6}),  # raise P
        (INDEPENDENT, {"prefill": 5, "decode": 2}, {"prefill": 5, "decode": 5}),  # raise D
        (INDEPENDENT, {"prefill": 0, "decode": 0}, {"prefill": 0, "decode": 0}),  # zero
        (INDEPENDENT, {"prefill": 0, "decode": 1}, {"prefill": 1, "decode": 1}),
        # Raising prefill hits its max: decode is lowered instead.
        (
            {**INDEPENDENT, "prefill": {"minReplicas": 0, "maxReplicas": 2}},
            {"prefill": 2, "decode": 8},
            {"prefill": 2, "decode": 4},
        ),
        # Only decode autoscaled: prefill stays as the spec says, no ratio applied.
        (
            {"decode": {"minReplicas": 0, "maxReplicas": 8}},
            {"decode": 0},
            {"prefill": 2, "decode": 0},
        ),
    ],
)
def test_plan_scaling(
    autoscaling: dict[str, Any] | None, asked: dict[str, int], want: dict[str, int]
) -> None:
    assert dict(plan_scaling(spec(autoscaling), asked).replicas) == want


def test_every_count_stays_within_its_bounds_and_the_ratio_within_its_bounds() -> None:
    s = spec(INDEPENDENT)
    for p in range(0, 12):
        for d in range(0, 12):
            got = plan_scaling(s, {"prefill": p, "decode": d}).replicas
            assert 0 <= got["prefill"] <= 8 and 0 <= got["decode"] <= 8, (p, d, got)
            if got["prefill"] or got["decode"]:
                assert got["decode"] > 0, (p, d, got)
                assert 0.5 <= got["prefill"] / got["decode"] <= 1, (p, d, got)


def test_a_clamped_ask_says_why() -> None:
    plan = plan_scaling(spec(DECODE_LEADS), {"decode": 40})
    assert plan.notes["decode"] == "asked for 40, runs 16: spec.autoscaling maxReplicas is 16"
    plan = plan_scaling(spec(INDEPENDENT), {"prefill": 1, "decode": 6})
    assert (
        "outside spec.autoscaling.ratioBounds (0.5 to 1 prefill per decode)"
        in (plan.notes["prefill"])
    )
    assert "decode" not in plan.notes


def test_scaled_to_zero_only_when_both_roles_are_zero() -> None:
    assert plan_scaling(spec(INDEPENDENT), {"prefill": 0, "decode": 0}).scaled_to_zero
    assert not plan_scaling(spec(INDEPENDENT), {"prefill": 1, "decode": 1}).scaled_to_zero


def test_initial_replicas_are_the_spec_within_bounds() -> None:
    assert initial_replicas(spec(DECODE_LEADS, decode=4), "decode") == 4
    assert initial_replicas(spec(DECODE_LEADS, decode=40), "decode") == 16


def test_with_replicas_changes_only_the_counts() -> None:
    s = spec(DECODE_LEADS)
    assert with_replicas(s, {"prefill": 2, "decode": 4}) is s
    scaled = with_replicas(s, {"prefill": 3, "decode": 6})
    assert (scaled.prefill.replicas, scaled.decode.replicas) == (3, 6)
    assert scaled.decode.gpusPerInstance == s.decode.gpusPerInstance
    assert scaled.model_copy(update={"prefill": s.prefill, "decode": s.decode}) == s


def _gpus(counts: Mapping[str, int]) -> int:
    return 2 * (counts["prefill"] + counts["decode"])  # both roles at 2 GPUs per instance


@pytest.mark.parametrize(
    ("asked", "running", "room", "want"),
    [
        # Room for all of it: the plan as asked.
        ({"decode": 8}, {"prefill": 2, "decode": 4}, 100, {"prefill": 4, "decode": 8}),
        # 16 GPUs: decode is cut until decode + ceil(decode / 2) fits 8 instances.
        ({"decode": 8}, {"prefill": 2, "decode": 4}, 16, {"prefill": 3, "decode": 5}),
        # No room at all: what runs now stays, never less.
        ({"decode": 8}, {"prefill": 2, "decode": 4}, 0, {"prefill": 2, "decode": 4}),
        # Shrinking is never held up.
        ({"decode": 2}, {"prefill": 2, "decode": 4}, 0, {"prefill": 1, "decode": 2}),
    ],
)
def test_fit_to_room_cuts_growth_only(
    asked: dict[str, int], running: dict[str, int], room: int, want: dict[str, int]
) -> None:
    plan = fit_to_room(spec(DECODE_LEADS), asked, running, lambda c: _gpus(c) <= room, "c=a")
    assert dict(plan.replicas) == want


def test_a_cut_ask_says_where_the_room_ran_out() -> None:
    fits = lambda c: _gpus(c) <= 16  # noqa: E731
    running = {"prefill": 2, "decode": 4}
    plan = fit_to_room(spec(DECODE_LEADS), {"decode": 8}, running, fits, "clique=a")
    assert plan.notes["decode"].startswith("asked for 8, runs 5: no room for more in clique=a")


def _node(name: str, clique: str, used: int) -> NodeFacts:
    return NodeFacts(name, {"nvidia.com/gpu.clique": clique}, allocatable_gpus=8, used_gpus=used)


@pytest.mark.parametrize(
    ("reserved", "own", "fits"),
    [
        ({}, {}, True),  # 12 GPUs wanted, 12 free in clique a
        ({("nvidia.com/gpu.clique", "a"): 2}, {}, False),  # another's scale-up took 2
        ({("nvidia.com/gpu.clique", "a"): 2}, {"a-0": 4}, True),  # our own 4 count as free
    ],
)
def test_fits_domain_counts_reservations_and_own_pods(
    reserved: dict[tuple[str, str], int], own: dict[str, int], fits: bool
) -> None:
    fleet = Fleet([_node("a-0", "a", 4), _node("a-1", "a", 0), _node("b-0", "b", 0)])
    s = with_replicas(spec(DECODE_LEADS), {"prefill": 2, "decode": 4})  # 6 x 2 GPUs
    assert fits_domain(s, fleet, "nvidia.com/gpu.clique", "a", reserved, own) is fits


DEGRADED = "KVTransferVerified=False, TCPFallback: 0.5 GB/s measured, 50 GB/s expected"
PREFILL_LEADS = {
    "prefill": {"minReplicas": 1, "maxReplicas": 8},
    "decode": {"minReplicas": 0, "maxReplicas": 16},
    "follower": "decode",
    "ratio": {"prefill": 1, "decode": 2},
}


@pytest.mark.parametrize(
    ("autoscaling", "asked", "running", "problem", "counts", "cut"),
    [
        # decode leads: its growth is held at what runs, prefill follows the held count
        (DECODE_LEADS, {"decode": 8}, {"prefill": 2, "decode": 4}, DEGRADED, (2, 4), {"decode"}),
        # scaling down is never held, nor is growth while the path is verified or unmeasured
        (DECODE_LEADS, {"decode": 2}, {"prefill": 2, "decode": 4}, DEGRADED, (1, 2), set()),
        (DECODE_LEADS, {"decode": 8}, {"prefill": 2, "decode": 4}, "", (4, 8), set()),
        # nothing runs yet: the first counts are not a scale-up
        (DECODE_LEADS, {"decode": 8}, {}, DEGRADED, (4, 8), set()),
        # switched off
        (
            {**DECODE_LEADS, "kvTransferGuard": False},
            {"decode": 8},
            {"prefill": 2, "decode": 4},
            DEGRADED,
            (4, 8),
            set(),
        ),
        # decode follows prefill: prefill's growth is held where it would grow decode
        (PREFILL_LEADS, {"prefill": 4}, {"prefill": 2, "decode": 4}, DEGRADED, (2, 4), {"prefill"}),
        # independent: prefill may grow as far as ratioBounds allow at the decodes that run
        (INDEPENDENT, {"prefill": 4, "decode": 2}, {"prefill": 1, "decode": 2}, DEGRADED,
         (2, 2), {"prefill"}),
        (INDEPENDENT, {"prefill": 4, "decode": 4}, {"prefill": 2, "decode": 2}, DEGRADED,
         (2, 2), {"prefill", "decode"}),
    ],
)  # fmt: skip
def test_a_degraded_kv_path_holds_decode_growth_only(
    autoscaling: dict[str, Any],
    asked: dict[str, int],
    running: dict[str, int],
    problem: str,
    counts: tuple[int, int],
    cut: set[str],
) -> None:
    s = spec(autoscaling)
    hold = hold_decode_growth(s, asked, running, problem)
    plan = with_hold(plan_scaling(s, hold.asks), hold, asked)
    assert (plan.replicas["prefill"], plan.replicas["decode"]) == counts
    assert hold.cut == cut
    assert bool(plan.held) == bool(cut)


def test_a_held_scale_up_says_why_and_what_to_fix() -> None:
    s = spec(DECODE_LEADS)
    hold = hold_decode_growth(s, {"decode": 8}, {"prefill": 2, "decode": 4}, DEGRADED)
    plan = with_hold(plan_scaling(s, hold.asks), hold, {"decode": 8})
    assert plan.held.startswith(f"decode scale-up from 4 to 8 held: the KV transfer path is "
                                f"degraded ({DEGRADED})")  # fmt: skip
    assert "spec.autoscaling.kvTransferGuard: false" in plan.held
    assert plan.notes["decode"].startswith("asked for 8, runs 4: decode does not scale up")
    assert "prefill" not in plan.notes  # it follows: nothing was asked of it


def test_a_hold_stops_decode_growth_and_never_goes_below_standing_still() -> None:
    """Every ask and running count: the held plan runs no more decodes than run now (or than
    the roles' bounds and ratio make of the running counts), and no role fewer than the
    unheld plan or than standing still (each target asking for what its role runs) would."""
    for autoscaling in (DECODE_LEADS, PREFILL_LEADS, INDEPENDENT):
        s = spec(autoscaling)
        targets = scale_target_roles(s)
        for ask in range(0, 9):
            for run_p in range(0, 5):
                for run_d in range(0, 5):
                    asked = {role: ask for role in targets}
                    running = {"prefill": run_p, "decode": run_d}
                    free = plan_scaling(s, asked).replicas
                    still = plan_scaling(s, {r: running[r] for r in targets}).replicas
                    held = plan_scaling(s, hold_decode_growth(s, asked, running, DEGRADED).asks)
                    assert held.replicas["decode"] <= max(run_d, still["decode"])
                    for role in ("prefill", "decode"):
                        assert held.replicas[role] >= min(free[role], still[role])
