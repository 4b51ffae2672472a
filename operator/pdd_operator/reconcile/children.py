"""The children part of a pass: render (with a cache of the last render's fingerprints),
tell what differs from the indexes (missing, rendered from other inputs, drifted), look up
whose the names are, apply in waves, prune what is no longer rendered, and say when a
change someone made by hand was put back. The apply order of a child kind is its stage
(rendering.kinds), declared with the kind beside its renderer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.kube.resources import kind_of
from pdd_operator.reconcile.memory import DeploymentRecord
from pdd_operator.reconcile.outcome import Blocked, writes_failed
from pdd_operator.reconcile.ports import Ports, key_of
from pdd_operator.reconcile.prerequisites import Prerequisites, Readiness
from pdd_operator.rendering import dependencies
from pdd_operator.rendering.children import (
    CHILD_KINDS,
    WORKLOAD_KINDS,
    child_key,
    render_children,
)
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.kinds import Stage
from pdd_operator.rendering.sidecar import sidecar_enabled
from pdd_operator.status import corrections, ownership
from pdd_operator.status.corrections import Correction, drifted
from pdd_operator.status.drift import live_fingerprint, rendered_fingerprint
from pdd_operator.status.gang import multinode_roles
from pdd_operator.status.observe import ChildKey, ChildSummary

log = logging.getLogger(__name__)

CONFLICT_RETRY_MAX_SECONDS = 300.0  # the longest wait between looks at a taken name
STAGES = {kind.kind: kind.stage for kind in CHILD_KINDS}
REFERENCED_FIRST = frozenset(k for k, stage in STAGES.items() if stage is Stage.REFERENCED)
POD_MAKERS = frozenset(k.kind for k in CHILD_KINDS if k.makes_pods)
# The apply waves, each sent at once: the gang objects go with what pods use (they name no
# child, and nothing names them).
WAVES = ((Stage.REFERENCED,), (Stage.USED, Stage.ADMITS_PODS), (Stage.MAKES_PODS,))


@dataclass(frozen=True)
class Desired:
    """The children a pass wants: their fingerprints, and the objects on demand."""

    hashes: Mapping[ChildKey, str]  # of the rendered object (its applied-hash annotation)
    owned: Mapping[ChildKey, str]  # of the fields it sets, as status.drift spells them
    objects: Callable[[], list[dict[str, Any]]]


@dataclass(frozen=True)
class Rendered:
    """A deployment's last render: what it was rendered from, and its fingerprints."""

    inputs: tuple[str, int, tuple[int, ...], RenderContext]  # uid, generation, counts, context
    hashes: dict[ChildKey, str]
    owned: dict[ChildKey, str]


@dataclass(frozen=True)
class Changes:
    """The writes a pass owes its children."""

    apply: list[dict[str, Any]]  # missing, rendered from other inputs, or drifted
    drifted: frozenset[ChildKey]  # of those, the ones someone else changed
    stale: tuple[ChildKey, ...]  # no longer rendered: to delete
    # the deployment's record of drift corrections, which the drifted children's applies add to
    corrections: dict[ChildKey, Correction]


@dataclass(frozen=True)
class Claims:
    """What a pass found of the objects holding its children's names: those someone else
    holds, the children held because of them (theirs and what runs against them, in apply
    order), and this deployment's own children that had lost their owner reference."""

    conflicts: tuple[ownership.NameConflict, ...] = ()
    adopted: frozenset[ChildKey] = frozenset()
    held: tuple[ChildKey, ...] = ()


@dataclass(frozen=True)
class Synced:
    """What a sync found: what stopped it, if anything did, and the names someone else holds."""

    blocked: Blocked
    taken: tuple[ownership.NameConflict, ...] = ()


@dataclass(frozen=True)
class Converged:
    """What the children part of a pass found: what blocks the deployment (`blocked`, the
    children's trouble or the token's), the children's own trouble (`conflict`: a taken name
    is looked at again with backoff), and what the engines wait for (`readiness`)."""

    blocked: Blocked
    conflict: Blocked
    readiness: Readiness


def what_blocks(children: Blocked, token: Blocked) -> Blocked:
    """What the status tells: a token Secret someone else made before anything else (with
    the rest in its message), for a restarted operator reads it there (token.py); else the
    children's trouble, else the token's."""
    if token.reason != ownership.TOKEN_REASON or not children.message:
        return children if children.message else token
    message = f"{token.message}. Besides: {children.message}"
    return Blocked(token.reason, message, transient=children.transient)


def render(pdd: PDDeployment, ctx: RenderContext, record: DeploymentRecord) -> Desired:
    """The children's fingerprints, rendered again only when their inputs changed (the
    spec's generation or the context): most passes answer pod progress and change neither.
    Only the fingerprints are kept (the objects are ~70 KiB per deployment in memory); the
    objects are rendered again when one must be applied."""
    counts = (pdd.spec.prefill.replicas, pdd.spec.decode.replicas)
    inputs = (pdd.uid, pdd.generation, counts, ctx)
    cached = record.rendered
    if cached is not None and cached.inputs == inputs:
        return Desired(cached.hashes, cached.owned, lambda: render_children(pdd, ctx))
    objects = render_children(pdd, ctx)
    hashes = {child_key(obj): _applied_hash(obj) for obj in objects}
    owned = {
        key: _reused_fingerprint(cached, pdd.uid, key, hashes[key]) or rendered_fingerprint(obj)
        for key, obj in zip(hashes, objects, strict=True)
    }
    record.rendered = Rendered(inputs, hashes, owned)
    return Desired(hashes, owned, lambda: objects)


def ahead_of_pods(desired: Desired) -> frozenset[ChildKey]:
    """The children pods run against (Services, accounts and roles, policies, disruption
    budgets): all but the workloads and the gang objects that admit their pods."""
    return frozenset(key for key in desired.hashes if key[1] not in POD_MAKERS)


def held_children(
    pdd: PDDeployment, desired: Desired, engines_held: bool, gang_waiting: bool
) -> frozenset[ChildKey]:
    """The children a pass leaves as they are: the engine workloads while a prerequisite of
    the engines is missing, the instances over several nodes while the gang scheduler is."""
    held = _engine_workloads(desired) if engines_held else frozenset()
    return held | _gang_children(pdd, desired) if gang_waiting else held


def _engine_workloads(desired: Desired) -> frozenset[ChildKey]:
    """The prefill and decode StatefulSets: what waits while the model is not available.
    Existing ones keep running as they are (their pods loaded the model already)."""
    return frozenset(key for key in desired.hashes if key[1] == "StatefulSet")


def _gang_children(pdd: PDDeployment, desired: Desired) -> frozenset[ChildKey]:
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


class Children:
    """Writes the children: what differs, in waves, without the names someone else holds."""

    def __init__(self, ports: Ports, names_guarded: bool) -> None:
        self.ports = ports
        # The name-guard admission policy is in force: the API server itself refuses an apply
        # that would make an existing object this deployment's child, so only workloads are
        # looked up before their apply (docs/security.md, "Names and ownership").
        self.names_guarded = names_guarded

    async def converge(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        desired: Desired,
        observed: Mapping[ChildKey, ChildSummary],
        record: DeploymentRecord,
        prerequisites: Prerequisites,
    ) -> Converged:
        """The children of a pass around what the engines wait for: on a pass that finds no
        children, those the pods run against first; then the engines' prerequisites (which
        create the sidecar token Secret); then the rest, holding the workloads that wait."""
        ahead, applied_ahead = await self._apply_ahead_of_token(
            pdd, body, desired, observed, record
        )
        # After a write that failed there, no token yet: a Secret without children beside it
        # would be taken for someone else's after a restart.
        failed_ahead = bool(ahead.blocked.message) and not ahead.taken
        readiness = await prerequisites.check(
            pdd, record, had_children=bool(observed), may_create_token=not failed_ahead
        )
        held = held_children(pdd, desired, readiness.engines_held, readiness.gang_waiting)
        conflict = ahead.blocked
        if ahead.taken or not conflict.message:  # not held up by a write that failed
            synced = await self.sync(
                pdd, body, desired, observed, record.corrections, held | applied_ahead, ahead.taken
            )
            conflict = synced.blocked
        return Converged(what_blocks(conflict, readiness.token.found), conflict, readiness)

    async def _apply_ahead_of_token(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        desired: Desired,
        observed: Mapping[ChildKey, ChildSummary],
        record: DeploymentRecord,
    ) -> tuple[Synced, frozenset[ChildKey]]:
        """On a pass that finds no children, the children the pods run against are applied
        before the sidecar token Secret is created, the workloads after it: a successor of
        an operator killed in between finds children beside the Secret and knows the Secret
        for this deployment's (token.py). What stopped it, if anything did (after a write that
        failed, the workloads wait for the next pass), and the children it applied."""
        if observed or not sidecar_enabled(pdd.spec):
            return Synced(Blocked()), frozenset()
        ahead = ahead_of_pods(desired)
        rest = frozenset(desired.hashes) - ahead
        return await self.sync(pdd, body, desired, observed, record.corrections, rest), ahead

    async def sync(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        desired: Desired,
        observed: Mapping[ChildKey, ChildSummary],
        done: dict[ChildKey, Correction],
        held: frozenset[ChildKey] = frozenset(),
        taken: tuple[ownership.NameConflict, ...] = (),
    ) -> Synced:
        """Apply what differs, delete what is no longer wanted, leave `held` children as they
        are (not created, not changed, not deleted); say what stopped it if anything did,
        and which names were found taken (`taken`: found so by an earlier sync of the pass).
        While a child's name is taken by an object that is not this deployment's, that child
        is not written, nor any child that would run against that object (a workload against
        its ServiceAccount or Service: rendering.dependencies); every other child is.
        A child that lost its owner reference and proves to be this deployment's
        (ownership.adoptable) is applied like any other, which puts the reference back.
        `done`: the deployment's drift corrections (its record's), which this sync keeps."""
        changes = _changes(desired, observed, done, held)
        corrections.keep_wanted(done, desired.owned)
        try:
            claims = await self._look_up(pdd, self._to_look_up(pdd, changes, observed))
            claims = replace(claims, conflicts=(*taken, *claims.conflicts))
            claims = await self._apply(pdd, body, changes, desired, observed, claims)
            await self._prune(pdd.namespace, changes.stale, observed)
        except Exception as err:
            return Synced(writes_failed(pdd, "could not apply children", err), taken)
        if claims.conflicts:
            return Synced(_report_conflicts(pdd, claims), claims.conflicts)
        return Synced(Blocked())

    def _to_look_up(
        self, pdd: PDDeployment, changes: Changes, observed: Mapping[ChildKey, ChildSummary]
    ) -> list[dict[str, Any]]:
        """The children to apply that the indexes do not list as this deployment's (new ones,
        mostly): every one, or under the name guard (which refuses a takeover itself) the
        workloads and those the watch saw without a controller (lost their owner reference)."""
        unlisted = [obj for obj in changes.apply if child_key(obj) not in observed]
        if not self.names_guarded:
            return unlisted
        unowned = self.ports.view.unowned_children(key_of(pdd))
        return [o for o in unlisted if o["kind"] in WORKLOAD_KINDS or child_key(o) in unowned]

    async def _look_up(self, pdd: PDDeployment, objects: Sequence[dict[str, Any]]) -> Claims:
        """Whose the object holding each child's name is: nobody's (the name is free), this
        deployment's that lost its owner reference (adopted), or someone else's (a conflict)."""
        metas = await asyncio.gather(
            *(
                asyncio.to_thread(
                    self.ports.kube.object_metadata,
                    kind_of(obj["apiVersion"], obj["kind"]),
                    pdd.namespace,
                    obj["metadata"]["name"],
                )
                for obj in objects
            )
        )
        conflicts, adopted = [], set()
        manager = self.ports.settings.field_manager
        for obj, meta in zip(objects, metas, strict=True):
            if meta is None:
                continue  # the name is free
            owners, name = meta.get("ownerReferences") or [], obj["metadata"]["name"]
            if ownership.adoptable(meta, pdd.name, manager):
                adopted.add(child_key(obj))
            elif conflict := ownership.name_conflict(obj["kind"], name, owners, pdd.uid):
                conflicts.append(conflict)
        return Claims(tuple(conflicts), frozenset(adopted))

    async def _apply(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        changes: Changes,
        desired: Desired,
        observed: Mapping[ChildKey, ChildSummary],
        claims: Claims,
    ) -> Claims:
        """Waves, each sent at once (`apply_waves`), without the children a name conflict
        holds. A refused apply of a child the indexes do not list is looked up (the name
        guard refuses a takeover): its conflict holds what depends on it from the next wave
        on; any other refusal is raised. A drifted child's answer is read back to record what
        the correction produced; an adopted child's apply is told as a correction too."""
        claims = replace(claims, held=_held_by(claims.conflicts, desired))
        for wave in apply_waves(changes.apply):
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
        changes: Changes,
        desired: Desired,
        observed: Mapping[ChildKey, ChildSummary],
        claims: Claims,
    ) -> None:
        for obj, _ in applied:
            self.ports.count_write("apply", obj["kind"])
        for obj, result in applied:
            if (key := child_key(obj)) in changes.drifted:
                correction = Correction(
                    wanted=desired.owned[key],
                    result=live_fingerprint(result, self.ports.settings.field_manager),
                    version=str(result.get("metadata", {}).get("resourceVersion", "")),
                    read=observed[key].resource_version,
                )
                self._put_back(pdd, body, obj, correction, changes.corrections)
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
        result = self.ports.kube.apply(obj, want_result=read_back)
        plural = kind_of(obj["apiVersion"], obj["kind"]).plural
        self.ports.own_object_writes.expect(plural, result)
        return result

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
                    self.ports.kube.delete,
                    kind_of(version, kind),
                    namespace,
                    name,
                    observed[(version, kind, name)].uid,
                )
                for version, kind, name in stale
            )
        )
        for _, kind, _ in stale:
            self.ports.count_write("delete", kind)

    def _put_back(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        obj: Mapping[str, Any],
        correction: Correction,
        done: dict[ChildKey, Correction],
    ) -> None:
        """Record a drift correction in `done`; tell the user when one of their changes was
        undone.

        The digest of what the apply returned is remembered: when it is not the render's
        (the server spells some owned value in a way status.drift does not know, or an
        admission webhook rewrote it), that digest counts as undrifted from now on, so the
        gap costs one write and never a loop."""
        if not corrections.recorded(done, child_key(dict(obj)), correction):
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
        message = (
            f"{what} was changed outside the operator; its fields were put back to the "
            f"PDDeployment's spec (change the PDDeployment instead)"
        )
        self._tell_corrected(pdd, body, obj["kind"], message)

    def _adopted(self, pdd: PDDeployment, body: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
        """Tell the user that a child which had lost its owner reference has it back."""
        message = ownership.adoption_message(obj["kind"], obj["metadata"]["name"])
        self._tell_corrected(pdd, body, obj["kind"], message)

    def _tell_corrected(
        self, pdd: PDDeployment, body: Mapping[str, Any], kind: str, message: str
    ) -> None:
        if self.ports.metrics:
            self.ports.metrics.drift_corrections.labels(kind=kind).inc()
        log.info("%s/%s: %s", pdd.namespace, pdd.name, message)
        self.ports.emit_event(body, "Normal", reasons.DRIFT_CORRECTED, message)


def apply_waves(objects: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Roles and ServiceAccounts; then what the pods use (a RoleBinding is refused while its
    Role does not exist: the API server checks that the operator holds the rules it grants);
    then the workloads, so that no pod is created while one of the objects it would run
    against is someone else's (empty waves left out)."""
    waves = [[obj for obj in objects if STAGES[obj["kind"]] in stages] for stages in WAVES]
    return [wave for wave in waves if wave]


def _report_conflicts(pdd: PDDeployment, claims: Claims) -> Blocked:
    taken = {(c.kind, c.name) for c in claims.conflicts}
    held = [f"{kind} {name}" for _, kind, name in claims.held if (kind, name) not in taken]
    message = ownership.conflict_message(claims.conflicts, held)
    log.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
    return Blocked(ownership.REASON, message)


def _held_by(conflicts: Sequence[ownership.NameConflict], desired: Desired) -> tuple[ChildKey, ...]:
    """The children not written while these names are taken: theirs, and every child that
    would run against the object holding one (rendering.dependencies), in apply order."""
    if not conflicts:
        return ()
    objects = desired.objects()
    held = set(dependencies.held_with({(c.kind, c.name) for c in conflicts}, objects))
    return tuple(child_key(o) for o in objects if (o["kind"], o["metadata"]["name"]) in held)


def _changes(
    desired: Desired,
    observed: Mapping[ChildKey, ChildSummary],
    done: dict[ChildKey, Correction],
    held: frozenset[ChildKey] = frozenset(),
) -> Changes:
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
        if key not in differ and key not in held and drifted(observed[key], wanted, done.get(key))
    )
    changed = differ | drift
    objects = [obj for obj in desired.objects() if child_key(obj) in changed] if changed else []
    stale = tuple(key for key in observed if key not in desired.hashes)
    return Changes(objects, drift, stale, done)


def _reused_fingerprint(cached: Rendered | None, uid: str, key: ChildKey, applied_hash: str) -> str:
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
