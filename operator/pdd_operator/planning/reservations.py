"""Placement reservations: the GPUs a placed slice will take before its pods hold them.

A fleet snapshot counts a GPU as used once a pod is bound to it. Between a slice's placement
and the binding of its pods, a deployment planned meanwhile would count the same GPUs as free
and be placed on them too. The ledger remembers where each deployment was placed and how many
GPUs its slice needs, and hands the planner what the others reserved but do not yet hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import PDDeploymentSpec, PlacementStatus
from pdd_operator.planning.placement import Fleet, PlacementResult, plan_placement

Domain = tuple[str, str]  # (level, domain), as plan_placement's `reserved` keys them


@dataclass(frozen=True)
class Reservation:
    """Where a deployment was placed and how many GPUs its slice needs."""

    level: str
    domain: str
    needed: int

    def unbound(self, fleet: Fleet, key: DeploymentKey) -> int:
        """The GPUs of this reservation that the snapshot does not count as held by the
        deployment's own pods yet (planned, or bound after the snapshot was taken)."""
        return max(self.needed - sum(fleet.held.get(key, {}).values()), 0)


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
        # Summed over all deployments once per snapshot and reservation change, not per pass:
        # at 1,000 deployments the per-pass sum was the operator's largest own cost.
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
        if mark is None:
            del self._marks[key]
        else:
            self._marks[key] = mark
        self._totals = None

    def release(self, key: DeploymentKey) -> None:
        """The deployment is gone or places nothing: its GPUs are nobody's reservation."""
        self.set(key, None)

    def reserved_elsewhere(self, key: DeploymentKey, fleet: Fleet) -> dict[Domain, int]:
        """GPUs per domain that other deployments reserved and the snapshot does not yet count
        as held by their pods."""
        reserved = dict(self._summed(fleet))
        mine = self._marks.get(key)
        if mine is not None and (missing := mine.unbound(fleet, key)):
            reserved[(mine.level, mine.domain)] -= missing
        return reserved

    def _summed(self, fleet: Fleet) -> dict[Domain, int]:
        if self._totals is None or self._totals[0] is not fleet:
            totals: dict[Domain, int] = {}
            for other, mark in self._marks.items():
                if missing := mark.unbound(fleet, other):
                    where = (mark.level, mark.domain)
                    totals[where] = totals.get(where, 0) + missing
            self._totals = (fleet, totals)
        return self._totals[1]
