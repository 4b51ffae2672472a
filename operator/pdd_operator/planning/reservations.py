"""Placement reservations: the GPUs a placed slice will take before its pods hold them.

A fleet snapshot counts a GPU as used once a pod is bound to it. Between a slice's placement
and the binding of its pods, a deployment planned meanwhile would count the same GPUs as free
and be placed on them too. The ledger remembers where each deployment was placed and how many
GPUs its slice needs, and hands the planner what the others reserved but do not yet hold.
A deployment grown beyond its home domain (planning.slices) also reserves each further
slice's domain; the GPUs its pods hold then count per domain, so a slice's pods do not make
another slice's domain look taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.api.names import ROLES, DeploymentKey
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus
from pdd_operator.engines.base import role_spec
from pdd_operator.planning.node_facts import add_to_count
from pdd_operator.planning.placement import Fleet, PlacementResult, plan_placement
from pdd_operator.planning.slices import Slice

Domain = tuple[str, str]  # (level, domain), as plan_placement's `reserved` keys them


@dataclass(frozen=True)
class Reservation:
    """Where a deployment was placed and how many GPUs its slice needs."""

    level: str
    domain: str
    needed: int

    def unbound(self, fleet: Fleet, key: DeploymentKey, in_domain: bool = False) -> int:
        """The GPUs of this reservation that the snapshot does not count as held by the
        deployment's own pods yet (planned, or bound after the snapshot was taken); with
        `in_domain`, only its pods on the domain's nodes count (a deployment with slices)."""
        held = fleet.held.get(key, {})
        if in_domain:
            held = {
                node: gpus
                for node, gpus in held.items()
                if (facts := fleet.by_name.get(node)) is not None
                and facts.labels.get(self.level) == self.domain
            }
        return max(self.needed - sum(held.values()), 0)


def slice_reservation(spec: PDDeploymentSpec, piece: Slice) -> Reservation:
    """What a slice beyond the home domain reserves in its domain."""
    needed = sum(piece.replicas(role) * role_spec(spec, role).gpusPerInstance for role in ROLES)
    return Reservation(piece.level, piece.domain, needed)


def reservation_for(spec: PDDeploymentSpec, result: PlacementResult) -> Reservation | None:
    """What a placement reserves: nothing unless the slice was put into a domain."""
    if not result.placed or not result.placement.domain:
        return None
    needed = sum(
        role.replicas * role.nodesPerInstance * role.gpusPerInstance
        for role in (spec.prefill, spec.decode)
    )
    return Reservation(result.placement.level, result.placement.domain, needed)


class ReservationLedger:
    """Every deployment's reservation, and their sums per domain for one fleet snapshot."""

    def __init__(self) -> None:
        self._marks: dict[DeploymentKey, Reservation] = {}
        # The reservations of slices beyond the home domain, per deployment that has any.
        self._slices: dict[DeploymentKey, tuple[Reservation, ...]] = {}
        # Summed over all deployments once per snapshot, not per pass (at 1,000 deployments
        # the per-pass sum was the operator's largest own cost), and kept current as one
        # deployment's reservations change (re-summing then made placing N deployments N²).
        self._totals: tuple[Fleet, dict[Domain, int]] | None = None

    def place(
        self,
        key: DeploymentKey,
        spec: PDDeploymentSpec,
        previous: PlacementStatus,
        fleet: Fleet,
        unschedulable: bool = False,
    ) -> PlacementResult:
        """Plan the slice against the fleet less the others' reservations, and reserve the
        domain it was given (or release the old one when it got none)."""
        mine = self._marks.get(key)
        if mine is not None and not previous.domain:  # its status was not written back yet
            previous = previous.model_copy(update={"level": mine.level, "domain": mine.domain})
        reserved = self.reserved_elsewhere(key, fleet)
        own = fleet.held.get(key, {})
        result = plan_placement(spec, fleet, previous, reserved, own, unschedulable)
        self.set(key, reservation_for(spec, result))
        return result

    def get(self, key: DeploymentKey) -> Reservation | None:
        return self._marks.get(key)

    def set(self, key: DeploymentKey, mark: Reservation | None) -> None:
        if self._marks.get(key) == mark:
            return
        self._count(key, -1)
        if mark is None:
            del self._marks[key]
        else:
            self._marks[key] = mark
        self._count(key, +1)

    def release(self, key: DeploymentKey) -> None:
        """The deployment is gone or places nothing: its GPUs are nobody's reservation."""
        self.set(key, None)
        self.set_slices(key, ())

    def set_slices(self, key: DeploymentKey, marks: tuple[Reservation, ...]) -> None:
        """Reserve the domains of the deployment's slices beyond its home (none: release)."""
        if self._slices.get(key, ()) == marks:
            return
        self._count(key, -1)
        if marks:
            self._slices[key] = marks
        else:
            self._slices.pop(key, None)
        self._count(key, +1)

    def _count(self, key: DeploymentKey, sign: int) -> None:
        """Add (+1) or take back (-1) the deployment's share of the current sums."""
        if self._totals is None:
            return
        fleet, totals = self._totals
        for where, missing in self._unbound(key, fleet):
            add_to_count(totals, where, sign * missing)

    def _unbound(self, key: DeploymentKey, fleet: Fleet) -> list[tuple[Domain, int]]:
        """Per domain, the GPUs the deployment reserved that its pods do not hold yet."""
        return [
            ((mark.level, mark.domain), missing)
            for mark, in_domain in self._all_marks(key)
            if (missing := mark.unbound(fleet, key, in_domain))
        ]

    def _all_marks(self, key: DeploymentKey) -> list[tuple[Reservation, bool]]:
        """The deployment's reservations, each with whether its held GPUs count per domain."""
        sliced = key in self._slices
        home = self._marks.get(key)
        marks = [(home, sliced)] if home is not None else []
        return marks + [(mark, True) for mark in self._slices.get(key, ())]

    def reserved_elsewhere(self, key: DeploymentKey, fleet: Fleet) -> dict[Domain, int]:
        """GPUs per domain that other deployments reserved and the snapshot does not yet count
        as held by their pods."""
        reserved = dict(self._summed(fleet))
        for where, missing in self._unbound(key, fleet):
            reserved[where] -= missing
        return reserved

    def _summed(self, fleet: Fleet) -> dict[Domain, int]:
        if self._totals is None or self._totals[0] is not fleet:
            totals: dict[Domain, int] = {}
            for other in {*self._marks, *self._slices}:
                for where, missing in self._unbound(other, fleet):
                    totals[where] = totals.get(where, 0) + missing
            self._totals = (fleet, totals)
        return self._totals[1]
