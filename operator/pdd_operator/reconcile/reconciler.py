"""The Reconciler: when a deployment gets a pass (the pass queue), and the pass itself, a
pipeline of parts each in a module of this package: plan -> children (around the engines'
prerequisites: model, token Secret, parallelism, gang API) -> scale targets -> instance
restarts -> status.
Each part returns what it found (what blocks the deployment, when to look again); only this
module asks the queue for the next pass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.pass_queue import PassQueue
from pdd_operator.reconcile import children as child_part
from pdd_operator.reconcile.children import CONFLICT_RETRY_MAX_SECONDS, Children
from pdd_operator.reconcile.memory import DeploymentRecord, Memory
from pdd_operator.reconcile.outcome import NamespaceGoingAway
from pdd_operator.reconcile.plan import commit, plan_pass
from pdd_operator.reconcile.ports import ApiWriter, ClusterView, EventSink, Ports, key_of
from pdd_operator.reconcile.prerequisites import (
    MODEL_RETRY_FIRST_S,
    MODEL_RETRY_MAX_S,
    Prerequisites,
)
from pdd_operator.reconcile.restarts import restart_broken_instances
from pdd_operator.reconcile.scalers import sync_scalers
from pdd_operator.reconcile.status_writer import StatusWriter
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.status import own_writes, ownership
from pdd_operator.status.own_writes import OwnObjectWrites

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
    def own_object_writes(self) -> OwnObjectWrites:
        """The versions this operator's writes to children and pods produced: their watch
        events ask no pass (informers/owned.py)."""
        return self._ports.own_object_writes

    @property
    def conflict_retry_seconds(self) -> float:
        return self._prerequisites.conflict_retry_seconds

    @conflict_retry_seconds.setter
    def conflict_retry_seconds(self, seconds: float) -> None:
        self._prerequisites.conflict_retry_seconds = seconds

    def is_own_status_write(self, key: DeploymentKey, resource_version: str) -> bool:
        """Whether this version of the PDDeployment is the status this operator just wrote:
        the pass that wrote it already saw everything else, so its watch event needs no pass."""
        record = self._memory.find(key)
        return own_writes.is_echo(record.status_write if record else None, resource_version)

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
        self._status.forget(key)

    def _retry_later(self, key: DeploymentKey, delay: float) -> None:
        """A pass `delay` seconds from now; the sooner of two asks wins (pass_queue)."""
        self._queue.later(key, delay, lambda: self.reconcile(key, cause="retry"))

    async def _reconcile_once(self, key: DeploymentKey) -> None:
        body = self._ports.view.pdd_body(key)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return  # owner references let the garbage collector remove the children
        record = self._memory.record(key)
        body = own_writes.latest(record.status_write, body)
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
            await self._status.report_invalid(body, err, record)
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
        """One pass, its parts in this order: what each found is passed on, and when each
        asks to look again is collected in `again`."""
        key, view, ledger = key_of(pdd), self._ports.view, self._memory.reservations
        observed = view.children(key)
        plan = plan_pass(pdd, view, observed, record, ledger, self._ports.settings)
        commit(plan, record, ledger)
        pdd = plan.pdd
        desired = self._render(pdd, plan.context)
        children = await self._children.converge(
            pdd, body, desired, observed, record, self._prerequisites
        )
        readiness, conflict, blocked = children.readiness, children.conflict, children.blocked
        again += readiness.again_in
        if not blocked.message:
            blocked = await sync_scalers(self._ports, pdd, plan.scaling.plan)
        if not blocked.message:
            await restart_broken_instances(self._ports, pdd, body)
        seen = self._status.observe(desired.hashes, plan, blocked, readiness)
        again += [seen.again_in] if seen.again_in is not None else []
        await self._status.report(pdd, body, seen.observed, record)
        # Troubles that last (a name someone else holds, a write time may cure) are looked
        # at again with backoff while they do; once over, their count starts again.
        name_taken = conflict.reason == ownership.REASON
        first = self._prerequisites.conflict_retry_seconds
        conflict_delay = self._queue.back_off(
            key, "conflict", name_taken, first, CONFLICT_RETRY_MAX_SECONDS
        )
        transient_delay = self._queue.back_off(
            key, "transient", blocked.transient, TRANSIENT_RETRY_FIRST_S, TRANSIENT_RETRY_MAX_S
        )
        again += [conflict_delay] if name_taken else []
        again += [transient_delay] if blocked.transient else []
