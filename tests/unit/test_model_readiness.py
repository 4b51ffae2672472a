"""ModelReady from what a pass read of the model's Secret and claims (status.model), and what
it does to the other conditions and events (status.compute, status.conditions)."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.status.compute import Observed, compute_status
from pdd_operator.status.conditions import transition_events
from pdd_operator.status.model import (
    AWAIT_GRACE_S,
    ClaimFacts,
    ModelFacts,
    ModelReadiness,
    claim_facts,
    engine_roles_held,
    model_readiness,
    model_references,
    waited_too_long,
    waiting_since,
)

NOW = "2026-01-01T00:00:00Z"
TOKEN = {"tokenSecretRef": {"name": "hf-token"}}
RWX = ClaimFacts("Bound", frozenset({"ReadWriteMany"}))
ROX = ClaimFacts("Bound", frozenset({"ReadOnlyMany"}))
RWO = ClaimFacts("Bound", frozenset({"ReadWriteOnce"}))


def pdd_with(source: dict[str, Any] | None, prefill: int = 2, decode: int = 4) -> PDDeployment:
    model: dict[str, Any] = {"name": "meta-llama/Llama-3.3-70B-Instruct"}
    if source is not None:
        model["source"] = source
    return make_pdd(
        {"model": model, "prefill": {"replicas": prefill}, "decode": {"replicas": decode}}
    )


# (id, source, replicas (prefill, decode), facts, ready, reason, message fragments)
CASES: list[
    tuple[str, dict[str, Any] | None, tuple[int, int], ModelFacts, bool | None, str, list[str]]
] = [
    ("default download", None, (2, 4), ModelFacts(), True, "ModelAvailable", ["emptyDir"]),
    (
        "token present",
        {"huggingFace": TOKEN},
        (2, 4),
        ModelFacts(secret_exists=True),
        True,
        "ModelAvailable",
        ["with the token Secret"],
    ),
    (
        "token missing",
        {"huggingFace": TOKEN},
        (2, 4),
        ModelFacts(secret_exists=False),
        False,
        "ModelSecretMissing",
        [
            "Secret hf-token",
            "tokenSecretRef",
            "namespace team-a",
            "kubectl -n team-a create secret generic hf-token --from-literal=HF_TOKEN=<token>",
        ],
    ),
    (
        "cache claim missing",
        {"huggingFace": {**TOKEN, "cache": {"claimName": "hf-cache"}}},
        (2, 4),
        ModelFacts(claims={"hf-cache": None}),
        False,
        "ModelPVCMissing",
        ["PersistentVolumeClaim hf-cache", "cache.claimName", "ReadWriteMany", "create it"],
    ),
    (
        "cache claim read-only many",
        {"huggingFace": {"cache": {"claimName": "hf-cache"}}},
        (2, 4),
        ModelFacts(claims={"hf-cache": ROX}),
        False,
        "ModelPVCAccessMode",
        ["allows only ReadOnlyMany", "6 engine pods", "read-write", "ReadWriteMany"],
    ),
    (
        "cache claim shared",
        {"huggingFace": {"cache": {"claimName": "hf-cache"}}},
        (2, 4),
        ModelFacts(claims={"hf-cache": RWX}),
        True,
        "ModelAvailable",
        ["shared cache hf-cache"],
    ),
    (
        "model claim missing",
        {"pvc": {"claimName": "llama"}},
        (2, 4),
        ModelFacts(claims={"llama": None}),
        False,
        "ModelPVCMissing",
        ["PersistentVolumeClaim llama (spec.model.source.pvc.claimName)", "ReadOnlyMany"],
    ),
    (
        "model claim lost",
        {"pvc": {"claimName": "llama"}},
        (2, 4),
        ModelFacts(claims={"llama": ClaimFacts("Lost", frozenset({"ReadOnlyMany"}))}),
        False,
        "ModelPVCLost",
        ["is Lost", "restore the volume"],
    ),
    (
        "model claim read-write-once, six pods",
        {"pvc": {"claimName": "llama"}},
        (2, 4),
        ModelFacts(claims={"llama": RWO}),
        False,
        "ModelPVCAccessMode",
        ["allows only ReadWriteOnce", "6 engine pods", "ReadOnlyMany or ReadWriteMany"],
    ),
    (
        "model claim read-write-once, one pod",
        {"pvc": {"claimName": "llama"}},
        (1, 0),
        ModelFacts(claims={"llama": RWO}),
        True,
        "ModelAvailable",
        ["PersistentVolumeClaim llama"],
    ),
    (
        "model claim pending (wait for first consumer)",
        {"pvc": {"claimName": "llama"}},
        (2, 4),
        ModelFacts(claims={"llama": ClaimFacts("Pending", frozenset({"ReadOnlyMany"}))}),
        True,
        "ModelAvailable",
        [],
    ),
    (
        "model claim read-only many",
        {"pvc": {"claimName": "llama"}},
        (2, 4),
        ModelFacts(claims={"llama": ROX}),
        True,
        "ModelAvailable",
        [],
    ),
    (
        "lookup refused",
        {"huggingFace": TOKEN},
        (2, 4),
        ModelFacts(error='secrets "hf-token" is forbidden'),
        None,
        "ModelCheckFailed",
        ["could not check", "forbidden"],
    ),
    (
        "hostPath: nothing to check",
        {"hostPath": {"path": "/mnt/m"}},
        (2, 4),
        ModelFacts(),
        True,
        "ModelAvailable",
        ["/mnt/m"],
    ),
]


@pytest.mark.parametrize(
    ("source", "replicas", "facts", "ready", "reason", "fragments"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_model_readiness(
    source: dict[str, Any] | None,
    replicas: tuple[int, int],
    facts: ModelFacts,
    ready: bool | None,
    reason: str,
    fragments: list[str],
) -> None:
    result = model_readiness(pdd_with(source, *replicas), facts)
    assert (result.ready, result.reason) == (ready, reason), result.message
    for fragment in fragments:
        assert fragment in result.message
    # Only a known problem with a claim holds the engines back; a failed lookup does not,
    # nor a Secret's (the engine pods are what reports it).
    assert engine_roles_held(result) is (ready is False and not reason.startswith("ModelSecret"))
    # Only a missing object may still come (created by someone, an ExternalSecret, a
    # provisioner); a Lost claim or one of the wrong modes stays as it is.
    assert bool(result.awaited) is (reason in ("ModelSecretMissing", "ModelPVCMissing"))
    assert result.awaited in result.message  # "Secret hf-token", "PersistentVolumeClaim llama"


def test_references_name_what_the_operator_must_look_up() -> None:
    refs = model_references(
        pdd_with({"huggingFace": {**TOKEN, "cache": {"claimName": "hf-cache"}}}).spec
    )
    assert (refs.secret, refs.secret_key) == ("hf-token", "HF_TOKEN")
    assert [(c.name, c.written) for c in refs.claims] == [("hf-cache", True)]
    assert model_references(pdd_with(None).spec).empty
    assert model_references(pdd_with({"image": {"reference": "m:v1"}}).spec).empty


def test_claim_facts_prefer_the_granted_modes_over_the_requested() -> None:
    pvc = {
        "spec": {"accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound", "accessModes": ["ReadOnlyMany"]},
    }
    assert claim_facts(pvc) == ClaimFacts("Bound", frozenset({"ReadOnlyMany"}))
    pending = {"spec": {"accessModes": ["ReadWriteMany"]}, "status": {"phase": "Pending"}}
    assert claim_facts(pending) == ClaimFacts("Pending", frozenset({"ReadWriteMany"}))
    assert claim_facts(None) is None


def conditions(pdd: PDDeployment, model: ModelReadiness | None) -> dict[str, Any]:
    status = compute_status(pdd, Observed(wanted={"prefill": 2, "decode": 4}, model=model), NOW)
    return {c.type: c for c in status.conditions}


LATER = "2026-01-01T00:04:59Z"  # NOW + the grace period - 1 s
GRACE_OVER = "2026-01-01T00:05:00Z"
AWAITED = ModelReadiness(
    False, "ModelSecretMissing", "Secret hf-token ... create it", "Secret hf-token"
)
WRONG_MODES = ModelReadiness(False, "ModelPVCAccessMode", "... allows only ReadWriteOnce ...")


def after(pdd: PDDeployment, waiting: str, generation: int) -> PDDeployment:
    """`pdd` as a pass reads it after a status write: waitingSince, for `generation`."""
    status = pdd.status.model_copy(
        update={"waitingSince": waiting, "observedGeneration": generation}
    )
    return pdd.model_copy(update={"status": status})


def test_the_grace_period_is_five_minutes() -> None:
    assert AWAIT_GRACE_S == 300  # docs/model-storage.md says so


# (id, readiness, status.waitingSince before, its observedGeneration, now,
#  Stalled, Reconciling, waitingSince after)
WAITS: list[tuple[str, ModelReadiness, str, int, str, str, str, str]] = [
    ("a missing Secret, found now", AWAITED, "", 0, NOW, "False", "True", NOW),
    ("still missing, within the grace", AWAITED, NOW, 3, LATER, "False", "True", NOW),
    ("still missing, the grace is over", AWAITED, NOW, 3, GRACE_OVER, "True", "False", NOW),
    # A changed spec may name another object: it is given the whole grace again.
    ("a new generation waits anew", AWAITED, NOW, 2, GRACE_OVER, "False", "True", GRACE_OVER),
    ("a written time that is not one", AWAITED, "soon", 3, LATER, "False", "True", LATER),
    # Nothing will change these without a person: Stalled at once, nothing awaited.
    ("a claim of the wrong modes", WRONG_MODES, "", 0, NOW, "True", "False", ""),
    ("a claim of the wrong modes, was awaited", WRONG_MODES, NOW, 3, LATER, "True", "False", ""),
    ("the model is there", ModelReadiness(True, "ModelAvailable", "ok"), NOW, 3, LATER,
     "False", "True", ""),
    ("the lookup failed", ModelReadiness(None, "ModelCheckFailed", "?"), NOW, 3, LATER,
     "False", "True", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "waiting", "observed_generation", "now", "stalled", "reconciling", "since"),
    [w[1:] for w in WAITS],
    ids=[w[0] for w in WAITS],
)
def test_a_missing_object_is_awaited_for_the_grace_period_then_stalled(
    model: ModelReadiness,
    waiting: str,
    observed_generation: int,
    now: str,
    stalled: str,
    reconciling: str,
    since: str,
) -> None:
    pdd = after(pdd_with({"huggingFace": TOKEN}), waiting, observed_generation)
    assert pdd.generation == 3
    status = compute_status(pdd, Observed(wanted={"prefill": 2, "decode": 4}, model=model), now)
    found = {c.type: c for c in status.conditions}
    assert (found["Stalled"].status, found["Reconciling"].status) == (stalled, reconciling)
    assert status.waitingSince == since
    if model.ready is False:  # awaited or stalled, not Ready
        assert (found["Ready"].status, found["Ready"].reason) == ("False", model.reason)
        assert found["Ready"].message == model.message
    if stalled == "True":
        assert (found["Stalled"].reason, found["Stalled"].message) == (model.reason, model.message)
        assert found["Progressing"].status == "False"


def test_while_awaited_reconciling_says_what_since_when_until_when_and_the_fix() -> None:
    pdd = after(pdd_with({"huggingFace": TOKEN}), NOW, 3)
    status = compute_status(pdd, Observed(wanted={"prefill": 2, "decode": 4}, model=AWAITED), LATER)
    reconciling = next(c for c in status.conditions if c.type == "Reconciling")
    assert reconciling.reason == "ModelSecretMissing"
    assert reconciling.message == (
        "waiting for Secret hf-token (missing since 2026-01-01T00:00:00Z; Stalled if still "
        "missing at 2026-01-01T00:05:00Z): Secret hf-token ... create it"
    )


@pytest.mark.parametrize(
    ("previous", "previous_generation", "now", "since"),
    [
        ("", 3, NOW, NOW),  # a wait begins
        (NOW, 3, LATER, NOW),  # the same generation's wait goes on (an operator restart too)
        (NOW, 2, LATER, LATER),  # a new generation's wait begins
        ("2026-13-01", 3, LATER, LATER),  # not a time: begins now
    ],
)
def test_waiting_since(previous: str, previous_generation: int, now: str, since: str) -> None:
    assert waiting_since(previous, previous_generation, 3, now) == since


@pytest.mark.parametrize(
    ("since", "now", "over"),
    [(NOW, NOW, False), (NOW, LATER, False), (NOW, GRACE_OVER, True), ("", GRACE_OVER, False)],
)
def test_waited_too_long(since: str, now: str, over: bool) -> None:
    assert waited_too_long(since, now) is over


def test_an_available_model_leaves_the_other_conditions_alone() -> None:
    ok = ModelReadiness(True, "ModelAvailable", "model from PersistentVolumeClaim llama")
    found = conditions(pdd_with({"pvc": {"claimName": "llama"}}), ok)
    assert found["ModelReady"].status == "True"
    assert (found["Ready"].reason, found["Stalled"].status) == ("ReplicasNotReady", "False")
    assert found["Reconciling"].status == "True"
    unknown = ModelReadiness(None, "ModelCheckFailed", "could not check")
    found = conditions(pdd_with({"pvc": {"claimName": "llama"}}), unknown)
    assert found["ModelReady"].status == "Unknown"
    assert found["Stalled"].status == "False"
    assert "ModelReady" not in conditions(pdd_with(None), None)


def test_one_warning_event_says_what_to_create_and_one_says_it_was_fixed() -> None:
    pdd = pdd_with({"huggingFace": TOKEN})
    before = list(conditions(pdd, ModelReadiness(True, "ModelAvailable", "ok")).values())
    after = list(conditions(pdd, AWAITED).values())
    events = transition_events(before, after)
    about = [e for e in events if e.message == AWAITED.message]
    assert [(e.type, e.reason) for e in about] == [("Warning", "ModelSecretMissing")]
    recovered = transition_events(
        after, list(conditions(pdd, ModelReadiness(True, "ModelAvailable", "ok")).values())
    )
    assert ("Normal", "ModelAvailable", "ok") in recovered
