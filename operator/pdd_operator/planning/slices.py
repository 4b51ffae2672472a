"""Slices (pure): an autoscaled deployment that outgrows its topology domain grows by a slice
in the next best domain (docs/autoscaling.md, "Slices").

A slice is a group of prefill and decode pods inside one domain, paired only among
themselves (one router per slice). Slice 0 is the deployment's home: the domain placement
gave it, its StatefulSets named as they always were. When the scale target asks for more
than the domains in use have room for, slice 1 is opened in the next best domain of the same
level (the ranking placement uses: fewest free GPUs that still hold the growth), and so on.

The leader's count (the role with the scale target) is what is spread over the slices; each
slice runs the follower at the ratio on its own count, so every slice keeps the P:D split and
a prefill always has a decode of its own slice to hand KV blocks to. Growth fills the slices
in index order before a new one is opened; shrinking empties the newest slice first, and a
slice at 0 is removed. Counts of running slices never move from one slice to another: that
would replace running pods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pdd_operator.api.names import ROLES
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import role_spec
from pdd_operator.planning.autoscaling import (
    ScalingPlan,
    follower_replicas,
    leader_role,
    with_replicas,
)
from pdd_operator.planning.placement import Fleet, fits_domain, ranked_domains

# Whether the slice's counts {role: replicas} fit the domain, its own pods counted free and
# other deployments' reservations taken off.
Fits = Callable[[str, Mapping[str, int]], bool]
# Slice names end in `-s<index>`: two digits keep `<id>-prefill-s99` within a StatefulSet
# name's 52 characters.
MAX_SLICES = 100


@dataclass(frozen=True)
class Slice:
    """One slice: its index (0 is the home), the domain its pods are pinned to and its counts."""

    index: int
    level: str
    domain: str
    prefill: int
    decode: int

    def replicas(self, role: str) -> int:
        return self.prefill if role == "prefill" else self.decode

    @property
    def counts(self) -> dict[str, int]:
        return {"prefill": self.prefill, "decode": self.decode}


@dataclass(frozen=True)
class SlicePlan:
    """The slices to run, slice 0 first, and why the leader runs fewer than asked (or "")."""

    slices: tuple[Slice, ...]
    note: str = ""

    def total(self, role: str) -> int:
        return sum(s.replicas(role) for s in self.slices)


def slices_possible(spec: PDDeploymentSpec) -> bool:
    """Whether the deployment may grow beyond its home domain: autoscaled with a follower
    (the P:D ratio that each slice keeps), placed into a domain, and instances of one node
    each (an instance over several nodes is a StatefulSet of its own; not sliced)."""
    auto = spec.autoscaling
    return (
        auto is not None
        and auto.follower != "none"
        and spec.topology.placement != "none"
        and all(role_spec(spec, role).nodesPerInstance == 1 for role in ("prefill", "decode"))
    )


def scale_by_slices(
    spec: PDDeploymentSpec,
    plan: ScalingPlan,
    running: Sequence[Slice],
    fleet: Fleet,
    reserved: Mapping[tuple[str, str], int],
    own: Mapping[str, int],
) -> tuple[ScalingPlan, SlicePlan]:
    """The scaling plan (totals per role, what the scale targets show) and its slices, for a
    deployment whose slices `running` run now (slice 0 first). Room is counted in each domain
    as placement counts it: its free GPUs, the deployment's own pods' counted free, less what
    other deployments reserved there (`reserved`)."""
    leader = leader_role(spec)
    level = running[0].level

    def fits(domain: str, counts: Mapping[str, int]) -> bool:
        return fits_domain(with_replicas(spec, counts), fleet, level, domain, reserved, own)

    wanted = plan.replicas[leader]
    grows = wanted > sum(s.replicas(leader) for s in running)
    candidates = ranked_domains(spec, fleet, level, own) if grows else []
    sliced = plan_slices(
        leader, wanted, lambda n: follower_replicas(spec, n), running, fits, candidates
    )
    notes = dict(plan.notes)
    if sliced.note:
        notes[leader] = sliced.note
    totals = {role: sliced.total(role) for role in ROLES}
    return ScalingPlan(totals, notes), sliced


def plan_slices(
    leader: str,
    wanted: int,
    follow: Callable[[int], int],
    running: Sequence[Slice],
    fits: Fits,
    candidates: Sequence[str],
) -> SlicePlan:
    """Spread `wanted` pods of the `leader` role over the `running` slices (slice 0 first,
    never empty) and new slices in `candidates` (the level's other domains, best first);
    `follow` gives a slice's follower count for its leader count."""
    home = running[0]
    counts = [s.replicas(leader) for s in running]
    domains = [s.domain for s in running]
    have = sum(counts)
    if wanted <= have:
        _shrink_newest_first(counts, have - wanted)
    else:
        left = _grow_in_order(leader, follow, fits, domains, counts, wanted - have)
        free = [d for d in candidates if d not in domains]
        while left and free and len(domains) < MAX_SLICES:
            domain, take = _next_domain(leader, follow, fits, free, left)
            if take == 0:
                break
            free.remove(domain)
            domains.append(domain)
            counts.append(take)
            left -= take
    slices = tuple(
        _slice(leader, follow, index, home.level, domain, n)
        for index, (domain, n) in enumerate(zip(domains, counts, strict=True))
        if index == 0 or n > 0
    )
    plan = SlicePlan(slices)
    got = plan.total(leader)
    if got < wanted:
        plan = SlicePlan(
            slices,
            f"asked for {wanted}, runs {got}: no room for more in {home.level}={home.domain} "
            f"or another {home.level} domain (raise capacity or lower the ask)",
        )
    return plan


def _shrink_newest_first(counts: list[int], excess: int) -> None:
    for index in reversed(range(len(counts))):
        take = min(excess, counts[index])
        counts[index] -= take
        excess -= take


def _grow_in_order(
    leader: str,
    follow: Callable[[int], int],
    fits: Fits,
    domains: Sequence[str],
    counts: list[int],
    growth: int,
) -> int:
    """Add to the slices in index order as far as each domain has room; what is left."""
    for index, domain in enumerate(domains):
        if growth == 0:
            break
        add = _most_that_fits(leader, follow, fits, domain, counts[index], growth)
        counts[index] += add
        growth -= add
    return growth


def _next_domain(
    leader: str, follow: Callable[[int], int], fits: Fits, free: Sequence[str], growth: int
) -> tuple[str, int]:
    """Where the next slice opens: the first (best ranked) domain that holds all the growth,
    else the one that holds the most of it (the earlier on a tie)."""
    best = (free[0], 0)
    for domain in free:
        take = _most_that_fits(leader, follow, fits, domain, 0, growth)
        if take == growth:
            return domain, take
        if take > best[1]:
            best = (domain, take)
    return best


def _most_that_fits(
    leader: str,
    follow: Callable[[int], int],
    fits: Fits,
    domain: str,
    have: int,
    growth: int,
) -> int:
    """The most of `growth` the slice in `domain` (at `have` now) takes with room: a binary
    search, as room only shrinks with more pods."""
    low, high = 0, growth
    while low < high:
        mid = (low + high + 1) // 2
        if fits(domain, _counts(leader, have + mid, follow)):
            low = mid
        else:
            high = mid - 1
    return low


def _counts(leader: str, n: int, follow: Callable[[int], int]) -> dict[str, int]:
    follower = "prefill" if leader == "decode" else "decode"
    return {leader: n, follower: follow(n)}


def _slice(
    leader: str, follow: Callable[[int], int], index: int, level: str, domain: str, n: int
) -> Slice:
    counts = _counts(leader, n, follow)
    return Slice(index, level, domain, counts["prefill"], counts["decode"])
