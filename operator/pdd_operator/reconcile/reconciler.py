"""The Reconciler: when a deployment gets a pass (the pass queue), and the pass itself, a
pipeline of parts each in a module of this package: plan -> prerequisites -> children ->
token -> scale targets -> instance restarts -> status. Each part returns what it found
(what blocks the deployment, when to look again); only this module schedules from that."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from pydantic import ValidationError

from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import PDDeployment, SliceStatus
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.pass_queue import PassQueue
from pdd_operator.reconcile import children as child_part
from pdd_operator.reconcile.children import CONFLICT_RETRY_MAX_SECONDS, Children
from pdd_operator.reconcile.memory import DeploymentRecord, Memory
from pdd_operator.reconcile.outcome import NamespaceGoingAway
from pdd_operator.reconcile.plan import PassPlan, commit, plan_pass
from pdd_operator.reconcile.ports import ApiWriter, ClusterView, EventSink, Ports, key_of
from pdd_operator.reconcile.prerequisites import (
    MODEL_RETRY_FIRST_S,
    MODEL_RETRY_MAX_S,
    Prerequisites,
)
from pdd_operator.reconcile.restarts import restart_broken_instances
from pdd_operator.reconcile.scalers import sync_scalers
from pdd_operator.reconcile.status_writer import (
    StatusWriter,
    kv_path_problem,
    pass_transfer_outcome,
)
from pdd_operator.reconcile.token import check_token
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.status import ownership
from pdd_operator.status.compute import Observed
from pdd_operator.status.gang import GangReadiness
from pdd_operator.status.model import ModelReadiness, engine_roles_held
from pdd_operator.status.parallelism import (
    ParallelismVerdict,
    engines_held_by,
    parallelism_verdict,
)

log = logging.getLogger(__name__)

# After a write that failed in a way time may cure (outcome.write_failed), the pass is tried
# again after this many seconds, doubling up to the maximum: nothing else would trigger one
# before the periodic resync. (Each request was already retried a few times within the pass.)
TRANSIENT_RETRY_FIRST_S = 2.0
TRANSIENT_RETRY_MAX_S = 60.0


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
        self._ports = Ports(kube, view, settings, emit_event, metrics)
        self._queue: PassQueue[DeploymentKey] = PassQueue(
            lambda key: self._reconcile_once(key),  # late-bound: tests replace the pass
            self.is_own_status_write,
            lambda key: view.pdd_body(key) is not None,
            self._forget,
            max_concurrent,
            coalesce_max_s,
        )
        self._memory = Memory()
        self._prerequisites = Prerequisites(self._ports, model_retry)
        self._children = Children(self._ports, names_guarded)
        self._status = StatusWriter(self._ports)
        if metrics:
            metrics.deployments_reconciled.set_function(lambda: len(self._memory.keys()))
            metrics.deployments_tracked.set_function(
                lambda: len(self._queue.keys() | self._memory.keys())
            )

    @property
    def settings(self) -> OperatorSettings:
        return self._ports.settings

    @property
    def own_object_writes(self) -> Any:
        """The versions this operator's writes to children and pods produced: their watch
        events ask no pass (informers/owned.py)."""
        return self._ports.own_object_writes

    @property
    def conflict_retry_seconds(self) -> float:
        return self._children.conflict_retry_seconds

    @conflict_retry_seconds.setter
    def conflict_retry_seconds(self, seconds: float) -> None:
        self._children.conflict_retry_seconds = seconds

    def is_own_status_write(self, key: DeploymentKey, resource_version: str) -> bool:
        """Whether this version of the PDDeployment is the status this operator just wrote:
        the pass that wrote it already saw everything else, so its watch event needs no pass."""
        return self._status.own_writes.is_echo(key, resource_version)

    async def deployment_changed(self, key: DeploymentKey, resource_version: str) -> None:
        """A PDDeployment's watch event: a pass, unless it is the echo of our own status
        write. The echo can come before the pass that wrote it has the write's answer; while a
        pass runs, its version waits for that pass to end."""
        if self._queue.needs_pass(key, resource_version):
            await self.reconcile(key, cause="pddeployments")

    async def reconcile(self, key: DeploymentKey, delay: float = 0.0, cause: str = "") -> None:
        """Coalesce triggers (pass_queue): while one pass runs, later triggers collapse into
        one more pass; with a `delay` (child and pod events, which come in bursts) the pass
        waits until no trigger came for `delay` seconds, or `coalesce_max_s` after the first."""
        if self._ports.metrics and cause:
            self._ports.metrics.count_pass_request(cause)
        await self._queue.request(key, delay)

    def _forget(self, key: DeploymentKey) -> None:
        """The deployment is gone: its reservation and everything remembered about it."""
        self._queue.forget(key)
        self._memory.forget(key)
        self._children.forget(key)
        self._status.forget(key)

    def _retry_later(self, key: DeploymentKey, delay: float) -> None:
        """A pass `delay` seconds from now; the sooner of two asks wins (pass_queue)."""
        self._queue.later(key, delay, lambda: self.reconcile(key, cause="retry"))

    async def _reconcile_once(self, key: DeploymentKey) -> None:
        body = self._ports.view.pdd_body(key)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return  # owner references let the garbage collector remove the children
        body = self._status.own_writes.latest(key, body)
        record = self._memory.record(key)
        metrics = self._ports.metrics
        timer = metrics.reconcile_timer() if metrics else None
        try:
            await self._converge_or_report(body, record)
        except Exception:
            if metrics:
                metrics.reconcile_errors.inc()
            raise
        finally:
            if timer:
                timer()

    async def _converge_or_report(self, body: Mapping[str, Any], record: DeploymentRecord) -> None:
        try:
            pdd = PDDeployment.from_body(dict(body))
        except ValidationError as err:
            await self._status.report_invalid(body, err)
            return
        again: list[float] = []  # when the parts ask to look again
        try:
            await self._converge(pdd, body, record, again)
        except NamespaceGoingAway:
            pass  # its namespace is being deleted: nothing to create, nobody to tell
        finally:
            if again:
                self._retry_later(key_of(pdd), min(again))

    def _render(self, pdd: PDDeployment, ctx: RenderContext) -> child_part.Desired:
        return child_part.render(pdd, ctx, self._memory.record(key_of(pdd)))

    async def _converge(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        record: DeploymentRecord,
        again: list[float],
    ) -> None:
        key, view = key_of(pdd), self._ports.view
        transfer = pass_transfer_outcome(pdd, view.pods(key))  # the KV path's verdict, once
        observed = view.children(key)
        ledger = self._memory.reservations
        problem = kv_path_problem(transfer)
        plan = plan_pass(pdd, view, observed, record, ledger, self.settings, problem)
        commit(plan, record, ledger)
        pdd = plan.pdd
        desired = self._render(pdd, plan.context)
        model = await self._prerequisites.model(pdd, record)
        # Looked at, and created when missing, before the engines are applied: their pods
        # mount it, and a Secret of its name that is not this deployment's (found, or planted
        # before a late create) holds a token someone else may know.
        token = await check_token(self._ports, pdd, record)
        parallelism = parallelism_verdict(pdd.spec)
        gang = await self._prerequisites.gang(pdd)
        again += [d for d in (model.again_in, gang.again_in) if d is not None]
        if token.conflicting:
            again.append(self.conflict_retry_seconds)
        hold = engine_roles_held(model.answer) or not token.ours or engines_held_by(parallelism)
        held = child_part.engine_workloads(desired) if hold else frozenset()
        if gang.answer is not None and not gang.answer.ready:
            held |= child_part.gang_children(pdd, desired)
        blocked = await self._children.sync(pdd, body, desired, observed, held)
        self._back_off(key, "conflict", blocked.reason == ownership.REASON, again)
        blocked = blocked if blocked.message else token.found
        if not blocked.message:
            blocked = await sync_scalers(self._ports, pdd, plan.scaling.plan)
        if not blocked.message:
            await restart_broken_instances(self._ports, pdd, body)
        seen = self._status.observe(
            pdd, desired.hashes, plan.placement, blocked, plan.scaling, transfer
        )
        again += [seen.again_in] if seen.again_in is not None else []
        observed_now = _with_plan(seen.observed, plan, model.answer, gang.answer, parallelism)
        status = await self._status.status(pdd, observed_now)
        await self._status.write(pdd, body, status)
        self._status.export_transfer(key, observed_now.transfer_ok, status)
        self._back_off(key, "transient", blocked.transient, again)

    def _back_off(self, key: DeploymentKey, reason: str, lasting: bool, again: list[float]) -> None:
        """Look again at a trouble that lasts (a name conflict, a write time may cure), backing
        off while it does; once over, its count starts again."""
        first, most = {
            "conflict": (self.conflict_retry_seconds, CONFLICT_RETRY_MAX_SECONDS),
            "transient": (TRANSIENT_RETRY_FIRST_S, TRANSIENT_RETRY_MAX_S),
        }[reason]
        delay = self._queue.back_off(key, reason, lasting, first, most)
        if lasting:
            again.append(delay)


def _with_plan(
    observed: Observed,
    plan: PassPlan,
    model: ModelReadiness,
    gang: GangReadiness | None,
    parallelism: ParallelismVerdict | None,
) -> Observed:
    """What was observed, with what the pass decided and checked on the way."""
    autoscaled = plan.pdd.spec.autoscaling is not None
    return replace(
        observed,
        model=model,
        gang=gang,
        parallelism=parallelism,
        scaled_to_zero=plan.scaling.plan.scaled_to_zero if autoscaled else None,
        scaling_held=plan.scaling.plan.held if autoscaled else None,
        slices=[SliceStatus(**asdict(piece)) for piece in plan.scaling.slices],
    )
