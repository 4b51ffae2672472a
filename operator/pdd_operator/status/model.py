"""Whether the objects ``spec.model.source`` refers to are there (pure): the token Secret,
the model's claim, the shared cache's claim.

Without this check a missing Secret shows as six pods in CreateContainerConfigError, a
missing claim as six pods Pending; here it is one condition (ModelReady=False) whose message
says what to create.

What is checked, and how:
- the Secret: the operator may not read Secrets (docs/security.md), so a missing one, or one
  without the key, is learnt from what the engine pods' kubelets report (their engine
  container waits in CreateContainerConfigError, `secret "hf-token" not found`). The engine
  StatefulSets are therefore not held for it: their pods are what tells;
- a claim exists and is not Lost, read before any engine pod starts, which waits for it.
  Pending is accepted: a claim of a WaitForFirstConsumer class binds only when its first pod
  is scheduled, and one that cannot bind shows in the pods' Unschedulable message;
- a claim several engine pods mount allows it across nodes: ReadOnlyMany or ReadWriteMany
  for the model (read-only), ReadWriteMany for a shared download cache (written).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api.v1alpha1 import PDDeployment, PDDeploymentSpec

if TYPE_CHECKING:  # compute.py imports this module
    from pdd_operator.status.compute import PodProblem

CONFIG_ERROR = "CreateContainerConfigError"
SECRET_REASONS = frozenset({reasons.MODEL_SECRET_MISSING, reasons.MODEL_SECRET_KEY_MISSING})
MULTI_NODE_READ = frozenset({"ReadOnlyMany", "ReadWriteMany"})
MULTI_NODE_WRITE = frozenset({"ReadWriteMany"})


@dataclass(frozen=True)
class ClaimUse:
    """A PersistentVolumeClaim the engine pods mount, and the field that names it."""

    name: str
    field: str
    written: bool  # the shared Hugging Face cache; the model's own claim is read-only


@dataclass(frozen=True)
class ModelReferences:
    secret: str | None = None  # the token Secret's name
    secret_key: str = ""
    claims: tuple[ClaimUse, ...] = ()

    @property
    def empty(self) -> bool:
        return self.secret is None and not self.claims


@dataclass(frozen=True)
class ClaimFacts:
    """What the API server says of a claim: absent (None in ModelFacts.claims), or these."""

    phase: str = ""
    access_modes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ModelFacts:
    """What a reconcile pass read. ``error``: a lookup failed (not a 404): nothing is known."""

    secret_exists: bool = True
    # The Secret exists but has no such key (what the pods report then).
    secret_key_missing: bool = False
    claims: Mapping[str, ClaimFacts | None] | None = None
    error: str = ""


@dataclass(frozen=True)
class ModelReadiness:
    """ModelReady: True (all there), False (the engines wait; message says the fix) or None
    (could not be checked: the engines are not held back on a guess)."""

    ready: bool | None
    reason: str
    message: str
    # The missing object that someone or something may still create ("Secret hf-token"): an
    # ExternalSecret or a provisioning job often does so seconds after the PDDeployment. ""
    # where waiting cannot help (a Lost claim, a claim of the wrong access modes).
    awaited: str = ""


def model_references(spec: PDDeploymentSpec) -> ModelReferences:
    """The model's Secret and claims, and the claims of its LoRA adapters."""
    model = _model_source_references(spec)
    seen = {use.name for use in model.claims}
    adapters = []
    for use in _adapter_claims(spec):  # one check per claim: adapters may share one
        if use.name not in seen:
            seen.add(use.name)
            adapters.append(use)
    return replace(model, claims=(*model.claims, *adapters))


def _model_source_references(spec: PDDeploymentSpec) -> ModelReferences:
    source = spec.model.source_or_default
    if source.pvc is not None:
        use = ClaimUse(source.pvc.claimName, "spec.model.source.pvc.claimName", written=False)
        return ModelReferences(claims=(use,))
    hf = source.huggingFace
    if hf is None:
        return ModelReferences()  # hostPath and image: nothing the API server can confirm
    claims: tuple[ClaimUse, ...] = ()
    if hf.cache is not None:
        field = "spec.model.source.huggingFace.cache.claimName"
        claims = (ClaimUse(hf.cache.claimName, field, written=True),)
    token = hf.tokenSecretRef
    return ModelReferences(
        secret=token.name if token else None, secret_key=token.key if token else "", claims=claims
    )


def _adapter_claims(spec: PDDeploymentSpec) -> tuple[ClaimUse, ...]:
    return tuple(
        ClaimUse(a.source.pvc.claimName, f"spec.model.adapters[{i}].source.pvc.claimName", False)
        for i, a in enumerate(spec.model.adapters)
        if a.source.pvc is not None
    )


def claim_facts(pvc: Mapping[str, Any] | None) -> ClaimFacts | None:
    """From a PersistentVolumeClaim as the API server returns it. The bound volume's modes
    (status) are what was granted; before binding, the requested ones (spec)."""
    if pvc is None:
        return None
    status = pvc.get("status") or {}
    modes = status.get("accessModes") or (pvc.get("spec") or {}).get("accessModes") or []
    return ClaimFacts(phase=str(status.get("phase") or ""), access_modes=frozenset(modes))


def model_readiness(pdd: PDDeployment, facts: ModelFacts) -> ModelReadiness:
    refs = model_references(pdd.spec)
    if facts.error:
        return ModelReadiness(
            None, reasons.MODEL_CHECK_FAILED, f"could not check the model's sources: {facts.error}"
        )
    if refs.secret is not None and not facts.secret_exists:
        secret = f"Secret {refs.secret}"
        return ModelReadiness(
            False, reasons.MODEL_SECRET_MISSING, _secret_missing(pdd, refs), secret
        )
    if refs.secret is not None and facts.secret_key_missing:
        return ModelReadiness(
            False, reasons.MODEL_SECRET_KEY_MISSING, _secret_key_missing(pdd, refs)
        )
    pods = pdd.spec.prefill.replicas + pdd.spec.decode.replicas
    for use in refs.claims:
        problem = _claim_problem(pdd.namespace, use, (facts.claims or {}).get(use.name), pods)
        if problem is not None:
            return problem
    return ModelReadiness(True, reasons.MODEL_AVAILABLE, _available(pdd.spec))


def _secret_missing(pdd: PDDeployment, refs: ModelReferences) -> str:
    return (
        f"Secret {refs.secret} (spec.model.source.huggingFace.tokenSecretRef) does not exist "
        f"in namespace {pdd.namespace} (the engine pods' kubelets say so): create it with the "
        f"Hugging Face token under key {refs.secret_key}, e.g. kubectl -n {pdd.namespace} "
        f"create secret generic {refs.secret} --from-literal={refs.secret_key}=<token>; the "
        "engine pods start once it exists"
    )


def _secret_key_missing(pdd: PDDeployment, refs: ModelReferences) -> str:
    return (
        f"Secret {refs.secret} (spec.model.source.huggingFace.tokenSecretRef) has no key "
        f"{refs.secret_key} (the engine pods' kubelets say so): add the Hugging Face token "
        f"under that key, or set tokenSecretRef.key to the key that holds it; the engine pods "
        "start once it resolves"
    )


def secret_reports(
    problems: Iterable[PodProblem | None], namespace: str, secret: str
) -> tuple[bool, bool]:
    """(missing, key missing): what the pods' kubelets report of a Secret their containers
    take values from, in the words of a CreateContainerConfigError."""
    messages = [p.message for p in problems if p is not None and p.reason == CONFIG_ERROR]
    missing = any(f'secret "{secret}" not found' in m for m in messages)
    no_key = any(f"in Secret {namespace}/{secret}" in m for m in messages)
    return missing, no_key and not missing


def _claim_problem(
    namespace: str, use: ClaimUse, claim: ClaimFacts | None, pods: int
) -> ModelReadiness | None:
    what = f"PersistentVolumeClaim {use.name} ({use.field})"
    needed = MULTI_NODE_WRITE if use.written else MULTI_NODE_READ
    if claim is None:
        fill = "for the shared download cache" if use.written else "holding the model"
        return ModelReadiness(
            False,
            reasons.MODEL_PVC_MISSING,
            f"{what} does not exist in namespace {namespace}: create it ({_modes(needed)}, "
            f"{fill}) or correct the name; the engine pods start once it exists",
            f"PersistentVolumeClaim {use.name}",
        )
    if claim.phase == "Lost":
        return ModelReadiness(
            False,
            reasons.MODEL_PVC_LOST,
            f"{what} is Lost (its PersistentVolume is gone): restore the volume, or create "
            "a new claim and point the field at it",
        )
    if pods > 1 and claim.access_modes and not claim.access_modes & needed:
        have = ", ".join(sorted(claim.access_modes))
        return ModelReadiness(
            False,
            reasons.MODEL_PVC_ACCESS_MODE,
            f"{what} allows only {have}, but {pods} engine pods on different nodes mount "
            f"it{' read-write' if use.written else ''}: use a claim with {_modes(needed)}",
        )
    return None


def _modes(modes: frozenset[str]) -> str:
    return " or ".join(sorted(modes))


def _available(spec: PDDeploymentSpec) -> str:
    source = spec.model.source_or_default
    if source.pvc is not None:
        return f"model from PersistentVolumeClaim {source.pvc.claimName}"
    if source.hostPath is not None:
        return f"model from the nodes' {source.hostPath.path}"
    if source.image is not None:
        return f"model from image {source.image.reference}"
    hf = source.huggingFace
    cache = (
        f"into the shared cache {hf.cache.claimName}"
        if hf is not None and hf.cache is not None
        else "by each pod into its own emptyDir"
    )
    token = " with the token Secret" if hf is not None and hf.tokenSecretRef else ""
    return f"{spec.model.name} downloaded from the Hugging Face Hub{token} {cache}"


def engine_roles_held(readiness: ModelReadiness | None) -> bool:
    """Whether the engine StatefulSets wait: only on a known problem with a claim. A Secret's
    problem is known only from the engine pods, so they run (and wait) meanwhile."""
    return (
        readiness is not None
        and readiness.ready is False
        and readiness.reason not in SECRET_REASONS
    )


# How long a PDDeployment waits for an awaited object (ModelReadiness.awaited) before it is
# Stalled: long enough for an ExternalSecret, a CSI provisioner or a GitOps tool applying
# objects in waves to create it, short enough that a typo in a name fails a pipeline well
# within its health-check timeout (Flux's default is 5 minutes as well). Counted from when the
# operator first found the current generation waiting (status.waitingSince).
AWAIT_GRACE_S = 300
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # as the conditions' lastTransitionTime


def waiting_since(previous: str, previous_generation: int, generation: int, now: str) -> str:
    """When the current generation began waiting: the recorded time while it is the same
    generation's (it survives an operator restart), `now` for a wait that starts, or for a new
    generation (a changed spec may name another object, and is given the whole grace)."""
    if previous and previous_generation == generation and _parse(previous) is not None:
        return previous
    return now


def waited_too_long(since: str, now: str, grace_s: float = AWAIT_GRACE_S) -> bool:
    """Whether a wait that began at `since` has passed the grace period at `now`."""
    start, end = _parse(since), _parse(now)
    return start is not None and end is not None and (end - start).total_seconds() >= grace_s


def awaiting_message(readiness: ModelReadiness, since: str, grace_s: float = AWAIT_GRACE_S) -> str:
    """What Reconciling says while an object is awaited: since when, until when, and the fix."""
    start = _parse(since)
    until = (start + timedelta(seconds=grace_s)).strftime(TIME_FORMAT) if start else "?"
    return (
        f"waiting for {readiness.awaited} (missing since {since}; Stalled if still missing at "
        f"{until}): {readiness.message}"
    )


def _parse(stamp: str) -> datetime | None:
    try:
        return datetime.strptime(stamp, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
