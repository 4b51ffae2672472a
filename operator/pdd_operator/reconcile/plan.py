"""The plan of one pass, decided by one pure function (`plan_pass`) from the spec, the
cluster view and what earlier passes left (the deployment's record, the reservation ledger,
both only read): the counts to run (scale targets, slices), the placement, and the render
context. `commit` then writes the ledger and the record once, from the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.planning.autoscaling import (
    ScalingPlan,
    fit_to_room,
    hold_decode_growth,
    plan_scaling,
    with_hold,
    with_replicas,
)
from pdd_operator.planning.placement import Fleet, PlacementResult, fits_domain, plan_placement
from pdd_operator.planning.probe_pairs import per_rank_probes
from pdd_operator.planning.reservations import (
    Domain,
    Reservation,
    ReservationLedger,
    reservation_for,
    slice_reservation,
)
from pdd_operator.planning.rollout import rollout_partitions, serving_revision
from pdd_operator.planning.slices import Slice, scale_by_slices, slices_possible
from pdd_operator.reconcile.memory import DeploymentRecord
from pdd_operator.reconcile.ports import ClusterView, key_of
from pdd_operator.reconcile.workloads import slice_of
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.rendering.roles import engine_revision
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary
from pdd_operator.status.transfer import (
    TransferOutcome,
    prober,
    rank_probers,
    rank_transfer_outcome,
    transfer_outcome,
)


class Reservations(Protocol):
    """What the plan reads of the reservation ledger (it writes nothing)."""

    def get(self, key: DeploymentKey) -> Reservation | None: ...
    def reserved_elsewhere(self, key: DeploymentKey, fleet: Fleet) -> dict[Domain, int]: ...


@dataclass(frozen=True)
class Scaling:
    """The counts a pass runs: per role in all (what the scale targets show) and, for a
    deployment that may grow by slices, per slice (home first; empty otherwise)."""

    plan: ScalingPlan
    slices: tuple[Slice, ...] = ()

    @property
    def home(self) -> Mapping[str, int]:
        """The counts of the home slice: what the spec says from here on (its StatefulSets)."""
        return self.slices[0].counts if self.slices else self.plan.replicas


@dataclass(frozen=True)
class SlicesUpdate:
    """The slices beyond the home domain, to remember (None: none known) and reserve."""

    remembered: tuple[Slice, ...] | None
    marks: tuple[Reservation, ...]


NO_SLICES = SlicesUpdate(None, ())


@dataclass(frozen=True)
class PassPlan:
    pdd: PDDeployment  # its spec at the home slice's counts
    transfer: TransferOutcome | None  # the KV path's verdict: the scaling guard, the status
    scaling: Scaling
    placement: PlacementResult
    context: RenderContext
    home_mark: Reservation | None  # the home domain's reservation
    slices: SlicesUpdate | None  # None: the slices stay as they are


def plan_pass(
    pdd: PDDeployment,
    view: ClusterView,
    observed: Mapping[ChildKey, ChildSummary],
    record: DeploymentRecord,
    reservations: Reservations,
    settings: OperatorSettings,
) -> PassPlan:
    """From here on the spec says the counts being run: what the scale targets ask for,
    within spec.autoscaling's bounds and ratio (the spec's own counts without it); the home
    slice's counts, that is: slices beyond it are rendered from the scaling's slices."""
    fleet = view.fleet()
    transfer = pass_transfer_outcome(pdd, view.pods(key_of(pdd)))
    problem = kv_path_problem(transfer)
    scaling, slices = _scaling(pdd, view, record, reservations, fleet, problem)
    pdd = pdd.model_copy(update={"spec": with_replicas(pdd.spec, scaling.home)})
    placement, home_mark = _place(pdd, view, reservations, fleet)
    if pdd.spec.topology.placement == "none":
        slices = NO_SLICES
    context = _render_context(pdd, view, observed, placement, settings, scaling.slices[1:])
    return PassPlan(pdd, transfer, scaling, placement, context, home_mark, slices)


def commit(plan: PassPlan, record: DeploymentRecord, ledger: ReservationLedger) -> None:
    """Write what the plan decided into the memory: reservations and the slices."""
    key = key_of(plan.pdd)
    if plan.slices is not None:
        record.slices = plan.slices.remembered
        ledger.set_slices(key, plan.slices.marks)
    ledger.set(key, plan.home_mark)


def pass_transfer_outcome(pdd: PDDeployment, pods: Sequence[PodSummary]) -> TransferOutcome | None:
    """The one prober's verdict, or every prefill rank's where instances span nodes."""
    if per_rank_probes(pdd):
        return rank_transfer_outcome(pdd, rank_probers(pdd, pods))
    return transfer_outcome(pdd, prober(pods, pdd.name, pdd.spec.prefill.nodesPerInstance))


def kv_path_problem(outcome: TransferOutcome | None) -> str:
    """How the KV path is degraded, from the prober pods' latest answers (the source of
    KVTransferVerified: every prefill rank's where instances span nodes); "" while it is
    verified or not measured yet."""
    if outcome is None or outcome.ok is not False:
        return ""
    measured = outcome.status
    return (
        f"KVTransferVerified=False, {outcome.reason}: {measured.measuredGBps:g} GB/s "
        f"measured, {measured.expectedGBps:g} GB/s expected"
    )


def _scaling(
    pdd: PDDeployment,
    view: ClusterView,
    record: DeploymentRecord,
    reservations: Reservations,
    fleet: Fleet,
    kv_path_problem: str,
) -> tuple[Scaling, SlicesUpdate | None]:
    """The counts to run, from what the deployment's scale targets ask for."""
    if pdd.spec.autoscaling is None:
        return Scaling(plan_scaling(pdd.spec, {})), None
    key = key_of(pdd)
    asked = {role: s.replicas for role, s in view.scalers(key).items()}
    domain = _placed_domain(pdd, reservations)
    running, home, further = _running(pdd, view, record, domain)
    # The KV-path guard holds decode at what runs in all slices together.
    total = {role: n + sum(s.replicas(role) for s in further) for role, n in running.items()}
    hold = hold_decode_growth(pdd.spec, asked, total, kv_path_problem)
    plan = plan_scaling(pdd.spec, hold.asks)
    if domain is None or len(running) < len(names.ROLES):
        return Scaling(with_hold(plan, hold, asked)), NO_SLICES  # the planner's first job
    grows = any(plan.replicas[role] > running.get(role, 0) for role in names.ROLES)
    if home is None and not grows:
        return Scaling(with_hold(plan, hold, asked)), None  # nothing to find room for
    reserved = reservations.reserved_elsewhere(key, fleet)
    own = fleet.held.get(key, {})
    if home is not None:
        plan, sliced = scale_by_slices(pdd.spec, plan, [home, *further], fleet, reserved, own)
        marks = tuple(slice_reservation(pdd.spec, piece) for piece in sliced.slices[1:])
        scaling = Scaling(with_hold(plan, hold, asked), sliced.slices)
        return scaling, SlicesUpdate(sliced.slices, marks)

    def fits(counts: Mapping[str, int]) -> bool:
        spec = with_replicas(pdd.spec, counts)
        return fits_domain(spec, fleet, domain[0], domain[1], reserved, own)

    fitted = fit_to_room(pdd.spec, hold.asks, running, fits, f"{domain[0]}={domain[1]}")
    return Scaling(with_hold(fitted, hold, asked)), None


def _running(
    pdd: PDDeployment,
    view: ClusterView,
    record: DeploymentRecord,
    domain: tuple[str, str] | None,
) -> tuple[dict[str, int], Slice | None, list[Slice]]:
    """What runs per role in the home slice's StatefulSets and, for a deployment that may
    grow by slices and is placed, the home slice and the slices running beyond it."""
    running = {
        s.role: s.workload.desired
        for s in view.children(key_of(pdd)).values()
        if s.key[1] == "StatefulSet"
        and s.workload is not None
        and s.role
        and slice_of(pdd, s.key[2]) == 0
    }
    if domain is None or not slices_possible(pdd.spec):
        return running, None, []
    known = _known_slices(pdd, record)
    if known:
        # A home StatefulSet missing (deleted by hand, not indexed yet) runs what the
        # last plan gave it: the slices beyond it are kept, never pruned for that.
        running = {role: running.get(role, known[0].replicas(role)) for role in names.ROLES}
    if len(running) < len(names.ROLES):
        return running, None, []
    home = Slice(0, domain[0], domain[1], running["prefill"], running["decode"])
    further = [s for s in known[1:] if s.level == home.level and s.domain != home.domain]
    return running, home, further


def _known_slices(pdd: PDDeployment, record: DeploymentRecord) -> tuple[Slice, ...]:
    """The slices that run now, home first: as the last pass planned them, or as
    status.slices says after a restart of the operator (empty: none known)."""
    if record.slices is not None:
        return record.slices
    return tuple(Slice(**s.model_dump()) for s in pdd.status.slices)


def _placed_domain(pdd: PDDeployment, reservations: Reservations) -> tuple[str, str] | None:
    """(level, domain) the slice runs in; None when it is not placed in one."""
    if pdd.spec.topology.placement == "none":
        return None
    mark = reservations.get(key_of(pdd))
    if mark is not None:
        return mark.level, mark.domain
    placed = pdd.status.placement
    return (placed.level, placed.domain) if placed.domain else None


def _place(
    pdd: PDDeployment, view: ClusterView, reservations: Reservations, fleet: Fleet
) -> tuple[PlacementResult, Reservation | None]:
    """The placement against the fleet less the others' reservations, and the domain it
    reserves (None: none, or nothing placed)."""
    if pdd.spec.topology.placement == "none":
        return plan_placement(pdd.spec, (), pdd.status.placement), None
    key = key_of(pdd)
    previous = pdd.status.placement
    mine = reservations.get(key)
    if mine is not None and not previous.domain:  # its status was not written back yet
        previous = previous.model_copy(update={"level": mine.level, "domain": mine.domain})
    refused = any(
        p.problem is not None and p.problem.reason == "Unschedulable" for p in view.pods(key)
    )
    reserved = reservations.reserved_elsewhere(key, fleet)
    own = fleet.held.get(key, {})
    result = plan_placement(pdd.spec, fleet, previous, reserved, own, refused)
    return result, reservation_for(pdd.spec, result)


def _render_context(
    pdd: PDDeployment,
    view: ClusterView,
    observed: Mapping[ChildKey, ChildSummary],
    placement: PlacementResult,
    settings: OperatorSettings,
    slices: tuple[Slice, ...],
) -> RenderContext:
    # Roles of single-node instances roll by StatefulSet partition; an instance over
    # several nodes is a StatefulSet of its own and is not partitioned.
    replicas = {
        role: role_spec(pdd.spec, role).replicas
        for role in names.ROLES
        if role_spec(pdd.spec, role).nodesPerInstance == 1
    }
    # The coordinated rollout steps the home slice (slices beyond it roll on their own).
    home = [c for c in observed.values() if slice_of(pdd, c.key[2]) == 0]
    home_pods = [p for p in view.pods(key_of(pdd)) if p.slice == 0]
    revision = engine_revision(pdd.spec)
    return RenderContext(
        settings,
        placement.placement,
        rollout_partitions(revision, replicas, home, home_pods),
        slices=slices,
        router_revision=serving_revision(revision, home, home_pods),
    )
