"""One idempotent reconcile for a PDDeployment: plan -> render -> apply -> prune -> status.

Every trigger (the object changed, a child changed, a pod changed, the periodic resync, the
operator restarted) calls the same `Reconciler.reconcile`. It reads only the operator's
in-memory indexes (watch-fed caches), writes only what differs from them, and writes status
only when it changed, so a resync of an unchanged PDDeployment makes no API write at all.

"Differs" includes a child changed by hand (scaled, an env var removed, deleted): the index
keeps a digest of the live values of the fields the operator owns (status.drift), and a child
whose digest is not the render's is applied again, which takes those fields back
(status.corrections).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import Condition, PDDeployment, PDDeploymentStatus, SliceStatus
from pdd_operator.engines.base import role_spec
from pdd_operator.kube.client import api_error_message, namespace_unavailable, transient
from pdd_operator.kube.resources import POD, ROLE_SCALER, Kind, kind_of
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.pass_queue import PassQueue
from pdd_operator.planning.autoscaling import (
    ScalingPlan,
    discovery_wait,
    fit_to_room,
    hold_decode_growth,
    plan_scaling,
    scale_target_roles,
    with_hold,
    with_replicas,
)
from pdd_operator.planning.instance_restart import instances_to_restart
from pdd_operator.planning.instance_rollout import RoleShape, next_instance_to_replace
from pdd_operator.planning.placement import (
    Fleet,
    PlacementResult,
    fits_domain,
    plan_placement,
)
from pdd_operator.planning.probe_pairs import per_rank_probes
from pdd_operator.planning.reservations import ReservationLedger, slice_reservation
from pdd_operator.planning.rollout import rollout_partitions, serving_revision
from pdd_operator.planning.slices import Slice, scale_by_slices, slices_possible
from pdd_operator.rendering import dependencies
from pdd_operator.rendering.children import child_key, owner_reference, render_children
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.rendering.roles import engine_revision
from pdd_operator.rendering.scalers import render_scaler, scaler_status
from pdd_operator.rendering.sidecar import render_token_secret, sidecar_enabled
from pdd_operator.status import ownership
from pdd_operator.status.compute import (
    APPLY_FAILED,
    APPLY_RETRYING,
    Observed,
    PodProblem,
    WorkloadState,
    compute_status,
    instances_state,
    is_ready,
    slices_state,
)
from pdd_operator.status.conditions import transition_events
from pdd_operator.status.corrections import Correction, CorrectionLog, drifted
from pdd_operator.status.drift import live_fingerprint, rendered_fingerprint
from pdd_operator.status.gang import GangReadiness, gang_api, gang_readiness, multinode_roles
from pdd_operator.status.invalid import invalid_spec_conditions, invalid_spec_message
from pdd_operator.status.model import (
    ModelFacts,
    ModelReadiness,
    claim_facts,
    engine_roles_held,
    model_readiness,
    model_references,
    secret_reports,
)
from pdd_operator.status.observe import (
    ChildKey,
    ChildSummary,
    PodSummary,
    ScalerSummary,
    counted_from_pods,
    pod_nodes,
    pod_problems,
)
from pdd_operator.status.own_writes import OwnObjectWrites, OwnStatusWrites
from pdd_operator.status.parallelism import engines_held_by, parallelism_verdict
from pdd_operator.status.refusals import Refusal
from pdd_operator.status.token import (
    TOKEN_RECREATED,
    MountFailure,
    token_conflict_message,
    token_create_failed,
    token_mount_problems,
    token_recreated_message,
)
from pdd_operator.status.transfer import (
    TransferOutcome,
    probe_due,
    prober,
    rank_probe_requests,
    rank_probers,
    rank_transfer_outcome,
    transfer_outcome,
)

log = logging.getLogger(__name__)


class ClusterView(Protocol):
    """What the reconciler reads: the operator's watch-fed indexes."""

    def pdd_body(self, key: DeploymentKey) -> Mapping[str, Any] | None: ...
    def children(self, key: DeploymentKey) -> Mapping[ChildKey, ChildSummary]: ...
    def pods(self, key: DeploymentKey) -> Sequence[PodSummary]: ...
    def fleet(self) -> Fleet: ...
    def node_ready(self, name: str) -> bool | None: ...
    def scalers(self, key: DeploymentKey) -> Mapping[str, ScalerSummary]: ...
    # Objects of the children's kinds that name the deployment but have no controller: its
    # children that lost their owner reference, or copies (a look at each tells which).
    def unowned_children(self, key: DeploymentKey) -> frozenset[ChildKey]: ...
    # Why a workload short of pods has none: its controller's newest creation Event says.
    def creation_refusal(self, workload_uid: str) -> str: ...
    # Each pod's newest report that it cannot mount this Secret (FailedMount), newest first.
    def mount_failures(self, namespace: str, secret: str) -> Sequence[MountFailure]: ...


class ApiWriter(Protocol):
    """What the reconciler writes through: the API server (kube.client.KubeApi)."""

    def apply(
        self, obj: dict[str, Any], dry_run: bool = False, want_result: bool = True
    ) -> dict[str, Any]: ...
    def create_if_absent(self, obj: dict[str, Any]) -> bool: ...
    def owner_references(
        self, kind: Kind, namespace: str, name: str
    ) -> list[dict[str, Any]] | None: ...
    def object_metadata(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None: ...
    def delete(self, kind: Kind, namespace: str, name: str, uid: str = "") -> None: ...
    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str: ...
    def annotate_pod(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> dict[str, Any]: ...
    def patch_scaler_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    # The model's claims are read on each pass (nothing watches claims; Secrets are never
    # read: a missing one is learnt from the pods).
    def read_pvc(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    # Whether the gang scheduler's API is served (discovery), for instances over nodes.
    def serves(self, api: str, plural: str = "") -> bool: ...


EventSink = Callable[[Mapping[str, Any], str, str, str], None]  # body, type, reason, message


@dataclass(frozen=True)
class _Desired:
    """The children a pass wants: their fingerprints, and the objects on demand."""

    hashes: Mapping[ChildKey, str]  # of the rendered object (its applied-hash annotation)
    owned: Mapping[ChildKey, str]  # of the fields it sets, as status.drift spells them
    objects: Callable[[], list[dict[str, Any]]]


@dataclass(frozen=True)
class _Rendered:
    """A deployment's last render: what it was rendered from, and its fingerprints."""

    inputs: tuple[str, int, tuple[int, ...], RenderContext]  # uid, generation, counts, context
    hashes: dict[ChildKey, str]
    owned: dict[ChildKey, str]


@dataclass(frozen=True)
class _Changes:
    """The writes a pass owes its children."""

    apply: list[dict[str, Any]]  # missing, rendered from other inputs, or drifted
    drifted: frozenset[ChildKey]  # of those, the ones someone else changed
    stale: tuple[ChildKey, ...]  # no longer rendered: to delete


@dataclass(frozen=True)
class _Claims:
    """What a pass found of the objects holding its children's names: those someone else
    holds, the children held because of them (theirs and what runs against them, in apply
    order), and this deployment's own children that had lost their owner reference."""

    conflicts: tuple[ownership.NameConflict, ...] = ()
    adopted: frozenset[ChildKey] = frozenset()
    held: tuple[ChildKey, ...] = ()


@dataclass(frozen=True)
class _Scaling:
    """The counts a pass runs: per role in all (what the scale targets show) and, for a
    deployment that may grow by slices, per slice (home first; empty otherwise)."""

    plan: ScalingPlan
    slices: tuple[Slice, ...] = ()

    @property
    def home(self) -> Mapping[str, int]:
        """The counts of the home slice: what the spec says from here on (its StatefulSets)."""
        return self.slices[0].counts if self.slices else self.plan.replicas


@dataclass(frozen=True)
class _Blocked:
    """Why a pass could not write its children: a condition reason and the user's message;
    `transient` where time may cure it (the pass is retried with backoff)."""

    reason: str = ""
    message: str = ""
    transient: bool = False


def _write_failed(what: str, err: Exception) -> _Blocked:
    """A write the API server refused or could not answer. A refusal stays until someone
    acts (ApplyFailed: Stalled); a failure time may cure (a 429, a 5xx, a webhook that timed
    out or could not be reached, no answer at all) is retried (ApplyRetrying: Reconciling)."""
    message = f"{what}: {api_error_message(err)}"
    if transient(err):
        return _Blocked(APPLY_RETRYING, f"{message} (retrying)", transient=True)
    return _Blocked(APPLY_FAILED, message)


@dataclass(frozen=True)
class _TokenCheck:
    """What the operator knows of a deployment's sidecar token Secret, which it may create
    but never read: that it exists and is this PDDeployment's (uid), or why not (`found`, a
    _Blocked), and which FailedMount report of it the operator answered last (`answered`)."""

    uid: str = ""
    missing: bool = False
    found: _Blocked = _Blocked()
    answered: str = ""

    @property
    def ours(self) -> bool:
        """Whether engines may mount it: there (or not needed) and not someone else's."""
        return not self.missing and self.found.reason != ownership.TOKEN_REASON


def _existing_token_is_ours(last: _TokenCheck | None, uid: str, has_children: bool) -> bool:
    """Whether a token Secret whose create answered "exists" is this deployment's. First seen
    by this process: when the deployment has children, made before them (by this operator,
    or its predecessor). Seen before: ours while it was, someone else's until it is gone."""
    if last is None or last.uid != uid:
        return has_children
    if last.found.reason == ownership.TOKEN_REASON:
        return False
    return last.ours or has_children


# A name conflict is looked at again after this long, doubling up to the maximum: the object
# holding the name is not watched (it may carry no label of ours), so nothing else would say
# that it is gone before the next resync.
CONFLICT_RETRY_SECONDS = 5.0
CONFLICT_RETRY_MAX_SECONDS = 300.0
# While the model's Secret or claim is missing, the pass asks again after this many seconds,
# doubling up to the maximum: nothing watches Secrets or claims (the operator may only get
# them), and the periodic resync is minutes apart.
MODEL_RETRY_FIRST_S = 2.0
MODEL_RETRY_MAX_S = 60.0
# After a write that failed in a way time may cure (_write_failed), the pass is tried again
# after this many seconds, doubling up to the maximum: nothing else would trigger one before
# the periodic resync. (Each request was already retried a few times within the pass.)
TRANSIENT_RETRY_FIRST_S = 2.0
TRANSIENT_RETRY_MAX_S = 60.0
# How long a discovery answer about a gang scheduler's API holds (it changes when a cluster
# admin enables a feature gate or installs Kueue/Volcano: rare, and worth a pass then).
GANG_API_RECHECK_S = 30.0


class Reconciler:
    def __init__(
        self,
        kube: ApiWriter,
        view: ClusterView,
        settings: OperatorSettings,
        emit_event: EventSink,
        metrics: OperatorMetrics | None = None,
        max_concurrent: int = 64,
        coalesce_max_s: float = 0.0,
        model_retry: tuple[float, float] = (MODEL_RETRY_FIRST_S, MODEL_RETRY_MAX_S),
        names_guarded: bool = False,
    ) -> None:
        self.kube = kube
        # The name-guard admission policy is in force: the API server itself refuses an apply
        # that would make an existing object this deployment's child, so only workloads are
        # looked up before their apply (docs/security.md, "Names and ownership").
        self.names_guarded = names_guarded
        self.view = view
        self.settings = settings
        self.emit_event = emit_event
        self.metrics = metrics
        self._queue: PassQueue[DeploymentKey] = PassQueue(
            lambda key: self._reconcile_once(key),  # late-bound: tests replace the pass
            self.is_own_status_write,
            lambda key: self.view.pdd_body(key) is not None,
            self._forget,
            max_concurrent,
            coalesce_max_s,
        )
        # The versions this operator's writes to children and pods produced: their watch
        # events ask no pass.
        self.own_object_writes = OwnObjectWrites()
        self._tokens: dict[DeploymentKey, _TokenCheck] = {}
        self._reservations = ReservationLedger()
        # The slices each deployment grown beyond its home domain runs (status.slices says the
        # same once written; this holds between the pass that opens one and that write).
        self._slices: dict[DeploymentKey, tuple[Slice, ...]] = {}
        self._own_writes = OwnStatusWrites()
        self._rendered: dict[DeploymentKey, _Rendered] = {}
        self._corrections = CorrectionLog()
        self._model_retry = model_retry
        self._model_attempts: dict[DeploymentKey, int] = {}
        self.conflict_retry_seconds = CONFLICT_RETRY_SECONDS
        # Discovery of the gang schedulers' APIs: (api, plural) -> (when, served).
        self._served: dict[tuple[str, str], tuple[float, bool]] = {}
        # Deployments that had a pass in this process (dropped when they are gone).
        self._passed: set[DeploymentKey] = set()
        if metrics:
            metrics.deployments_reconciled.set_function(lambda: len(self._passed))
            metrics.deployments_tracked.set_function(self._tracked_deployments)

    def _tracked_deployments(self) -> int:
        """Deployments any per-deployment table of the reconciler holds (the planning and
        status ledgers are keyed alike and cleared by the same `_forget`). Called from the
        metrics server's thread: set() and union() copy the keys in C, under the GIL, so a
        pass changing a table meanwhile cannot break the iteration."""
        tables = (self._rendered, self._tokens, self._slices, self._model_attempts, self._passed)
        return len(self._queue.keys().union(*tables))

    def is_own_status_write(self, key: DeploymentKey, resource_version: str) -> bool:
        """Whether this version of the PDDeployment is the status this operator just wrote:
        the pass that wrote it already saw everything else, so its watch event needs no pass."""
        return self._own_writes.is_echo(key, resource_version)

    async def deployment_changed(self, key: DeploymentKey, resource_version: str) -> None:
        """A PDDeployment's watch event: a pass, unless it is the echo of our own status
        write. The echo can come before the pass that wrote it has the write's answer; while a
        pass runs, its version waits for that pass to end."""
        if self._queue.needs_pass(key, resource_version):
            await self.reconcile(key, cause="pddeployments")

    async def reconcile(self, key: DeploymentKey, delay: float = 0.0, cause: str = "") -> None:
        """Coalesce triggers: while one pass runs, later triggers collapse into one more pass;
        while a deployment waits for a pass slot (`max_concurrent`), they need none.

        With a `delay` (child and pod events, which come in bursts: pods are created, bound
        and become ready one after another, each StatefulSet's status follows) the pass waits
        until no trigger came for `delay` seconds, or `coalesce_max_s` after the first, and
        every trigger of the same key arriving meanwhile is answered by that one pass: it
        reads the indexes when it runs.
        """
        if self.metrics and cause:
            self.metrics.count_pass_request(cause)
        await self._queue.request(key, delay)

    def _forget(self, key: DeploymentKey) -> None:
        """The deployment is gone: its reservation and everything remembered about it."""
        self._queue.forget(key)
        self._reservations.release(key)
        self._slices.pop(key, None)
        self._own_writes.forget(key)
        self._rendered.pop(key, None)
        self._corrections.forget(key)
        self._model_attempts.pop(key, None)
        self._tokens.pop(key, None)
        self._passed.discard(key)
        if self.metrics:
            self.metrics.forget_kv_transfer(key)

    async def _reconcile_once(self, key: DeploymentKey) -> None:
        body = self.view.pdd_body(key)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return  # owner references let the garbage collector remove the children
        body = self._own_writes.latest(key, body)
        self._passed.add(key)
        timer = self.metrics.reconcile_timer() if self.metrics else None
        try:
            await self._converge_or_report(body)
        except Exception:
            if self.metrics:
                self.metrics.reconcile_errors.inc()
            raise
        finally:
            if timer:
                timer()

    async def _converge_or_report(self, body: Mapping[str, Any]) -> None:
        try:
            pdd = PDDeployment.from_body(dict(body))
        except ValidationError as err:
            await self._report_invalid(body, err)
            return
        await self._converge(pdd, body)

    async def _converge(self, pdd: PDDeployment, body: Mapping[str, Any]) -> None:
        # From here on the spec says the counts being run: what the scale targets ask for,
        # within spec.autoscaling's bounds and ratio (the spec's own counts without it).
        # The home slice's counts, that is; slices beyond it are rendered from scaling.slices.
        # The KV path's verdict, once per pass: the autoscaling guard and the status read it.
        transfer = _transfer_outcome(pdd, self.view.pods(_key(pdd)))
        scaling = self._scaling(pdd, transfer)
        pdd = pdd.model_copy(update={"spec": with_replicas(pdd.spec, scaling.home)})
        observed = self.view.children(_key(pdd))
        placement = self._place(pdd)
        ctx = self._render_context(pdd, placement, observed, scaling.slices[1:])
        desired = self._render(pdd, ctx)
        model = await self._check_model(pdd)
        # Looked at, and created when missing, before the engines are applied: their pods
        # mount it, and a Secret of its name that is not this deployment's (found, or planted
        # before a late create) holds a token someone else may know.
        try:
            token = await self._token_secret(pdd)
        except _NamespaceGoingAway:
            return
        parallelism = parallelism_verdict(pdd.spec)
        hold = engine_roles_held(model) or not token.ours or engines_held_by(parallelism)
        held = _engine_workloads(desired) if hold else frozenset()
        gang = await self._check_gang(pdd)
        if gang is not None and not gang.ready:
            held |= _gang_children(pdd, desired)
        try:
            blocked = await self._sync_children(pdd, body, desired, observed, held)
        except _NamespaceGoingAway:
            return  # its namespace is being deleted: nothing to create, nobody to tell
        self._retry_while_conflicting(_key(pdd), blocked)
        if not blocked.message:
            blocked = token.found
        if not blocked.message:
            try:
                blocked = await self._sync_scalers(pdd, scaling.plan)
            except _NamespaceGoingAway:
                return
        if not blocked.message:
            await self._restart_broken_instances(pdd, body)
        observed_now = self._observed(pdd, desired, placement, blocked, scaling, transfer)
        autoscaled = pdd.spec.autoscaling is not None
        status = await self._status(
            pdd,
            replace(
                observed_now,
                model=model,
                gang=gang,
                parallelism=parallelism,
                scaled_to_zero=scaling.plan.scaled_to_zero if autoscaled else None,
                scaling_held=scaling.plan.held if autoscaled else None,
                slices=[SliceStatus(**asdict(piece)) for piece in scaling.slices],
            ),
        )
        await self._write_status(pdd, body, status)
        self._export_transfer(_key(pdd), observed_now.transfer_ok, status)
        self._retry_while_transient(_key(pdd), blocked)

    def _export_transfer(
        self, key: DeploymentKey, ok: bool | None, status: PDDeploymentStatus
    ) -> None:
        """pdd_kv_transfer_gbps and pdd_kv_transfer_verified from the measurement this pass's
        status shows; no series while no probe has answered."""
        if self.metrics is None:
            return
        if ok is None:
            self.metrics.forget_kv_transfer(key)
            return
        transfer = status.transfer
        self.metrics.set_kv_transfer(
            key, transfer.path, status.placement.domain, transfer.measuredGBps, ok
        )

    def _retry_while_conflicting(self, key: DeploymentKey, blocked: _Blocked) -> None:
        """Schedule the next look at a name conflict, backing off while it lasts."""
        lasting = blocked.reason == ownership.REASON
        first, most = self.conflict_retry_seconds, CONFLICT_RETRY_MAX_SECONDS
        delay = self._queue.back_off(key, "conflict", lasting, first, most)
        if lasting:
            self._retry_later(key, delay)

    def _retry_while_transient(self, key: DeploymentKey, blocked: _Blocked) -> None:
        """Schedule another pass after a write that failed in a way time may cure, backing
        off while the failures last."""
        first, most = TRANSIENT_RETRY_FIRST_S, TRANSIENT_RETRY_MAX_S
        delay = self._queue.back_off(key, "transient", blocked.transient, first, most)
        if blocked.transient:
            self._retry_later(key, delay)

    # ------------------------------------------------------------------------------ model

    async def _check_model(self, pdd: PDDeployment) -> ModelReadiness:
        """Whether the Secret and claims of spec.model.source are there; while one is not,
        another pass is scheduled (with backoff) to notice when it appears."""
        facts = await asyncio.to_thread(self._model_facts, pdd)
        readiness = model_readiness(pdd, facts)
        key = _key(pdd)
        if readiness.ready is True:
            self._model_attempts.pop(key, None)
        else:
            attempt = self._model_attempts.get(key, 0)
            self._model_attempts[key] = attempt + 1
            first, most = self._model_retry
            self._retry_later(key, min(first * 2**attempt, most))
        return readiness

    def _model_facts(self, pdd: PDDeployment) -> ModelFacts:
        refs = model_references(pdd.spec)
        if refs.empty:
            return ModelFacts()
        missing, key_missing = False, False
        if refs.secret is not None:  # never read: what the engine pods' kubelets report
            problems = (pod.problem for pod in self.view.pods(_key(pdd)))
            missing, key_missing = secret_reports(problems, pdd.namespace, refs.secret)
        try:
            claims = {
                use.name: claim_facts(self.kube.read_pvc(pdd.namespace, use.name))
                for use in refs.claims
            }
        except Exception as err:  # an answer other than "not found": say so, hold nothing
            log.warning("checking the model of %s/%s failed: %s", pdd.namespace, pdd.name, err)
            return ModelFacts(error=api_error_message(err))
        return ModelFacts(secret_exists=not missing, secret_key_missing=key_missing, claims=claims)

    async def _restart_broken_instances(self, pdd: PDDeployment, body: Mapping[str, Any]) -> None:
        """Delete every rank pod of an instance over several nodes one of whose ranks failed
        or restarted (planning.instance_restart): it comes back whole or not at all. With
        none broken, replace the next instance of an older revision whole, one at a time
        (planning.instance_rollout)."""
        pods = self.view.pods(_key(pdd))
        restarts = instances_to_restart(pods)
        if not restarts:
            shapes = {
                role: RoleShape(
                    role_spec(pdd.spec, role).replicas, role_spec(pdd.spec, role).nodesPerInstance
                )
                for role in multinode_roles(pdd)
            }
            stale = next_instance_to_replace(engine_revision(pdd.spec), pods, shapes)
            restarts = [stale] if stale is not None else []
        for restart in restarts:
            try:
                await asyncio.gather(
                    *(
                        asyncio.to_thread(self.kube.delete, POD, pdd.namespace, name, uid)
                        for name, uid in restart.pods
                    )
                )
            except Exception as err:  # the next pass sees the same rank and tries again
                log.warning("restarting instance %s failed: %s", restart.instance, err)
                continue
            for _ in restart.pods:
                self._count_write("delete", "Pod")
            message = (
                f"{restart.cause}: {restart.role} instance {restart.instance} starts again "
                f"whole ({len(restart.pods)} rank pods deleted; its ranks start together)"
            )
            self.emit_event(body, "Normal", restart.event, message)

    async def _check_gang(self, pdd: PDDeployment) -> GangReadiness | None:
        """Whether the gang scheduler of spec.scheduling.gang is served, where instances span
        nodes (None: no gang needed). Discovery answers are kept a while; while the API is
        missing another pass looks again, so enabling it later is noticed."""
        api = gang_api(pdd)
        if api is None:
            return None
        now = time.monotonic()
        cached = self._served.get(api)
        if cached is None or now - cached[0] > GANG_API_RECHECK_S:
            try:
                served = await asyncio.to_thread(self.kube.serves, *api)
            except Exception as err:  # unknown this pass: hold nothing new, say nothing
                log.warning("discovery of %s failed: %s", api[0], err)
                return None
            self._served[api] = cached = (now, served)
        if not cached[1]:
            self._retry_later(_key(pdd), GANG_API_RECHECK_S)
        return gang_readiness(pdd, cached[1])

    def _retry_later(self, key: DeploymentKey, delay: float) -> None:
        """A pass `delay` seconds from now (a model or a name that waits, a pod's discovery
        grace); the sooner of two asks wins (pass_queue)."""
        self._queue.later(key, delay, lambda: self.reconcile(key, cause="retry"))

    # ------------------------------------------------------------------------------ plan

    def _scaling(self, pdd: PDDeployment, transfer: TransferOutcome | None) -> _Scaling:
        """The counts to run, from what the deployment's scale targets ask for."""
        if pdd.spec.autoscaling is None:
            return _Scaling(plan_scaling(pdd.spec, {}))
        key = _key(pdd)
        asked = {role: s.replicas for role, s in self.view.scalers(key).items()}
        domain = self._placed_domain(pdd)
        running, home, further = self._running(pdd, domain)
        # The KV-path guard holds decode at what runs in all slices together.
        total = {role: n + sum(s.replicas(role) for s in further) for role, n in running.items()}
        hold = hold_decode_growth(pdd.spec, asked, total, _kv_path_problem(transfer))
        plan = plan_scaling(pdd.spec, hold.asks)
        if domain is None or len(running) < len(names.ROLES):
            self._slices.pop(key, None)
            self._reservations.set_slices(key, ())
            return _Scaling(with_hold(plan, hold, asked))  # the planner's first job
        if home is not None:
            sliced = self._scale_by_slices(pdd, plan, home, further)
            return replace(sliced, plan=with_hold(sliced.plan, hold, asked))
        grows = any(plan.replicas[role] > running.get(role, 0) for role in names.ROLES)
        if not grows:
            return _Scaling(with_hold(plan, hold, asked))
        fleet = self.view.fleet()
        reserved = self._reservations.reserved_elsewhere(key, fleet)
        own = fleet.held.get(key, {})

        def fits(counts: Mapping[str, int]) -> bool:
            spec = with_replicas(pdd.spec, counts)
            return fits_domain(spec, fleet, domain[0], domain[1], reserved, own)

        where = f"{domain[0]}={domain[1]}"
        return _Scaling(
            with_hold(fit_to_room(pdd.spec, hold.asks, running, fits, where), hold, asked)
        )

    def _running(
        self, pdd: PDDeployment, domain: tuple[str, str] | None
    ) -> tuple[dict[str, int], Slice | None, list[Slice]]:
        """What runs per role in the home slice's StatefulSets and, for a deployment that may
        grow by slices and is placed, the home slice and the slices running beyond it."""
        running = {
            s.role: s.workload.desired
            for s in self.view.children(_key(pdd)).values()
            if s.key[1] == "StatefulSet"
            and s.workload is not None
            and s.role
            and _slice_of(pdd, s.key[2]) == 0
        }
        if domain is None or not slices_possible(pdd.spec):
            return running, None, []
        known = self._known_slices(pdd)
        if known:
            # A home StatefulSet missing (deleted by hand, not indexed yet) runs what the
            # last plan gave it: the slices beyond it are kept, never pruned for that.
            running = {role: running.get(role, known[0].replicas(role)) for role in names.ROLES}
        if len(running) < len(names.ROLES):
            return running, None, []
        home = Slice(0, domain[0], domain[1], running["prefill"], running["decode"])
        further = [s for s in known[1:] if s.level == home.level and s.domain != home.domain]
        return running, home, further

    def _scale_by_slices(
        self, pdd: PDDeployment, plan: ScalingPlan, home: Slice, further: Sequence[Slice]
    ) -> _Scaling:
        """Spread the counts over the home slice and the slices running in further domains;
        remember and reserve them."""
        key = _key(pdd)
        fleet = self.view.fleet()
        reserved = self._reservations.reserved_elsewhere(key, fleet)
        own = fleet.held.get(key, {})
        plan, sliced = scale_by_slices(pdd.spec, plan, [home, *further], fleet, reserved, own)
        self._slices[key] = sliced.slices
        marks = tuple(slice_reservation(pdd.spec, piece) for piece in sliced.slices[1:])
        self._reservations.set_slices(key, marks)
        return _Scaling(plan, sliced.slices)

    def _known_slices(self, pdd: PDDeployment) -> tuple[Slice, ...]:
        """The slices that run now, home first: as the last pass planned them, or as
        status.slices says after a restart of the operator (empty: none known)."""
        remembered = self._slices.get(_key(pdd))
        if remembered is not None:
            return remembered
        return tuple(Slice(**s.model_dump()) for s in pdd.status.slices)

    def _placed_domain(self, pdd: PDDeployment) -> tuple[str, str] | None:
        """(level, domain) the slice runs in; None when it is not placed in one."""
        if pdd.spec.topology.placement == "none":
            return None
        mark = self._reservations.get(_key(pdd))
        if mark is not None:
            return mark.level, mark.domain
        placed = pdd.status.placement
        return (placed.level, placed.domain) if placed.domain else None

    def _place(self, pdd: PDDeployment) -> PlacementResult:
        key = _key(pdd)
        if pdd.spec.topology.placement == "none":
            self._reservations.release(key)
            return plan_placement(pdd.spec, (), pdd.status.placement)
        refused = any(
            p.problem is not None and p.problem.reason == "Unschedulable"
            for p in self.view.pods(key)
        )
        fleet = self.view.fleet()
        return self._reservations.place(key, pdd.spec, pdd.status.placement, fleet, refused)

    def _render_context(
        self,
        pdd: PDDeployment,
        placement: PlacementResult,
        observed: Mapping[ChildKey, ChildSummary],
        slices: tuple[Slice, ...] = (),
    ) -> RenderContext:
        # Roles of single-node instances roll by StatefulSet partition; an instance over
        # several nodes is a StatefulSet of its own and is not partitioned.
        replicas = {
            role: role_spec(pdd.spec, role).replicas
            for role in names.ROLES
            if role_spec(pdd.spec, role).nodesPerInstance == 1
        }
        # The coordinated rollout steps the home slice (slices beyond it roll on their own).
        home = [c for c in observed.values() if _slice_of(pdd, c.key[2]) == 0]
        home_pods = [p for p in self.view.pods(_key(pdd)) if p.slice == 0]
        revision = engine_revision(pdd.spec)
        return RenderContext(
            self.settings,
            placement.placement,
            rollout_partitions(revision, replicas, home, home_pods),
            slices=slices,
            router_revision=serving_revision(revision, home, home_pods),
        )

    # ------------------------------------------------------------------------------ render

    def _render(self, pdd: PDDeployment, ctx: RenderContext) -> _Desired:
        """The children's fingerprints, rendered again only when their inputs changed (the
        spec's generation or the context): most passes answer pod progress and change neither.
        Only the fingerprints are kept (the objects are ~70 KiB per deployment in memory); the
        objects are rendered again when one must be applied."""
        counts = (pdd.spec.prefill.replicas, pdd.spec.decode.replicas)
        inputs = (pdd.uid, pdd.generation, counts, ctx)
        cached = self._rendered.get(_key(pdd))
        if cached is not None and cached.inputs == inputs:
            return _Desired(cached.hashes, cached.owned, lambda: render_children(pdd, ctx))
        objects = render_children(pdd, ctx)
        hashes = {child_key(obj): _applied_hash(obj) for obj in objects}
        owned = {
            key: _reused_fingerprint(cached, pdd.uid, key, hashes[key]) or rendered_fingerprint(obj)
            for key, obj in zip(hashes, objects, strict=True)
        }
        self._rendered[_key(pdd)] = _Rendered(inputs, hashes, owned)
        return _Desired(hashes, owned, lambda: objects)

    # ------------------------------------------------------------------------------ apply

    async def _sync_children(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        desired: _Desired,
        observed: Mapping[ChildKey, ChildSummary],
        held: frozenset[ChildKey] = frozenset(),
    ) -> _Blocked:
        """Apply what differs, delete what is no longer wanted, leave `held` children as they
        are (not created, not changed, not deleted); say what stopped it if anything did.
        While a child's name is taken by an object that is not this deployment's, that child
        is not written, nor any child that would run against that object (a workload against
        its ServiceAccount or Service: rendering.dependencies); every other child is.
        A child that lost its owner reference and proves to be this deployment's
        (ownership.adoptable) is applied like any other, which puts the reference back."""
        changes = _changes(desired, observed, self._corrections.of(_key(pdd)), held)
        self._corrections.keep_wanted(_key(pdd), desired.owned)
        try:
            claims = await self._look_up(pdd, self._to_look_up(pdd, changes, observed))
            claims = await self._apply(pdd, body, changes, desired, observed, claims)
            await self._prune(pdd.namespace, changes.stale, observed)
        except Exception as err:  # surfaced as a condition + event, not a trace
            if namespace_unavailable(err):
                raise _NamespaceGoingAway from err
            blocked = _write_failed("could not apply children", err)
            log.warning("%s/%s: %s", pdd.namespace, pdd.name, blocked.message)
            return blocked
        if claims.conflicts:
            return self._report_conflicts(pdd, claims)
        return _Blocked()

    def _to_look_up(
        self, pdd: PDDeployment, changes: _Changes, observed: Mapping[ChildKey, ChildSummary]
    ) -> list[dict[str, Any]]:
        """The children to apply that the indexes do not list as this deployment's (new ones,
        mostly): every one, or under the name guard (which refuses a takeover itself) the
        workloads and those the watch saw without a controller (lost their owner reference)."""
        unlisted = [obj for obj in changes.apply if child_key(obj) not in observed]
        if not self.names_guarded:
            return unlisted
        unowned = self.view.unowned_children(_key(pdd))
        return [o for o in unlisted if o["kind"] in WORKLOAD_KINDS or child_key(o) in unowned]

    async def _look_up(self, pdd: PDDeployment, objects: Sequence[dict[str, Any]]) -> _Claims:
        """Whose the object holding each child's name is: nobody's (the name is free), this
        deployment's that lost its owner reference (adopted), or someone else's (a conflict)."""
        metas = await asyncio.gather(
            *(
                asyncio.to_thread(
                    self.kube.object_metadata,
                    kind_of(obj["apiVersion"], obj["kind"]),
                    pdd.namespace,
                    obj["metadata"]["name"],
                )
                for obj in objects
            )
        )
        conflicts, adopted = [], set()
        for obj, meta in zip(objects, metas, strict=True):
            if meta is None:
                continue  # the name is free
            owners, name = meta.get("ownerReferences") or [], obj["metadata"]["name"]
            if ownership.adoptable(meta, pdd.name, self.settings.field_manager):
                adopted.add(child_key(obj))
            elif conflict := ownership.name_conflict(obj["kind"], name, owners, pdd.uid):
                conflicts.append(conflict)
        return _Claims(tuple(conflicts), frozenset(adopted))

    def _report_conflicts(self, pdd: PDDeployment, claims: _Claims) -> _Blocked:
        taken = {(c.kind, c.name) for c in claims.conflicts}
        held = [f"{kind} {name}" for _, kind, name in claims.held if (kind, name) not in taken]
        message = ownership.conflict_message(claims.conflicts, held)
        log.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
        return _Blocked(ownership.REASON, message)

    async def _apply(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        changes: _Changes,
        desired: _Desired,
        observed: Mapping[ChildKey, ChildSummary],
        claims: _Claims,
    ) -> _Claims:
        """Waves, each sent at once (`_apply_waves`), without the children a name conflict
        holds. A refused apply of a child the indexes do not list is looked up (the name
        guard refuses a takeover): its conflict holds what depends on it from the next wave
        on; any other refusal is raised. A drifted child's answer is read back to record what
        the correction produced; an adopted child's apply is told as a correction too."""
        claims = replace(claims, held=_held_by(claims.conflicts, desired))
        for wave in _apply_waves(changes.apply):
            wave = [obj for obj in wave if child_key(obj) not in claims.held]
            results = await asyncio.gather(
                *(
                    asyncio.to_thread(self._apply_child, obj, child_key(obj) in changes.drifted)
                    for obj in wave
                ),
                return_exceptions=True,
            )
            applied = [(o, r) for o, r in zip(wave, results, strict=True) if isinstance(r, dict)]
            self._record_applied(pdd, body, applied, changes, desired, observed, claims)
            failed = [(o, r) for o, r in zip(wave, results, strict=True) if not isinstance(r, dict)]
            if failed:
                conflicts = (
                    *claims.conflicts,
                    *await self._conflicts_behind(pdd, failed, observed),
                )
                claims = replace(claims, conflicts=conflicts, held=_held_by(conflicts, desired))
        return claims

    def _record_applied(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        applied: Sequence[tuple[dict[str, Any], dict[str, Any]]],
        changes: _Changes,
        desired: _Desired,
        observed: Mapping[ChildKey, ChildSummary],
        claims: _Claims,
    ) -> None:
        for obj, _ in applied:
            self._count_write("apply", obj["kind"])
        for obj, result in applied:
            if (key := child_key(obj)) in changes.drifted:
                correction = Correction(
                    wanted=desired.owned[key],
                    result=live_fingerprint(result, self.settings.field_manager),
                    version=str(result.get("metadata", {}).get("resourceVersion", "")),
                    read=observed[key].resource_version,
                )
                self._put_back(pdd, body, obj, correction)
            elif key in claims.adopted:
                self._adopted(pdd, body, obj)

    async def _conflicts_behind(
        self,
        pdd: PDDeployment,
        failed: Sequence[tuple[dict[str, Any], BaseException]],
        observed: Mapping[ChildKey, ChildSummary],
    ) -> tuple[ownership.NameConflict, ...]:
        """A refused apply of a child the indexes do not list may be a taken name: refused by
        the name-guard policy, or by the API server itself (an object has one controller).
        Whose each such name is, is read; without a conflict the first refusal is raised."""
        unlisted = [obj for obj, _ in failed if child_key(obj) not in observed]
        found = await self._look_up(pdd, unlisted)
        if found.conflicts:
            return found.conflicts
        raise failed[0][1]

    def _apply_child(self, obj: dict[str, Any], read_back: bool) -> dict[str, Any]:
        """Apply one child (in a worker thread) and expect its watch echo from there: the echo
        can reach the informer before this pass resumes."""
        result = self.kube.apply(obj, want_result=read_back)
        self.own_object_writes.expect(kind_of(obj["apiVersion"], obj["kind"]).plural, result)
        return result

    def _annotate_pod(self, namespace: str, pod: str, annotations: dict[str, str]) -> None:
        """Ask a pod for a probe (in a worker thread), expecting the write's watch echo."""
        result = self.kube.annotate_pod(namespace, pod, annotations)
        self.own_object_writes.expect(POD.plural, result)

    async def _prune(
        self,
        namespace: str,
        stale: Sequence[ChildKey],
        observed: Mapping[ChildKey, ChildSummary],
    ) -> None:
        """Delete children no longer rendered, each only as the object the index saw (its
        uid): never another object that took the name since."""
        await asyncio.gather(
            *(
                asyncio.to_thread(
                    self.kube.delete,
                    kind_of(version, kind),
                    namespace,
                    name,
                    observed[(version, kind, name)].uid,
                )
                for version, kind, name in stale
            )
        )
        for _, kind, _ in stale:
            self._count_write("delete", kind)

    def _put_back(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        obj: Mapping[str, Any],
        correction: Correction,
    ) -> None:
        """Record a drift correction; tell the user when one of their changes was undone.

        The digest of what the apply returned is remembered: when it is not the render's
        (the server spells some owned value in a way status.drift does not know, or an
        admission webhook rewrote it), that digest counts as undrifted from now on, so the
        gap costs one write and never a loop."""
        if not self._corrections.record(_key(pdd), child_key(dict(obj)), correction):
            return
        what = f"{obj['kind']} {obj['metadata']['name']}"
        if correction.result != correction.wanted:
            # Not the user's doing and nothing they can fix: a gap in status.drift's
            # canonical form (the dry-run property test should have caught it).
            log.warning(
                "%s/%s: %s re-applied; its owned fields read back in another spelling "
                "than rendered (taken as undrifted from now on)",
                pdd.namespace,
                pdd.name,
                what,
            )
            return
        if self.metrics:
            self.metrics.drift_corrections.labels(kind=obj["kind"]).inc()
        message = (
            f"{what} was changed outside the operator; its fields were put back to the "
            f"PDDeployment's spec (change the PDDeployment instead)"
        )
        log.info("%s/%s: %s", pdd.namespace, pdd.name, message)
        self.emit_event(body, "Normal", "DriftCorrected", message)

    def _adopted(self, pdd: PDDeployment, body: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
        """Tell the user that a child which had lost its owner reference has it back."""
        if self.metrics:
            self.metrics.drift_corrections.labels(kind=obj["kind"]).inc()
        message = ownership.adoption_message(obj["kind"], obj["metadata"]["name"])
        log.info("%s/%s: %s", pdd.namespace, pdd.name, message)
        self.emit_event(body, "Normal", "DriftCorrected", message)

    async def _token_secret(self, pdd: PDDeployment) -> _TokenCheck:
        """Whether the sidecar token Secret is there and this PDDeployment's. The operator
        may create Secrets but not read them: it creates this one on the deployment's first
        pass here, and again whenever a pod reports it cannot mount it (its kubelet's
        FailedMount Event, informers/mount_events.py). An existing Secret (the create answers
        409) is this deployment's once the deployment has children (the operator created it
        before them; a restarted operator does not ask again); before that, someone else made
        it, and may know its token."""
        if not sidecar_enabled(pdd.spec):
            return _TokenCheck()
        key = _key(pdd)
        name = names.token_secret_name(pdd.name, pdd.uid)
        last = self._tokens.get(key)
        if (last is None or last.uid != pdd.uid) and self.view.children(key):
            # Made before its children, by this process or its predecessor: no request, and
            # a pod's report says if it has gone since.
            last = self._tokens[key] = _TokenCheck(pdd.uid)
        reports = self.view.mount_failures(pdd.namespace, name)
        newest = reports[0].seen if reports else ""
        if last is not None and last.uid == pdd.uid and last.ours and last.answered == newest:
            return last
        try:
            created = await self._created_token(pdd)
        except Exception as err:
            if namespace_unavailable(err):
                raise _NamespaceGoingAway from err
            found = _write_failed(token_create_failed(name, reports), err)
            return _TokenCheck(pdd.uid, missing=True, found=found)  # tried again next pass
        if created and reports:
            self._say_token_recreated(pdd, name, reports[0])
        check = _TokenCheck(pdd.uid, answered=newest)
        if not created and not _existing_token_is_ours(
            last, pdd.uid, bool(self.view.children(key))
        ):
            found = _Blocked(ownership.TOKEN_REASON, token_conflict_message(name))
            log.warning("%s/%s: %s", pdd.namespace, pdd.name, found.message)
            check = replace(check, found=found)
            self._retry_later(key, self.conflict_retry_seconds)
        self._tokens[key] = check
        return check

    def _say_token_recreated(self, pdd: PDDeployment, name: str, report: MountFailure) -> None:
        message = token_recreated_message(name, report)
        log.info("%s/%s: %s", pdd.namespace, pdd.name, message)
        body = self.view.pdd_body(_key(pdd))
        if body is not None:
            self.emit_event(body, "Warning", TOKEN_RECREATED, message)

    async def _created_token(self, pdd: PDDeployment) -> bool:
        """Create the sidecar token Secret with a new random token: False when one of its
        name exists (the API server's 409; nothing of it is read)."""
        secret = render_token_secret(pdd, secrets.token_urlsafe(32))
        secret["metadata"]["ownerReferences"] = [owner_reference(pdd)]
        created = await asyncio.to_thread(self.kube.create_if_absent, secret)
        if created:
            self._count_write("create", "Secret")
        return created

    async def _sync_scalers(self, pdd: PDDeployment, scaling: ScalingPlan) -> _Blocked:
        """Create the scale target of each autoscaled role that has none, delete those of
        roles no longer autoscaled, and write what each role runs into its target's status
        (only where it changed). A target's spec is never written after its creation: it is
        the HPA's."""
        key = _key(pdd)
        existing = self.view.scalers(key)
        wanted = scale_target_roles(pdd.spec)
        children = counted_from_pods(self.view.children(key).values(), self.view.pods(key))
        ready = {role: state.ready for role, state in _role_workloads(pdd, children).items()}
        try:
            for role in wanted:
                if role not in existing:
                    if blocked := await self._create_scaler(pdd, role):
                        return blocked
                    continue
                status = scaler_status(pdd, role, scaling, ready)
                if dict(existing[role].status) != status:
                    name = existing[role].name
                    await asyncio.to_thread(
                        self.kube.patch_scaler_status, pdd.namespace, name, status
                    )
                    self._count_write("status", ROLE_SCALER.kind)
            for role, scaler in existing.items():
                if role not in wanted:
                    await asyncio.to_thread(
                        self.kube.delete, ROLE_SCALER, pdd.namespace, scaler.name, scaler.uid
                    )
                    self._count_write("delete", ROLE_SCALER.kind)
        except Exception as err:  # surfaced as a condition + event, not a trace
            if namespace_unavailable(err):
                raise _NamespaceGoingAway from err
            blocked = _write_failed("could not write the scale targets", err)
            log.warning("%s/%s: %s", pdd.namespace, pdd.name, blocked.message)
            return blocked
        return _Blocked()

    async def _create_scaler(self, pdd: PDDeployment, role: str) -> _Blocked | None:
        """Create the role's scale target; when its name is taken, say by whom unless it is
        this deployment's own (created by an earlier pass, not indexed yet)."""
        scaler = render_scaler(pdd, role)
        created = await asyncio.to_thread(self.kube.create_if_absent, scaler)
        self._count_write("create", ROLE_SCALER.kind)
        if created:
            return None
        name = scaler["metadata"]["name"]
        owners = await asyncio.to_thread(
            self.kube.owner_references, ROLE_SCALER, pdd.namespace, name
        )
        conflict = ownership.name_conflict(ROLE_SCALER.kind, name, owners or [], pdd.uid)
        if owners is None or conflict is None:
            return None
        message = ownership.scaler_conflict_message(conflict, role)
        log.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
        return _Blocked(ownership.REASON, message)

    def _refusals(self, children: Iterable[ChildSummary]) -> list[Refusal]:
        """The engine StatefulSets short of pods whose newest pod creation was refused (a
        FailedCreate Event arriving later asks for a pass of its own)."""
        return [
            Refusal(summary.role, summary.key[2], message)
            for summary in children
            if summary.key[1] == "StatefulSet"
            and summary.workload is not None
            and summary.workload.pods < summary.workload.desired
            and (message := self.view.creation_refusal(summary.uid))
        ]

    # ------------------------------------------------------------------------------ status

    def _observed(
        self,
        pdd: PDDeployment,
        desired: _Desired,
        placement: PlacementResult,
        blocked: _Blocked,
        scaling: _Scaling,
        outcome: TransferOutcome | None,
    ) -> Observed:
        key = _key(pdd)
        pods = self.view.pods(key)
        counted = self._found_by_routers(pdd, pods) if pdd.spec.autoscaling else pods
        children = counted_from_pods(self.view.children(key).values(), counted)
        workloads = _role_workloads(pdd, children, desired.hashes)
        routers = pdd.spec.router.replicas * max(len(scaling.slices), 1)
        wanted = {
            "prefill": scaling.plan.replicas["prefill"],
            "decode": scaling.plan.replicas["decode"],
            "router": routers if pdd.spec.router.enabled else 0,
        }
        return Observed(
            workloads=workloads,
            wanted=wanted,
            revision=engine_revision(pdd.spec),
            pod_problems=[*pod_problems(pods, self.view.node_ready), *self._token_problems(pdd)],
            pod_nodes=pod_nodes(pods, self.view.node_ready),
            placement=placement,
            transfer=outcome.status if outcome else None,
            transfer_ok=outcome.ok if outcome else None,
            transfer_reason=outcome.reason if outcome else "",
            apply_error=blocked.message,
            apply_error_reason=blocked.reason or APPLY_FAILED,
            apply_error_transient=blocked.transient,
            refusals=self._refusals(children),
        )

    def _token_problems(self, pdd: PDDeployment) -> list[PodProblem]:
        if not sidecar_enabled(pdd.spec):
            return []
        name = names.token_secret_name(pdd.name, pdd.uid)
        reports = self.view.mount_failures(pdd.namespace, name)
        return token_mount_problems(self.view.pods(_key(pdd)), reports, name, _now())

    def _found_by_routers(self, pdd: PDDeployment, pods: Sequence[PodSummary]) -> list[PodSummary]:
        """The pods, those Ready for less than DISCOVERY_GRACE_S counted as not ready yet: an
        autoscaled deployment's router is Ready without workers, so its status may say Ready
        only once the router can have found them. A pass is due when the next one may have."""
        now = time.time()
        waits = {pod.uid: discovery_wait(pod.ready_since, now) for pod in pods if pod.ready}
        if pending := [wait for wait in waits.values() if wait > 0]:
            self._retry_later(_key(pdd), min(pending))
        return [replace(pod, ready=False) if waits.get(pod.uid, 0) > 0 else pod for pod in pods]

    async def _status(self, pdd: PDDeployment, observed: Observed) -> PDDeploymentStatus:
        """The status of this pass, computed once: a transfer probe asked for on the way
        is part of what was observed."""
        now = _now()
        requested = await self._request_probe_if_due(pdd, observed, now)
        return compute_status(pdd, replace(observed, probe_requested_at=requested), now)

    async def _request_probe_if_due(self, pdd: PDDeployment, observed: Observed, now: str) -> str:
        """Stamp a probe request on the prober pod when one is due; the request time, or ""
        when none was made."""
        if per_rank_probes(pdd):
            return await self._request_rank_probes_if_due(pdd, observed, now)
        probe_pod = prober(self.view.pods(_key(pdd)), pdd.name, pdd.spec.prefill.nodesPerInstance)
        if probe_pod is None or not probe_due(pdd, is_ready(observed), probe_pod, now):
            return ""
        try:
            annotations = {names.ANNOTATION_PROBE_REQUEST: now}
            await asyncio.to_thread(self._annotate_pod, pdd.namespace, probe_pod.name, annotations)
        except Exception as err:  # the next reconcile asks again
            log.warning("could not request a transfer probe from %s: %s", probe_pod.name, err)
            return ""
        self._count_write("probe-request", "Pod")
        return now

    async def _request_rank_probes_if_due(
        self, pdd: PDDeployment, observed: Observed, now: str
    ) -> str:
        """Probers with a named peer (the ranks of instances over several nodes, or the
        slices): stamp the round's request id on every ready one that is due, each with the
        decode pod it measures against; the request id, or "" when none was made."""
        probers = rank_probers(pdd, self.view.pods(_key(pdd)))
        asked = ""
        for pod, request in rank_probe_requests(pdd, is_ready(observed), probers, now):
            try:
                await asyncio.to_thread(self._annotate_pod, pdd.namespace, pod, request)
            except Exception as err:  # that rank is asked again at the next round
                log.warning("could not request a transfer probe from %s: %s", pod, err)
                continue
            self._count_write("probe-request", "Pod")
            asked = request[names.ANNOTATION_PROBE_REQUEST]
        return asked

    async def _write_status(
        self, pdd: PDDeployment, body: Mapping[str, Any], status: PDDeploymentStatus
    ) -> None:
        """Write the status when it changed; then post an event per condition that flipped."""
        new = status.model_dump(mode="json")
        old = PDDeploymentStatus.model_validate(body.get("status") or {}).model_dump(mode="json")
        if new == old and (body.get("status") or {}).get("observedGeneration") == pdd.generation:
            return
        version = await asyncio.to_thread(self.kube.patch_status, pdd.namespace, pdd.name, new)
        self._own_writes.remember(_key(pdd), body, version, new)
        self._count_write("status", "PDDeployment")
        for event in transition_events(pdd.status.conditions, status.conditions):
            self.emit_event(body, *event)

    async def _report_invalid(self, body: Mapping[str, Any], err: ValidationError) -> None:
        """Stalled=True and Ready=False with the fix in the message, then a Warning event;
        both only when the conditions change, so a resync of the same object writes nothing."""
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        generation = int(meta.get("generation") or 1)
        message = invalid_spec_message(err.title, err.errors(include_url=False))
        old = dict(body.get("status") or {})
        previous = _readable_conditions(old)
        conditions = invalid_spec_conditions(previous, generation, message, _now())
        if conditions == previous and old.get("observedGeneration") == generation:
            return
        patch = {
            "observedGeneration": generation,
            "conditions": [c.model_dump(mode="json") for c in conditions],
        }
        version = await asyncio.to_thread(self.kube.patch_status, *key, patch)
        self._own_writes.remember(key, body, version, {**old, **patch})
        self._count_write("status", "PDDeployment")
        self.emit_event(body, "Warning", "InvalidSpec", message)
        log.warning("invalid PDDeployment %s/%s: %s", *key, message)

    def _count_write(self, verb: str, kind: str) -> None:
        if self.metrics:
            self.metrics.writes.labels(verb=verb, kind=kind).inc()


REFERENCED_FIRST = frozenset({"Role", "ServiceAccount"})
WORKLOAD_KINDS = frozenset({"StatefulSet", "Deployment"})


def _apply_waves(objects: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Roles and ServiceAccounts; then what the pods use (a RoleBinding is refused while its
    Role does not exist: the API server checks that the operator holds the rules it grants);
    then the workloads, so that no pod is created while one of the objects it would run
    against is someone else's (empty waves left out)."""
    first = [obj for obj in objects if obj["kind"] in REFERENCED_FIRST]
    workloads = [obj for obj in objects if obj["kind"] in WORKLOAD_KINDS]
    rest = [obj for obj in objects if obj["kind"] not in REFERENCED_FIRST | WORKLOAD_KINDS]
    return [wave for wave in (first, rest, workloads) if wave]


def _held_by(
    conflicts: Sequence[ownership.NameConflict], desired: _Desired
) -> tuple[ChildKey, ...]:
    """The children not written while these names are taken: theirs, and every child that
    would run against the object holding one (rendering.dependencies), in apply order."""
    if not conflicts:
        return ()
    objects = desired.objects()
    held = set(dependencies.held_with({(c.kind, c.name) for c in conflicts}, objects))
    return tuple(child_key(o) for o in objects if (o["kind"], o["metadata"]["name"]) in held)


def _changes(
    desired: _Desired,
    observed: Mapping[ChildKey, ChildSummary],
    corrections: Mapping[ChildKey, Correction],
    held: frozenset[ChildKey] = frozenset(),
) -> _Changes:
    """A child differs when it is missing (deleted by hand included: the watch drops it from
    the index), when it was rendered from other inputs (its applied-hash), or when someone
    changed a field the operator owns (status.corrections.drifted). Held children are left
    as they are."""
    differ = {
        key
        for key, wanted_hash in desired.hashes.items()
        if key not in held and (key not in observed or observed[key].applied_hash != wanted_hash)
    }
    drift = frozenset(
        key
        for key, wanted in desired.owned.items()
        if key not in differ
        and key not in held
        and drifted(observed[key], wanted, corrections.get(key))
    )
    changed = differ | drift
    objects = [obj for obj in desired.objects() if child_key(obj) in changed] if changed else []
    stale = tuple(key for key in observed if key not in desired.hashes)
    return _Changes(objects, drift, stale)


def _gang_children(pdd: PDDeployment, desired: _Desired) -> frozenset[ChildKey]:
    """The instances over several nodes and their gang objects: what waits for the gang
    scheduler (single-node roles go ahead)."""
    wanted = set()
    for role in multinode_roles(pdd):
        wanted.add(names.role_name(pdd.name, role))  # its Workload
        instances = range(role_spec(pdd.spec, role).replicas)
        wanted.update(names.instance_name(pdd.name, role, i) for i in instances)
    return frozenset(
        key
        for key in desired.hashes
        if key[1] in ("StatefulSet", "Workload", "PodGroup") and key[2] in wanted
    )


def _engine_workloads(desired: _Desired) -> frozenset[ChildKey]:
    """The prefill and decode StatefulSets: what waits while the model is not available.
    Existing ones keep running as they are (their pods loaded the model already)."""
    return frozenset(key for key in desired.hashes if key[1] == "StatefulSet")


def _kv_path_problem(outcome: TransferOutcome | None) -> str:
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


def _transfer_outcome(pdd: PDDeployment, pods: Sequence[PodSummary]) -> TransferOutcome | None:
    """The one prober's verdict, or every prefill rank's where instances span nodes."""
    if per_rank_probes(pdd):
        return rank_transfer_outcome(pdd, rank_probers(pdd, pods))
    return transfer_outcome(pdd, prober(pods, pdd.name, pdd.spec.prefill.nodesPerInstance))


def _slice_of(pdd: PDDeployment, child_name: str) -> int:
    """The slice a child belongs to by its name (names.slice_name); 0: the home slice."""
    for role in (*names.ROLES, "router"):
        prefix = names.role_name(pdd.name, role) + "-s"
        if child_name.startswith(prefix) and child_name[len(prefix) :].isdigit():
            return int(child_name[len(prefix) :])
    return 0


def _role_workloads(
    pdd: PDDeployment,
    children: Iterable[ChildSummary],
    hashes: Mapping[ChildKey, str] | None = None,
) -> dict[str, WorkloadState]:
    """Each role's workload state: its StatefulSet (or router Deployment); summed over the
    slices where it has one per slice, counted in instances where instances span nodes.
    With the render's `hashes`, a workload not yet at its render counts as unsettled."""
    seen: dict[str, list[tuple[int, WorkloadState]]] = {}
    for summary in children:
        if summary.workload is None or not summary.role:
            continue
        state = summary.workload
        if hashes is not None:
            state = _as_seen(state, summary.applied_hash, hashes.get(summary.key))
        seen.setdefault(summary.role, []).append((_slice_of(pdd, summary.key[2]), state))
    workloads = {}
    for role, found in seen.items():
        states = [state for _, state in sorted(found, key=lambda pair: pair[0])]
        if len(states) == 1:
            workloads[role] = states[0]
        elif role in names.ROLES and role_spec(pdd.spec, role).nodesPerInstance > 1:
            workloads[role] = instances_state(states)
        else:
            workloads[role] = slices_state(states)
    return workloads


def _key(pdd: PDDeployment) -> DeploymentKey:
    return (pdd.namespace, pdd.name)


def _readable_conditions(status: Mapping[str, Any]) -> list[Condition]:
    readable = []
    for raw in status.get("conditions") or []:
        try:
            readable.append(Condition.model_validate(raw))
        except ValidationError:
            continue  # written by someone else: replaced by what this operator writes
    return readable


class _NamespaceGoingAway(Exception):
    """A child could not be created because its namespace is being deleted or is gone."""


def _reused_fingerprint(
    cached: _Rendered | None, uid: str, key: ChildKey, applied_hash: str
) -> str:
    """The owned-fields fingerprint of the previous render's child, when the child rendered
    the same again for the same PDDeployment: most children do not change when one input of
    the render does (a pod placed, a partition moved). The applied hash covers the whole
    object but its owner reference, which names the PDDeployment's uid: a namesake created
    again renders some children the same, owned by another uid."""
    if cached is None or cached.inputs[0] != uid or cached.hashes.get(key) != applied_hash:
        return ""
    return cached.owned.get(key, "")


def _applied_hash(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH])


def _as_seen(workload: WorkloadState, seen_hash: str, wanted_hash: str | None) -> WorkloadState:
    """A workload whose watch copy predates what this pass applied counts as not yet observed
    by its controller: its old copy may be fully ready, and the PDDeployment must not say
    Ready for a generation whose rollout has not started."""
    if wanted_hash is None or seen_hash == wanted_hash:
        return workload
    return replace(workload, generation=workload.observed_generation + 1)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
