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
    ClaimFacts,
    ModelFacts,
    ModelReadiness,
    claim_facts,
    engine_roles_held,
    model_readiness,
    model_references,
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
    # Only a known problem holds the engines back; a failed lookup does not.
    assert engine_roles_held(result) is (ready is False)


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


MISSING = ModelReadiness(False, "ModelSecretMissing", "Secret hf-token ... create it")


def conditions(pdd: PDDeployment, model: ModelReadiness | None) -> dict[str, Any]:
    status = compute_status(pdd, Observed(wanted={"prefill": 2, "decode": 4}, model=model), NOW)
    return {c.type: c for c in status.conditions}


def test_a_missing_prerequisite_makes_the_deployment_stalled_not_ready() -> None:
    found = conditions(pdd_with({"huggingFace": TOKEN}), MISSING)
    assert (found["ModelReady"].status, found["ModelReady"].reason) == ("False", MISSING.reason)
    assert (found["Ready"].status, found["Ready"].reason) == ("False", MISSING.reason)
    assert found["Ready"].message == MISSING.message
    assert (found["Stalled"].status, found["Stalled"].reason) == ("True", MISSING.reason)
    assert found["Reconciling"].status == "False"
    assert found["Progressing"].status == "False"


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
    after = list(conditions(pdd, MISSING).values())
    events = transition_events(before, after)
    about = [e for e in events if e.message == MISSING.message]
    assert [(e.type, e.reason) for e in about] == [("Warning", "ModelSecretMissing")]
    recovered = transition_events(
        after, list(conditions(pdd, ModelReadiness(True, "ModelAvailable", "ok")).values())
    )
    assert ("Normal", "ModelAvailable", "ok") in recovered
