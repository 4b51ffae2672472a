"""Status of a PDDeployment, computed from what was observed (pure).

Ready, Progressing and Degraded are the conditions users read; Reconciling and Stalled are
kstatus' abnormal-true pair, so Flux and `kstatus` judge health without a custom check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import (
    AdapterStatus,
    Condition,
    PDDeployment,
    PDDeploymentSpec,
    PDDeploymentStatus,
    PlacementStatus,
    RoleStatus,
    SliceStatus,
    TransferStatus,
)
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.placement import PlacementResult
from pdd_operator.status.conditions import find, set_condition
from pdd_operator.status.gang import GangReadiness
from pdd_operator.status.model import (
    ModelReadiness,
    awaiting_message,
    waited_too_long,
    waiting_since,
)
from pdd_operator.status.parallelism import ParallelismVerdict, parallelism_condition
from pdd_operator.status.refusals import REASON as REFUSED
from pdd_operator.status.refusals import Refusal
from pdd_operator.status.spec_conditions import spec_conditions

ROLES_WITH_ROUTER = ("prefill", "decode", "router")
# The reasons of a failed write of the children: refused until someone changes something
# (Stalled), or failed in a way time may cure and retried with backoff (Reconciling).
APPLY_FAILED = reasons.APPLY_FAILED
APPLY_RETRYING = reasons.APPLY_RETRYING
NOT_VERIFIED_YET = (
    "not verified yet: the prober pod (prefill ordinal 0; every prefill rank where instances "
    "span nodes) is asked for a probe once the deployment is Ready"
)


@dataclass(frozen=True)
class WorkloadState:
    """A StatefulSet's or Deployment's observed status (absent: exists=False)."""

    exists: bool = False
    desired: int = 0
    ready: int = 0
    updated: int = 0
    current_revision: str = ""
    update_revision: str = ""
    generation: int = 0
    observed_generation: int = 0
    pods: int = 0  # pods its controller has created (status.replicas), ready or not

    @property
    def settled(self) -> bool:
        return (
            self.exists
            and self.observed_generation >= self.generation
            and self.updated == self.desired
            and self.ready == self.desired
        )


def slices_state(states: Sequence[WorkloadState]) -> WorkloadState:
    """A role run by one StatefulSet per slice (or a router Deployment per slice), counted in
    pods over all of them; settled only when each is. `states` starts with the home slice's,
    whose revisions stand for the role's."""
    return WorkloadState(
        exists=True,
        current_revision=states[0].current_revision,
        update_revision=states[0].update_revision,
        desired=sum(s.desired for s in states),
        ready=sum(s.ready for s in states),
        updated=sum(s.updated for s in states),
        pods=sum(s.pods for s in states),
        generation=0 if all(s.settled for s in states) else 1,
    )


def instances_state(states: Sequence[WorkloadState]) -> WorkloadState:
    """A role whose instances span nodes, one StatefulSet each, counted in instances: an
    instance is ready (updated) when all its ranks are, since it serves only whole."""
    return WorkloadState(
        exists=True,
        desired=len(states),
        ready=sum(1 for s in states if s.desired and s.ready >= s.desired),
        updated=sum(1 for s in states if s.desired and s.updated >= s.desired),
        pods=sum(1 for s in states if s.pods >= s.desired),
        # Settled only when every instance's controller has seen its latest spec.
        generation=0 if all(s.observed_generation >= s.generation for s in states) else 1,
    )


@dataclass(frozen=True)
class PodProblem:
    """A pod that cannot serve, with the fix when one is known (from the preflight check)."""

    pod: str
    role: str
    reason: str
    message: str
    blocking: bool = False  # a required prerequisite: the pod will not start until fixed


@dataclass(frozen=True)
class Observed:
    workloads: dict[str, WorkloadState] = field(default_factory=dict)
    wanted: dict[str, int] = field(default_factory=dict)  # desired replicas per role
    revision: str = ""
    pod_problems: Sequence[PodProblem] = ()
    placement: PlacementResult | None = None
    transfer: TransferStatus | None = None
    transfer_ok: bool | None = None
    transfer_reason: str = ""
    apply_error: str = ""  # the children could not be written: why, for the user
    apply_error_reason: str = APPLY_FAILED  # its condition reason (NameConflict, ...)
    # The write failed in a way time may cure (kube.client.transient): the pass is retried.
    apply_error_transient: bool = False
    probe_requested_at: str = ""  # when this pass asked the prober pod for a transfer probe
    model: ModelReadiness | None = None  # the model's Secret and claims (status.model)
    refusals: Sequence[Refusal] = ()  # workloads whose pods the API server refuses
    pod_nodes: tuple[str, ...] = ()  # existing nodes the engine pods are bound to now
    # Autoscaled deployments only (None otherwise): both roles are at 0 pods by their scale
    # targets' asks.
    scaled_to_zero: bool | None = None
    # Autoscaled deployments only (None otherwise): why decode's scale-up is held ("" when
    # it is not), planning.autoscaling.hold_decode_growth.
    scaling_held: str | None = None
    # Autoscaled deployments that may grow by slices: each slice (planning.slices).
    slices: Sequence[SliceStatus] = ()
    gang: GangReadiness | None = None  # the gang scheduler, where instances span nodes
    # Whether the model's heads and experts divide over each role's ranks (None: a custom
    # engine, or not looked at).
    parallelism: ParallelismVerdict | None = None


def adapter_statuses(spec: PDDeploymentSpec) -> list[AdapterStatus]:
    """Each LoRA adapter and the request fields that select it on this engine."""
    engine = adapter_for(spec.engine.type)
    return [
        AdapterStatus(name=a.name, requestFields=engine.adapter_request_fields(spec, a))
        for a in spec.model.adapters
    ]


def compute_status(pdd: PDDeployment, observed: Observed, now: str) -> PDDeploymentStatus:
    roles = _roles(observed)
    previous = pdd.status.conditions
    gen = pdd.generation
    ready, ready_reason, ready_msg = _readiness(observed, roles)
    progressing, prog_reason, prog_msg = _progress(observed, roles)
    degraded, deg_reason, deg_msg = _degradation(observed)
    # A refused pod or a missing prerequisite does not go away by waiting: the user acts.
    blocking = bool(observed.refusals) or any(p.blocking for p in observed.pod_problems)
    stalled = (degraded and blocking) or _apply_refused(observed)
    stall_reason, stall_msg = deg_reason, deg_msg
    if observed.apply_error and observed.apply_error_transient:
        # Retried with backoff (reconcile/) without anyone acting: in progress, not stuck.
        progressing, prog_reason, prog_msg = True, observed.apply_error_reason, observed.apply_error
    since = _waiting_since(pdd, observed, now)
    if _model_missing(observed) and not observed.apply_error:
        model = observed.model
        assert model is not None
        if since and not waited_too_long(since, now):
            # Someone or something may create it yet: in progress, for the grace period.
            progressing, prog_reason, prog_msg = True, model.reason, awaiting_message(model, since)
        else:
            # Nothing progresses until the user creates or fixes what the model needs.
            progressing, prog_reason, prog_msg = False, model.reason, model.message
            stalled, stall_reason, stall_msg = True, model.reason, model.message
    misfit = _parallelism_refused(observed)
    if misfit is not None and not observed.apply_error:
        # The engines wait, uncreated or unchanged, for a layout the model can be split by.
        progressing, prog_reason, prog_msg = False, misfit.reason, misfit.message
        stalled, stall_reason, stall_msg = True, misfit.reason, misfit.message
    if observed.gang is not None and not observed.gang.ready and not observed.apply_error:
        # The instances wait, uncreated, for a gang scheduler the user enables or chooses.
        progressing, prog_reason, prog_msg = False, observed.gang.reason, observed.gang.message
        stalled, stall_reason, stall_msg = True, observed.gang.reason, observed.gang.message
    conditions = [
        set_condition(previous, condition_types.READY, ready, ready_reason, ready_msg, gen, now),
        set_condition(
            previous, condition_types.PROGRESSING, progressing, prog_reason, prog_msg, gen, now
        ),
        set_condition(previous, condition_types.DEGRADED, degraded, deg_reason, deg_msg, gen, now),
        set_condition(
            previous,
            condition_types.RECONCILING,
            progressing and not stalled,
            prog_reason,
            prog_msg,
            gen,
            now,
        ),
        set_condition(
            previous,
            condition_types.STALLED,
            stalled,
            stall_reason if stalled else reasons.NOT_STALLED,
            stall_msg if stalled else "",
            gen,
            now,
        ),
        *_model_condition(previous, observed, gen, now),
        *_gang_condition(previous, observed, gen, now),
        *_placement_condition(previous, observed, gen, now),
        *_transfer_condition(previous, observed, gen, now),
        *_scaled_to_zero_condition(previous, observed, gen, now),
        *_scaling_held_condition(previous, observed, gen, now),
        *spec_conditions(previous, pdd.spec, gen, now),
        *parallelism_condition(previous, observed.parallelism, gen, now),
    ]
    return PDDeploymentStatus(
        observedGeneration=gen,
        prefill=roles["prefill"],
        decode=roles["decode"],
        router=roles["router"],
        prefillReplicas=f"{roles['prefill'].ready}/{roles['prefill'].desired}",
        decodeReplicas=f"{roles['decode'].ready}/{roles['decode'].desired}",
        placement=_placement_status(pdd, observed),
        slices=list(observed.slices),
        transfer=_transfer_status(pdd, observed),
        adapters=adapter_statuses(pdd.spec),
        waitingSince=since,
        conditions=conditions,
    )


def is_ready(observed: Observed) -> bool:
    """Whether compute_status says Ready=True for what was observed."""
    ready, _, _ = _readiness(observed, _roles(observed))
    return ready


def _roles(observed: Observed) -> dict[str, RoleStatus]:
    return {role: _role_status(observed, role) for role in ROLES_WITH_ROUTER}


def _role_status(observed: Observed, role: str) -> RoleStatus:
    state = observed.workloads.get(role, WorkloadState())
    return RoleStatus(
        desired=observed.wanted.get(role, 0),
        ready=state.ready,
        updated=state.updated,
        revision=observed.revision if role != "router" else "",
    )


def _readiness(observed: Observed, roles: dict[str, RoleStatus]) -> tuple[bool, str, str]:
    summary = _summary(roles)
    if observed.apply_error:
        return False, observed.apply_error_reason, observed.apply_error
    if (misfit := _parallelism_refused(observed)) is not None:
        return False, misfit.reason, misfit.message
    if _model_missing(observed):
        assert observed.model is not None
        return False, observed.model.reason, observed.model.message
    missing = [r for r, s in roles.items() if s.desired and s.ready < s.desired]
    if missing:
        return False, reasons.REPLICAS_NOT_READY, summary
    stale = [
        r
        for r in roles
        if r in observed.workloads and not observed.workloads[r].settled and roles[r].desired
    ]
    if stale:
        return False, reasons.ROLLOUT_IN_PROGRESS, summary
    return True, reasons.ALL_REPLICAS_READY, summary


def _progress(observed: Observed, roles: dict[str, RoleStatus]) -> tuple[bool, str, str]:
    converging = [
        role
        for role, status in roles.items()
        if status.desired != status.ready
        or status.updated != status.desired
        or not observed.workloads.get(role, WorkloadState(exists=status.desired == 0)).exists
        or (
            role in observed.workloads
            and not observed.workloads[role].settled
            and status.desired > 0
        )
    ]
    if not converging:
        return False, reasons.COMPLETE, _summary(roles)
    if any(roles[r].updated < roles[r].desired for r in converging):
        updated = ", ".join(
            f"{role} {s.updated}/{s.desired} updated" for role, s in roles.items() if s.desired
        )
        return True, reasons.ROLLING_OUT, f"rolling out revision {observed.revision}: {updated}"
    return True, reasons.SCALING, _summary(roles)


def _degradation(observed: Observed) -> tuple[bool, str, str]:
    problems = list(observed.pod_problems)
    if _apply_refused(observed):
        return True, observed.apply_error_reason, observed.apply_error
    if observed.refusals:
        # Before any pod's problem: these pods do not exist, so no pod can report them.
        return True, REFUSED, "; ".join(r.describe() for r in observed.refusals)
    if not problems:
        return False, reasons.AS_EXPECTED, ""
    first = problems[0]
    more = f" (and {len(problems) - 1} more pods)" if len(problems) > 1 else ""
    return True, first.reason, f"{first.role} pod {first.pod}: {first.message}{more}"


def _apply_refused(observed: Observed) -> bool:
    """A write of the children was refused, and will be until someone acts: Stalled. One
    that time may cure says so in Ready and Reconciling only (the serving pods are as they
    were: nothing is degraded)."""
    return bool(observed.apply_error) and not observed.apply_error_transient


def _parallelism_refused(observed: Observed) -> ParallelismVerdict | None:
    verdict = observed.parallelism
    return verdict if verdict is not None and verdict.refused else None


def _model_missing(observed: Observed) -> bool:
    return observed.model is not None and observed.model.ready is False


def _waiting_since(pdd: PDDeployment, observed: Observed, now: str) -> str:
    """status.waitingSince: set while the model's missing object may still be created, kept
    across passes (and operator restarts) of the same generation; "" otherwise."""
    model = observed.model
    if model is None or model.ready is not False or not model.awaited:
        return ""
    status = pdd.status
    return waiting_since(status.waitingSince, status.observedGeneration, pdd.generation, now)


def _model_condition(
    previous: Sequence[Condition], observed: Observed, gen: int, now: str
) -> list[Condition]:
    model = observed.model
    if model is None:
        return []
    return [
        set_condition(
            previous,
            condition_types.MODEL_READY,
            model.ready,
            model.reason,
            model.message,
            gen,
            now,
        )
    ]


def _gang_condition(
    previous: Sequence[Condition], observed: Observed, gen: int, now: str
) -> list[Condition]:
    gang = observed.gang
    if gang is None:
        return []
    ready, reason, message = gang.ready, gang.reason, gang.message
    return [set_condition(previous, "GangScheduling", ready, reason, message, gen, now)]


def _placement_condition(
    previous: Sequence[Condition], observed: Observed, gen: int, now: str
) -> list[Condition]:
    result = observed.placement
    if result is None:
        return []
    message = result.message
    old = find(previous, condition_types.PLACED)
    if old is not None and old.status == "True" and result.placed and old.reason == result.reason:
        message = old.message  # the same decision, recorded once (see _placement_status)
    return [
        set_condition(
            previous, condition_types.PLACED, result.placed, result.reason, message, gen, now
        )
    ]


def _transfer_condition(
    previous: Sequence[Condition], observed: Observed, gen: int, now: str
) -> list[Condition]:
    """From the prober pod's result only: with none (no probe answered yet, or the prober pod
    was replaced) there is no condition, whatever the previous status said; a status written
    by someone else is not a measurement."""
    if observed.transfer_ok is None:
        return []
    transfer = observed.transfer or TransferStatus()
    return [
        set_condition(
            previous,
            condition_types.KV_TRANSFER_VERIFIED,
            observed.transfer_ok,
            observed.transfer_reason,
            transfer.message,
            gen,
            now,
        )
    ]


def _transfer_status(pdd: PDDeployment, observed: Observed) -> TransferStatus:
    """What the prober pod's result says, or "not verified yet". Of the previous status only
    the operator's own memory is kept: when it last asked for a probe (requestedAt)."""
    requested = observed.probe_requested_at or pdd.status.transfer.requestedAt
    if observed.transfer is not None:
        return observed.transfer.model_copy(update={"requestedAt": requested})
    if not pdd.spec.kvTransfer.verification.enabled:
        return TransferStatus(requestedAt=requested)
    return TransferStatus(message=NOT_VERIFIED_YET, requestedAt=requested)


def _placement_status(pdd: PDDeployment, observed: Observed) -> PlacementStatus:
    result = observed.placement
    if result is None:
        return pdd.status.placement
    previous = pdd.status.placement
    if (
        result.placed
        and result.placement.domain
        and (previous.level, previous.domain) == (result.placement.level, result.placement.domain)
    ):
        # Same decision: keep its record. The planner's node list and free-GPU counts move
        # with every other deployment's pods, and rewriting them would turn each of those
        # changes into a status write here.
        return _nodes_in_use(previous, observed)
    return _nodes_in_use(
        PlacementStatus(
            level=result.placement.level,
            domain=result.placement.domain,
            nodes=sorted(result.nodes),
            message=result.message,
        ),
        observed,
    )


def _nodes_in_use(placement: PlacementStatus, observed: Observed) -> PlacementStatus:
    """Once engine pods are bound, the nodes they are on (a node deleted, its pods placed
    elsewhere: the list follows); before that, the planner's choice."""
    if not observed.pod_nodes or list(observed.pod_nodes) == placement.nodes:
        return placement
    return placement.model_copy(update={"nodes": list(observed.pod_nodes)})


def _summary(roles: dict[str, RoleStatus]) -> str:
    parts = [
        f"{role} {s.ready}/{s.desired} ready"
        for role, s in roles.items()
        if s.desired or role != "router"
    ]
    return ", ".join(parts)


SCALED_TO_ZERO_MESSAGE = (
    "both roles are scaled to 0 by their scale targets (PDDRoleScaler); the router answers "
    "at once that no worker is available (vllm-router 503, smg 404 model_not_found) until "
    "one asks for pods again (kubectl scale pddrs/<name>-decode --replicas=1, or the "
    "HPA/KEDA that drives it)"
)


def _scaled_to_zero_condition(
    previous: Sequence[Condition], observed: Observed, gen: int, now: str
) -> list[Condition]:
    """ScaledToZero, for autoscaled deployments: True while no engine pod is wanted, so a
    client's 503 has a reason that `kubectl get pdd` shows."""
    if observed.scaled_to_zero is None:
        return []
    if observed.scaled_to_zero:
        return [
            set_condition(
                previous,
                condition_types.SCALED_TO_ZERO,
                True,
                reasons.SCALED_TO_ZERO,
                SCALED_TO_ZERO_MESSAGE,
                gen,
                now,
            )
        ]
    return [
        set_condition(
            previous, condition_types.SCALED_TO_ZERO, False, reasons.SERVING, "", gen, now
        )
    ]


def _scaling_held_condition(
    previous: Sequence[Condition], observed: Observed, gen: int, now: str
) -> list[Condition]:
    """ScalingHeld, for autoscaled deployments: True (reason KVPathDegraded) while a decode
    scale-up waits for the KV path to be verified again."""
    if observed.scaling_held is None:
        return []
    if observed.scaling_held:
        return [
            set_condition(
                previous,
                condition_types.SCALING_HELD,
                True,
                reasons.KV_PATH_DEGRADED,
                observed.scaling_held,
                gen,
                now,
            )
        ]
    return [
        set_condition(previous, condition_types.SCALING_HELD, False, reasons.NOT_HELD, "", gen, now)
    ]
