"""One idempotent reconcile for a PDDeployment: plan -> render -> apply -> prune -> status.

Every trigger (the object changed, a child changed, a pod changed, the periodic resync, the
operator restarted) calls the same `Reconciler.reconcile`. It reads only the operator's
in-memory indexes (watch-fed caches), writes only what differs from them, and writes status
only when it changed, so a resync of an unchanged PDDeployment makes no API write at all.

"Differs" includes a child changed by hand (scaled, an env var removed, deleted): the index
keeps a digest of the live values of the fields the operator owns (status.drift), and a child
whose digest is not the render's is applied again, which takes those fields back.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import Condition, PDDeployment, PDDeploymentStatus
from pdd_operator.kube.client import KubeApi, api_error_message, namespace_unavailable
from pdd_operator.kube.resources import kind_of
from pdd_operator.planning.placement import Fleet, PlacementResult, plan_placement
from pdd_operator.rendering.children import child_key, owner_reference, render_children
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.rendering.roles import engine_revision
from pdd_operator.rendering.sidecar import render_token_secret, sidecar_enabled
from pdd_operator.status.compute import Observed, WorkloadState, compute_status
from pdd_operator.status.conditions import find
from pdd_operator.status.drift import live_fingerprint, rendered_fingerprint
from pdd_operator.status.invalid import invalid_spec_conditions, invalid_spec_message
from pdd_operator.status.observe import ChildKey, ChildSummary, PodSummary, pod_problems
from pdd_operator.status.rollout import rollout_partitions
from pdd_operator.status.transfer import probe_due, prober, transfer_outcome

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


class ClusterView(Protocol):
    """What the reconciler reads: the operator's watch-fed indexes."""

    def pdd_body(self, key: Key) -> Mapping[str, Any] | None: ...
    def children(self, key: Key) -> Mapping[ChildKey, ChildSummary]: ...
    def pods(self, key: Key) -> Sequence[PodSummary]: ...
    def fleet(self) -> Fleet: ...
    def node_ready(self, name: str) -> bool | None: ...


EventSink = Callable[[Mapping[str, Any], str, str, str], None]  # body, type, reason, message


@dataclass
class _KeyState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False
    due: bool = False  # a delayed pass is already waiting to start


@dataclass(frozen=True)
class _Desired:
    """The children a pass wants: their fingerprints, and the objects on demand."""

    hashes: Mapping[ChildKey, str]  # of the rendered object (its applied-hash annotation)
    owned: Mapping[ChildKey, str]  # of the fields it sets, as status.drift spells them
    objects: Callable[[], list[dict[str, Any]]]


@dataclass(frozen=True)
class _Correction:
    """A child this operator applied again because its owned fields had drifted.

    resourceVersions are opaque (only equality means anything, see _OwnWrite): the drifted
    copy the pass read is known to predate the correction, so an index still holding it is
    not corrected again; any other version is the correction, a later change or one never
    seen, and is judged by its digest."""

    wanted: str  # the render's owned-fields digest it was put back to
    result: str  # the digest of the object that apply returned
    version: str  # that object's resourceVersion
    read: str  # the resourceVersion of the drifted copy the pass read


@dataclass(frozen=True)
class _Reservation:
    """Where a deployment was placed and how many GPUs its slice needs."""

    level: str
    domain: str
    needed: int


class Reconciler:
    def __init__(
        self,
        kube: KubeApi,
        view: ClusterView,
        settings: OperatorSettings,
        emit_event: EventSink,
        metrics: Any = None,
        max_concurrent: int = 64,
    ) -> None:
        self.kube = kube
        self.view = view
        self.settings = settings
        self.emit_event = emit_event
        self.metrics = metrics
        self._states: dict[Key, _KeyState] = {}
        # Bounds the passes in flight (kopf's per-object workers are unbounded): each holds
        # rendered children and API calls; beyond the API pool more only queue.
        self._passes = asyncio.Semaphore(max_concurrent)
        self._tokens: set[tuple[str, str, str]] = set()
        # Where each deployment was placed and how many GPUs it needs, so slices planned at
        # the same time do not count the same free GPUs (planning.placement).
        self._placements: dict[Key, _Reservation] = {}
        # Each deployment's last status write and the resourceVersion it produced: to recognise
        # its watch echo, and to read our own write when the index copy still lags behind it.
        self._own_writes: dict[Key, _OwnWrite] = {}
        # Reservations summed per domain, for one fleet snapshot (see _reserved_elsewhere).
        self._reserved_totals: tuple[Fleet, dict[tuple[str, str], int]] | None = None
        # The children last rendered per deployment, with what they were rendered from.
        self._rendered: dict[Key, tuple[Any, dict[ChildKey, str], dict[ChildKey, str]]] = {}
        # Children put back after drift, per deployment (see _drifted).
        self._corrections: dict[Key, dict[ChildKey, _Correction]] = {}

    def is_own_status_write(self, key: Key, resource_version: str) -> bool:
        """Whether this version of the PDDeployment is the status this operator just wrote:
        the pass that wrote it already saw everything else, so its watch event needs no pass."""
        written = self._own_writes.get(key)
        return (
            bool(resource_version) and written is not None and written.version == resource_version
        )

    async def reconcile(self, key: Key, delay: float = 0.0) -> None:
        """Coalesce triggers: while one pass runs, later triggers collapse into one more pass.

        With a `delay` (child and pod events, which come in bursts: a pod is scheduled, bound,
        started, becomes ready) the pass waits that long first, and every trigger of the same
        key arriving meanwhile is answered by that one pass: it reads the indexes when it runs.
        """
        state = self._states.setdefault(key, _KeyState())
        if delay > 0:
            if state.due:
                return
            state.due = True
            try:
                await asyncio.sleep(delay)
            finally:
                state.due = False
        if state.lock.locked():
            state.dirty = True
            return
        async with state.lock:
            state.dirty = True
            while state.dirty:
                state.dirty = False
                async with self._passes:
                    await self._reconcile_once(key)
        if self.view.pdd_body(key) is None:
            self._states.pop(key, None)
            self._set_reservation(key, None)
            self._own_writes.pop(key, None)
            self._rendered.pop(key, None)
            self._corrections.pop(key, None)

    async def _reconcile_once(self, key: Key) -> None:
        body = self.view.pdd_body(key)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return  # owner references let the garbage collector remove the children
        body = self._with_own_status(key, body)
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

    def _with_own_status(self, key: Key, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The body with the status this operator last wrote, when the index copy predates it.

        A pass triggered by a pod or child event can run before the watch delivers our own
        status write; computing from the older status would rewrite every condition's
        transition time and renew the probe request.
        """
        written = self._own_writes.get(key)
        if written is None or not written.predates(_version(body)):
            return body
        return {**body, "status": written.status}

    async def _converge(self, pdd: PDDeployment, body: Mapping[str, Any]) -> None:
        placement = self._plan(pdd)
        observed = self.view.children((pdd.namespace, pdd.name))
        partitions = rollout_partitions(
            engine_revision(pdd.spec),
            {"prefill": pdd.spec.prefill.replicas, "decode": pdd.spec.decode.replicas},
            observed,
            self.view.pods((pdd.namespace, pdd.name)),
        )
        ctx = RenderContext(self.settings, placement.placement, partitions)
        desired = self._render(pdd, ctx)
        try:
            apply_error = await self._sync_children(pdd, body, desired, observed)
        except _NamespaceGoingAway:
            return  # its namespace is being deleted: nothing to create, nobody to tell
        if not apply_error:
            apply_error = await self._ensure_token(pdd)
        now = _now()
        status = compute_status(pdd, self._observed(pdd, desired, placement, apply_error), now)
        status = await self._request_probe_if_due(pdd, status, now)
        await self._write_status(pdd, body, status)

    def _render(self, pdd: PDDeployment, ctx: RenderContext) -> _Desired:
        """The children's fingerprints, rendered again only when their inputs changed (the
        spec's generation or the context): most passes answer pod progress and change neither.
        Only the fingerprints are kept (the objects are ~70 KiB per deployment in memory); the
        objects are rendered again when one must be applied."""
        key = (pdd.namespace, pdd.name)
        inputs = (pdd.uid, pdd.generation, ctx)
        cached = self._rendered.get(key)
        if cached is not None and cached[0] == inputs:
            return _Desired(cached[1], cached[2], lambda: render_children(pdd, ctx))
        objects = render_children(pdd, ctx)
        hashes = {child_key(obj): _applied_hash(obj) for obj in objects}
        owned = {child_key(obj): rendered_fingerprint(obj) for obj in objects}
        self._rendered[key] = (inputs, hashes, owned)
        return _Desired(hashes, owned, lambda: objects)

    async def _request_probe_if_due(
        self, pdd: PDDeployment, status: PDDeploymentStatus, now: str
    ) -> PDDeploymentStatus:
        probe_pod = prober(self.view.pods((pdd.namespace, pdd.name)), pdd.name)
        ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions)
        if probe_pod is None or not probe_due(pdd, ready, probe_pod, now):
            return status
        try:
            annotations = {names.ANNOTATION_PROBE_REQUEST: now}
            await asyncio.to_thread(
                self.kube.annotate_pod, pdd.namespace, probe_pod.name, annotations
            )
        except Exception as err:  # the next reconcile asks again
            log.warning("could not request a transfer probe from %s: %s", probe_pod.name, err)
            return status
        self._count_write("probe-request", "Pod")
        transfer = status.transfer.model_copy(update={"requestedAt": now})
        return status.model_copy(update={"transfer": transfer})

    def _plan(self, pdd: PDDeployment) -> PlacementResult:
        key = (pdd.namespace, pdd.name)
        if pdd.spec.topology.placement == "none":
            self._set_reservation(key, None)
            return plan_placement(pdd.spec, (), pdd.status.placement)
        previous = pdd.status.placement
        mine = self._placements.get(key)
        if mine is not None and not previous.domain:  # status not written back yet
            previous = previous.model_copy(update={"level": mine.level, "domain": mine.domain})
        fleet = self.view.fleet()
        own = fleet.held.get(key, {})
        refused = any(
            p.problem is not None and p.problem.reason == "Unschedulable"
            for p in self.view.pods(key)
        )
        reserved = self._reserved_elsewhere(key, fleet)
        result = plan_placement(pdd.spec, fleet, previous, reserved, own, refused)
        mark = None
        if result.placed and result.placement.domain:
            needed = sum(
                r.replicas * r.gpusPerInstance for r in (pdd.spec.prefill, pdd.spec.decode)
            )
            mark = _Reservation(result.placement.level, result.placement.domain, needed)
        self._set_reservation(key, mark)
        return result

    def _set_reservation(self, key: Key, mark: _Reservation | None) -> None:
        if self._placements.get(key) == mark:
            return
        if mark is None:
            self._placements.pop(key, None)
        else:
            self._placements[key] = mark
        self._reserved_totals = None

    def _reserved_elsewhere(self, key: Key, fleet: Fleet) -> dict[tuple[str, str], int]:
        """GPUs other deployments were placed on that the fleet snapshot does not yet count as
        used by their pods (planned, or bound after the snapshot was taken).

        Summed over all deployments once per snapshot and placement change, not per pass (at
        1,000 deployments the per-pass sum was the operator's largest own cost)."""
        if self._reserved_totals is None or self._reserved_totals[0] is not fleet:
            totals: dict[tuple[str, str], int] = {}
            for other, mark in self._placements.items():
                missing = _unbound(mark, fleet, other)
                if missing:
                    where = (mark.level, mark.domain)
                    totals[where] = totals.get(where, 0) + missing
            self._reserved_totals = (fleet, totals)
        reserved = dict(self._reserved_totals[1])
        mine = self._placements.get(key)
        if mine is not None and (missing := _unbound(mine, fleet, key)):
            reserved[(mine.level, mine.domain)] -= missing
        return reserved

    async def _sync_children(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        desired: _Desired,
        observed: Mapping[ChildKey, ChildSummary],
    ) -> str:
        """Apply what differs, delete what is no longer wanted; return a user-facing error.

        A child differs when it is missing (deleted by hand included: the watch drops it from
        the index), when it was rendered from other inputs (its applied-hash), or when
        someone changed a field the operator owns (_drifted)."""
        corrections = self._corrections.get((pdd.namespace, pdd.name), {})
        differ = {
            key
            for key, wanted_hash in desired.hashes.items()
            if key not in observed or observed[key].applied_hash != wanted_hash
        }
        drifted = {
            key
            for key, wanted in desired.owned.items()
            if key not in differ and _drifted(observed[key], wanted, corrections.get(key))
        }
        changed = (
            [obj for obj in desired.objects() if child_key(obj) in differ | drifted]
            if differ or drifted
            else []
        )
        stale = [key for key in observed if key not in desired.hashes]
        if corrections:  # one rendered anew since says nothing about the new render
            self._forget_corrections(pdd, desired)
        try:
            # Two waves, each sent at once. A RoleBinding is refused while its Role does not
            # exist (the API server checks that the operator holds the rules it grants); the
            # rest need no order (a pod waiting for its ServiceAccount is retried).
            for wave in _apply_waves(changed):
                results = await asyncio.gather(
                    *(
                        asyncio.to_thread(
                            self.kube.apply, obj, want_result=child_key(obj) in drifted
                        )
                        for obj in wave
                    )
                )
                for obj, result in zip(wave, results, strict=True):
                    if (key := child_key(obj)) in drifted:
                        correction = _Correction(
                            wanted=desired.owned[key],
                            result=live_fingerprint(result, self.settings.field_manager),
                            version=str(result.get("metadata", {}).get("resourceVersion", "")),
                            read=observed[key].resource_version,
                        )
                        self._put_back(pdd, body, obj, correction)
            for obj in changed:
                self._count_write("apply", obj["kind"])
            await asyncio.gather(
                *(
                    asyncio.to_thread(self.kube.delete, kind_of(v, k), pdd.namespace, n)
                    for v, k, n in stale
                )
            )
            for _, kind, _ in stale:
                self._count_write("delete", kind)
        except Exception as err:  # surfaced as a condition + event, not a trace
            if namespace_unavailable(err):
                raise _NamespaceGoingAway from err
            message = api_error_message(err)
            log.warning("applying children of %s/%s failed: %s", pdd.namespace, pdd.name, message)
            return f"could not apply children: {message}"
        return ""

    def _put_back(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        obj: Mapping[str, Any],
        correction: _Correction,
    ) -> None:
        """Record a drift correction; tell the user when one of their changes was undone.

        The digest of what the apply returned is remembered: when it is not the render's
        (the server spells some owned value in a way status.drift does not know, or an
        admission webhook rewrote it), that digest counts as undrifted from now on, so the
        gap costs one write and never a loop."""
        corrections = self._corrections.setdefault((pdd.namespace, pdd.name), {})
        key = child_key(dict(obj))
        previous = corrections.get(key)
        corrections[key] = correction
        if previous is not None and previous.version == correction.version:
            # The apply changed nothing: the pass read a drifted copy written before the
            # last correction and delivered after it (a status update of the scaled
            # StatefulSet); that correction already told the user.
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

    def _forget_corrections(self, pdd: PDDeployment, desired: _Desired) -> None:
        key = (pdd.namespace, pdd.name)
        corrections = self._corrections[key]
        for child in list(corrections):
            if corrections[child].wanted != desired.owned.get(child):
                del corrections[child]
        if not corrections:
            del self._corrections[key]

    async def _ensure_token(self, pdd: PDDeployment) -> str:
        ident = (pdd.namespace, pdd.name, pdd.uid)
        if not sidecar_enabled(pdd.spec) or ident in self._tokens:
            return ""
        secret = render_token_secret(pdd, secrets.token_urlsafe(32))
        secret["metadata"]["ownerReferences"] = [owner_reference(pdd)]
        try:
            await asyncio.to_thread(self.kube.create_if_absent, secret)
        except Exception as err:
            return f"could not create the sidecar token Secret: {api_error_message(err)}"
        self._tokens.add(ident)
        return ""

    def _observed(
        self,
        pdd: PDDeployment,
        desired: _Desired,
        placement: PlacementResult,
        apply_error: str,
    ) -> Observed:
        key = (pdd.namespace, pdd.name)
        children = self.view.children(key)
        workloads = {
            summary.role: _as_seen(summary.workload, summary.applied_hash, desired.hashes.get(k))
            for k, summary in children.items()
            if summary.workload is not None and summary.role
        }
        pods = self.view.pods(key)
        outcome = transfer_outcome(pdd, prober(pods, pdd.name))
        wanted = {
            "prefill": pdd.spec.prefill.replicas,
            "decode": pdd.spec.decode.replicas,
            "router": pdd.spec.router.replicas if pdd.spec.router.enabled else 0,
        }
        return Observed(
            workloads=workloads,
            wanted=wanted,
            revision=engine_revision(pdd.spec),
            pod_problems=pod_problems(pods, self.view.node_ready),
            placement=placement,
            transfer=outcome.status if outcome else None,
            transfer_ok=outcome.ok if outcome else None,
            transfer_reason=outcome.reason if outcome else "",
            apply_error=apply_error,
        )

    async def _write_status(
        self, pdd: PDDeployment, body: Mapping[str, Any], status: PDDeploymentStatus
    ) -> None:
        new = status.model_dump(mode="json")
        old = PDDeploymentStatus.model_validate(body.get("status") or {}).model_dump(mode="json")
        if new == old and (body.get("status") or {}).get("observedGeneration") == pdd.generation:
            return
        version = await asyncio.to_thread(self.kube.patch_status, pdd.namespace, pdd.name, new)
        self._remember_write((pdd.namespace, pdd.name), body, version, new)
        self._count_write("status", "PDDeployment")
        self._emit_transitions(body, pdd.status.conditions, status.conditions)

    def _emit_transitions(
        self, body: Mapping[str, Any], before: Sequence[Condition], after: Sequence[Condition]
    ) -> None:
        """Events after the status write succeeded, one per condition that flipped."""
        for cond in after:
            old = find(before, cond.type)
            if old is not None and old.status == cond.status and old.reason == cond.reason:
                continue
            event = _event_for(cond)
            if event:
                self.emit_event(body, *event)

    def _remember_write(
        self, key: Key, body: Mapping[str, Any], version: str, status: dict[str, Any]
    ) -> None:
        if version:  # "" when the object was gone
            self._own_writes[key] = _OwnWrite.after(
                self._own_writes.get(key), _version(body), version, status
            )

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
        self._remember_write(key, body, version, {**old, **patch})
        self._count_write("status", "PDDeployment")
        self.emit_event(body, "Warning", "InvalidSpec", message)
        log.warning("invalid PDDeployment %s/%s: %s", *key, message)

    def _count_write(self, verb: str, kind: str) -> None:
        if self.metrics:
            self.metrics.writes.labels(verb=verb, kind=kind).inc()


REFERENCED_FIRST = frozenset({"Role", "ServiceAccount"})


def _apply_waves(objects: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Roles and ServiceAccounts, then everything else (empty waves left out)."""
    first = [obj for obj in objects if obj["kind"] in REFERENCED_FIRST]
    rest = [obj for obj in objects if obj["kind"] not in REFERENCED_FIRST]
    return [wave for wave in (first, rest) if wave]


def _unbound(mark: _Reservation, fleet: Fleet, key: Key) -> int:
    return max(mark.needed - sum(fleet.held.get(key, {}).values()), 0)


@dataclass(frozen=True)
class _OwnWrite:
    """A status this operator wrote, the resourceVersion the write produced, and the versions
    known to predate the write.

    resourceVersions are opaque: only equality means anything, so "the index copy is older
    than our write" cannot be a comparison. Instead each write records the version its pass
    read, which the write certainly followed; while the index still lags, the versions of
    earlier writes and their reads are carried over. An index copy at one of these predates
    the write. Any other version is the write itself, a change made after it (a watch
    delivers one object's versions in order, so the index passes our write before it shows
    a later one), or one this operator never saw (a change between a pass's read and its
    write); for those the index copy is used as it is.
    """

    version: str
    status: dict[str, Any]
    predating: frozenset[str]

    def predates(self, version: str) -> bool:
        return version in self.predating

    @classmethod
    def after(
        cls, previous: _OwnWrite | None, read: str, version: str, status: dict[str, Any]
    ) -> _OwnWrite:
        """The record of a write made by a pass that read version `read`."""
        if previous is not None and previous.predates(read):  # the index still lagged
            predating = previous.predating | {previous.version, read}
        else:
            predating = frozenset({read})
        return cls(version, status, predating - {""})


def _version(body: Mapping[str, Any]) -> str:
    return str(body.get("metadata", {}).get("resourceVersion") or "")


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


def _drifted(seen: ChildSummary, wanted: str, correction: _Correction | None) -> bool:
    """Whether someone else changed a field the operator owns in this child.

    The index holds a digest of the live owned fields, not the object, so the check costs no
    memory per child beyond that digest, and no API call. An empty digest (the operator's
    field manager owns nothing there, e.g. a child left by another manager) counts as drift:
    one apply takes the fields over."""
    if seen.owned_fingerprint == wanted:
        return False
    if correction is not None and correction.wanted == wanted:
        if seen.owned_fingerprint == correction.result:
            return False  # what the last correction produced: the server's own spelling
        if seen.resource_version == correction.read:
            return False  # the index still holds the copy that correction answered
    return True


def _applied_hash(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH])


def _as_seen(workload: WorkloadState, seen_hash: str, wanted_hash: str | None) -> WorkloadState:
    """A workload whose watch copy predates what this pass applied counts as not yet observed
    by its controller: its old copy may be fully ready, and the PDDeployment must not say
    Ready for a generation whose rollout has not started."""
    if wanted_hash is None or seen_hash == wanted_hash:
        return workload
    return replace(workload, generation=workload.observed_generation + 1)


def _event_for(cond: Condition) -> tuple[str, str, str] | None:
    if cond.type == "Ready":
        if cond.status == "True":
            return ("Normal", "Ready", cond.message)
        return (
            None
            if cond.reason in ("ReplicasNotReady",) and not cond.message
            else ("Normal", "NotReady", cond.message)
        )
    if cond.type in ("Degraded", "Stalled") and cond.status == "True":
        return ("Warning", cond.reason, cond.message)
    if cond.type == "Placed":
        return ("Normal" if cond.status == "True" else "Warning", cond.reason, cond.message)
    if cond.type == "KVTransferVerified":
        return ("Normal" if cond.status == "True" else "Warning", cond.reason, cond.message)
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
