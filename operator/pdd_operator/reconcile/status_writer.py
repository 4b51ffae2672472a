"""The status part of a pass: what was observed, the transfer probe asked for when one is
due, the status computed once and written only when it changed, an event per condition
that flipped, and the KV-transfer metrics. Also the status of a spec that does not parse.
Adding a condition touches status/ (compute and conditions) and, for what it observes,
`observe` here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from pydantic import ValidationError

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import names
from pdd_operator.api.names import DeploymentKey
from pdd_operator.api.v1alpha1 import Condition, PDDeployment, PDDeploymentStatus, SliceStatus
from pdd_operator.kube.resources import POD
from pdd_operator.planning.autoscaling import discovery_wait
from pdd_operator.planning.probe_pairs import per_rank_probes
from pdd_operator.reconcile.memory import DeploymentRecord as Record
from pdd_operator.reconcile.outcome import Blocked
from pdd_operator.reconcile.plan import PassPlan
from pdd_operator.reconcile.ports import Ports, key_of, now
from pdd_operator.reconcile.prerequisites import Readiness
from pdd_operator.reconcile.workloads import role_workloads
from pdd_operator.rendering.roles import engine_revision
from pdd_operator.rendering.sidecar import sidecar_enabled
from pdd_operator.status.compute import (
    APPLY_FAILED,
    Observed,
    PodProblem,
    compute_status,
    is_ready,
)
from pdd_operator.status.conditions import transition_events
from pdd_operator.status.invalid import invalid_spec_conditions, invalid_spec_message
from pdd_operator.status.observe import (
    ChildKey,
    ChildSummary,
    PodSummary,
    counted_from_pods,
    pod_nodes,
    pod_problems,
)
from pdd_operator.status.own_writes import after_write
from pdd_operator.status.refusals import Refusal
from pdd_operator.status.token import token_mount_problems
from pdd_operator.status.transfer import probe_due, prober, rank_probe_requests, rank_probers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seen:
    """What a pass observed, and in how many seconds a pod may have become countable
    (an autoscaled deployment's pods count once the router can have found them)."""

    observed: Observed
    again_in: float | None = None


class StatusWriter:
    def __init__(self, ports: Ports) -> None:
        self.ports = ports

    def forget(self, key: DeploymentKey) -> None:
        if self.ports.metrics:
            self.ports.metrics.forget_kv_transfer(key)

    def observe(
        self,
        hashes: Mapping[ChildKey, str],
        plan: PassPlan,
        blocked: Blocked,
        readiness: Readiness,
    ) -> Seen:
        """What the pass observed of the deployment at the plan's counts, with what it
        decided and checked on the way."""
        pdd, scaling, outcome, view = plan.pdd, plan.scaling, plan.transfer, self.ports.view
        pods = view.pods(key_of(pdd))
        counted, again_in = _found_by_routers(pods) if pdd.spec.autoscaling else (pods, None)
        children = counted_from_pods(view.children(key_of(pdd)).values(), counted)
        routers = pdd.spec.router.replicas * max(len(scaling.slices), 1)
        wanted = {
            "prefill": scaling.plan.replicas["prefill"],
            "decode": scaling.plan.replicas["decode"],
            "router": routers if pdd.spec.router.enabled else 0,
        }
        observed = Observed(
            workloads=role_workloads(pdd, children, hashes),
            wanted=wanted,
            revision=engine_revision(pdd.spec),
            pod_problems=[*pod_problems(pods, view.node_ready), *self._token_problems(pdd, pods)],
            pod_nodes=pod_nodes(pods, view.node_ready),
            placement=plan.placement,
            transfer=outcome.status if outcome else None,
            transfer_ok=outcome.ok if outcome else None,
            transfer_reason=outcome.reason if outcome else "",
            apply_error=blocked.message,
            apply_error_reason=blocked.reason or APPLY_FAILED,
            apply_error_transient=blocked.transient,
            refusals=self._refusals(children),
            model=readiness.model,
            gang=readiness.gang,
            parallelism=readiness.parallelism,
            scaled_to_zero=scaling.plan.scaled_to_zero if pdd.spec.autoscaling else None,
            scaling_held=scaling.plan.held if pdd.spec.autoscaling else None,
            slices=[SliceStatus(**asdict(piece)) for piece in scaling.slices],
        )
        return Seen(observed, again_in)

    def _token_problems(self, pdd: PDDeployment, pods: Sequence[PodSummary]) -> list[PodProblem]:
        if not sidecar_enabled(pdd.spec):
            return []
        name = names.token_secret_name(pdd.name, pdd.uid)
        reports = self.ports.view.mount_failures(pdd.namespace, name)
        return token_mount_problems(pods, reports, name, now())

    def _refusals(self, children: Iterable[ChildSummary]) -> list[Refusal]:
        """The engine StatefulSets short of pods whose newest pod creation was refused (a
        FailedCreate Event arriving later asks for a pass of its own)."""
        return [
            Refusal(summary.role, summary.key[2], message)
            for summary in children
            if summary.key[1] == "StatefulSet"
            and summary.workload is not None
            and summary.workload.pods < summary.workload.desired
            and (message := self.ports.view.creation_refusal(summary.uid))
        ]

    async def report(
        self, pdd: PDDeployment, body: Mapping[str, Any], observed: Observed, record: Record
    ) -> None:
        """The status of this pass, computed once (a transfer probe asked for on the way is
        part of what was observed), written when it changed (and remembered in the
        deployment's `record`), and the KV path's metrics."""
        stamp = now()
        requested = await self._request_probe_if_due(pdd, observed, stamp)
        status = compute_status(pdd, replace(observed, probe_requested_at=requested), stamp)
        await self._write(pdd, body, status, record)
        self._export_transfer(key_of(pdd), observed.transfer_ok, status)

    async def _request_probe_if_due(self, pdd: PDDeployment, observed: Observed, at: str) -> str:
        """Stamp a probe request on the prober pod when one is due; the request time, or ""
        when none was made."""
        if per_rank_probes(pdd):
            return await self._request_rank_probes_if_due(pdd, observed, at)
        pods = self.ports.view.pods(key_of(pdd))
        probe_pod = prober(pods, pdd.name, pdd.spec.prefill.nodesPerInstance)
        if probe_pod is None or not probe_due(pdd, is_ready(observed), probe_pod, at):
            return ""
        try:
            annotations = {names.ANNOTATION_PROBE_REQUEST: at}
            await asyncio.to_thread(self._annotate_pod, pdd.namespace, probe_pod.name, annotations)
        except Exception as err:  # the next reconcile asks again
            log.warning("could not request a transfer probe from %s: %s", probe_pod.name, err)
            return ""
        self.ports.count_write("probe-request", "Pod")
        return at

    async def _request_rank_probes_if_due(
        self, pdd: PDDeployment, observed: Observed, at: str
    ) -> str:
        """Probers with a named peer (the ranks of instances over several nodes, or the
        slices): stamp the round's request id on every ready one that is due, each with the
        decode pod it measures against; the request id, or "" when none was made."""
        probers = rank_probers(pdd, self.ports.view.pods(key_of(pdd)))
        asked = ""
        for pod, request in rank_probe_requests(pdd, is_ready(observed), probers, at):
            try:
                await asyncio.to_thread(self._annotate_pod, pdd.namespace, pod, request)
            except Exception as err:  # that rank is asked again at the next round
                log.warning("could not request a transfer probe from %s: %s", pod, err)
                continue
            self.ports.count_write("probe-request", "Pod")
            asked = request[names.ANNOTATION_PROBE_REQUEST]
        return asked

    def _annotate_pod(self, namespace: str, pod: str, annotations: dict[str, str]) -> None:
        """Ask a pod for a probe (in a worker thread), expecting the write's watch echo."""
        result = self.ports.kube.annotate_pod(namespace, pod, annotations)
        self.ports.own_object_writes.expect(POD.plural, result)

    async def _write(
        self, pdd: PDDeployment, body: Mapping[str, Any], status: PDDeploymentStatus, record: Record
    ) -> None:
        """Write the status when it changed; then post an event per condition that flipped."""
        new = status.model_dump(mode="json")
        old = PDDeploymentStatus.model_validate(body.get("status") or {}).model_dump(mode="json")
        if new != old or (body.get("status") or {}).get("observedGeneration") != pdd.generation:
            kube = self.ports.kube
            version = await asyncio.to_thread(kube.patch_status, pdd.namespace, pdd.name, new)
            record.status_write = after_write(record.status_write, body, version, new)
            self.ports.count_write("status", "PDDeployment")
            for event in transition_events(pdd.status.conditions, status.conditions):
                self.ports.emit_event(body, *event)

    def _export_transfer(
        self, key: DeploymentKey, ok: bool | None, status: PDDeploymentStatus
    ) -> None:
        """pdd_kv_transfer_gbps and pdd_kv_transfer_verified from the measurement this pass's
        status shows; no series while no probe has answered."""
        metrics = self.ports.metrics
        if metrics is None:
            return
        if ok is None:
            metrics.forget_kv_transfer(key)
            return
        transfer = status.transfer
        metrics.set_kv_transfer(
            key, transfer.path, status.placement.domain, transfer.measuredGBps, ok
        )

    async def report_invalid(
        self, body: Mapping[str, Any], err: ValidationError, record: Record
    ) -> None:
        """Stalled=True and Ready=False with the fix in the message, then a Warning event;
        both only when the conditions change, so a resync of the same object writes nothing."""
        meta = body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        generation = int(meta.get("generation") or 1)
        message = invalid_spec_message(err.title, err.errors(include_url=False))
        old = dict(body.get("status") or {})
        previous = _readable_conditions(old)
        conditions = invalid_spec_conditions(previous, generation, message, now())
        if conditions == previous and old.get("observedGeneration") == generation:
            return
        patch = {
            "observedGeneration": generation,
            "conditions": [c.model_dump(mode="json") for c in conditions],
        }
        version = await asyncio.to_thread(self.ports.kube.patch_status, *key, patch)
        record.status_write = after_write(record.status_write, body, version, {**old, **patch})
        self.ports.count_write("status", "PDDeployment")
        self.ports.emit_event(body, "Warning", reasons.INVALID_SPEC, message)
        log.warning("invalid PDDeployment %s/%s: %s", *key, message)


def _found_by_routers(pods: Sequence[PodSummary]) -> tuple[list[PodSummary], float | None]:
    """The pods, those Ready for less than DISCOVERY_GRACE_S counted as not ready yet: an
    autoscaled deployment's router is Ready without workers, so its status may say Ready
    only once the router can have found them. A pass is due when the next one may have."""
    at = time.time()
    waits = {pod.uid: discovery_wait(pod.ready_since, at) for pod in pods if pod.ready}
    pending = [wait for wait in waits.values() if wait > 0]
    counted = [replace(pod, ready=False) if waits.get(pod.uid, 0) > 0 else pod for pod in pods]
    return counted, min(pending) if pending else None


def _readable_conditions(status: Mapping[str, Any]) -> list[Condition]:
    readable = []
    for raw in status.get("conditions") or []:
        try:
            readable.append(Condition.model_validate(raw))
        except ValidationError:
            continue  # written by someone else: replaced by what this operator writes
    return readable
