"""The condition and event reasons are constants of the API (api.condition_reasons): one
CamelCase spelling each, and every reason the status code writes is one of them, or one of
Kubernetes' own that a pod's problem passes on."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api.v1alpha1 import Condition, PDDeployment, PlacementStatus
from pdd_operator.planning.placement import NodeFacts, PlacementResult, plan_placement
from pdd_operator.reconcile.outcome import write_failed
from pdd_operator.status import ownership
from pdd_operator.status.compute import Observed, WorkloadState, compute_status
from pdd_operator.status.conditions import transition_events
from pdd_operator.status.gang import gang_readiness
from pdd_operator.status.invalid import invalid_spec_conditions
from pdd_operator.status.model import ClaimFacts, ModelFacts, model_readiness
from pdd_operator.status.observe import PodSummary, pod_problem, pod_problems
from pdd_operator.status.parallelism import parallelism_verdict
from pdd_operator.status.refusals import Refusal
from pdd_operator.status.token import MountFailure, token_mount_problems
from pdd_operator.status.transfer import transfer_outcome

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
CAMEL_CASE = re.compile(r"[A-Z][A-Za-z0-9]*")
# Kubernetes' reasons for a pod's problem, which Degraded passes on as the cluster spells them
# (status.observe): not the operator's, so not constants of its API.
KUBERNETES_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
        "InvalidImageName",
        "Unschedulable",
        "NodeLost",
        "NodeNotReady",
    }
)
OPERATOR = Path(reasons.__file__).resolve().parents[1]


def constants() -> dict[str, object]:
    return {name: value for name, value in vars(reasons).items() if name.isupper()}


def test_every_constant_is_one_camel_case_reason() -> None:
    strings = {name: value for name, value in constants().items() if isinstance(value, str)}
    assert len(strings) > 40
    for name, value in constants().items():
        if name in ("REASONS", "PROBE_REASONS"):
            continue
        assert isinstance(value, str) and CAMEL_CASE.fullmatch(value), name
    assert len(set(strings.values())) == len(strings), "two constants spell the same reason"
    assert sorted(reasons.REASONS) == sorted(strings.values()), "REASONS lists each once"
    assert set(reasons.PROBE_REASONS) <= set(reasons.REASONS)
    assert not KUBERNETES_REASONS & set(reasons.REASONS)


# --- what representative statuses write --------------------------------------------------


def settled(n: int) -> WorkloadState:
    return WorkloadState(True, n, n, n, "r1", "r1", 2, 2)


PENDING = WorkloadState(True, 4, 0, 4, "r1", "r1", 1, 1)
ROLLING = WorkloadState(True, 4, 4, 2, "r1", "r2", 3, 3)
UNOBSERVED = WorkloadState(True, 4, 4, 4, "r1", "r1", 3, 2)
CLIQUE = {"nvidia.com/gpu.clique": "c1", "pdd.dev/gpudirect": "dmabuf"}


def seen(decode: WorkloadState | None = None, **kw: Any) -> Observed:
    workloads = {"prefill": settled(2), "decode": decode or settled(4), "router": settled(1)}
    wanted = {"prefill": 2, "decode": 4, "router": 1}
    return Observed(workloads=workloads, wanted=wanted, revision="abc", **kw)


def pod(**status: Any) -> Any:
    return pod_problem("llama-decode-0", "decode", status)


def preflight_failed() -> Any:
    term = {"terminated": {"exitCode": 1, "message": "memlock is 8 MiB; set unlimited"}}
    return pod(initContainerStatuses=[{"name": "preflight", "state": term}])


def crash_looping() -> Any:
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
    return pod(containerStatuses=[{"name": "engine", "state": waiting}])


def on_lost_node() -> list[Any]:
    summary = PodSummary("llama-decode-0", "u", "decode", "gone", True, "r1", None)
    return pod_problems([summary], lambda node: None)


def token_missing() -> list[Any]:
    summary = PodSummary("llama-decode-0", "u", "decode", "n1", False, "r1", None)
    report = MountFailure("llama-decode-0", "2026-01-01T00:00:30+00:00", "not found", "s")
    return token_mount_problems([summary], [report], "llama-token", "2026-01-01T00:01:00+00:00")


def placed(nodes: list[NodeFacts], patch: dict[str, Any] | None = None) -> PlacementResult:
    return plan_placement(make_pdd(patch).spec, nodes, PlacementStatus())


def probed(**fields: Any) -> Observed:
    probe = {"path": "VRAM->VRAM", "transport": "nvlink", "gbps": 352.8, "verified": True}
    prober = PodSummary("llama-prefill-0", "u0", "prefill", "n1", True, "r1", None)
    outcome = transfer_outcome(make_pdd(), replace(prober, probe_result={**probe, **fields}))
    assert outcome is not None
    return seen(transfer=outcome.status, transfer_ok=outcome.ok, transfer_reason=outcome.reason)


TOKEN = {"model": {"name": "m/m", "source": {"huggingFace": {"tokenSecretRef": {"name": "t"}}}}}
CLAIM = {"model": {"name": "m/m", "source": {"pvc": {"claimName": "weights"}}}}
MULTINODE = {"scheduling": {"gang": "volcano"}, "decode": {"nodesPerInstance": 2}}
RWO = ClaimFacts("Bound", frozenset({"ReadWriteOnce"}))
UNKNOWN_MODEL = {"model": {"name": "acme/unknown-7b"}}
UNPLACED = {"topology": {"placement": "none"}}
UNEVEN = {
    "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
    "prefill": {"gpusPerInstance": 3},
    "decode": {"gpusPerInstance": 3},
}

# (id, the spec patch, what was observed): each built as the pass builds it.
EIGHT_GPUS = {"prefill": {"gpusPerInstance": 8}, "decode": {"gpusPerInstance": 8}}
CASES: list[tuple[str, dict[str, Any] | None, Callable[[], Observed]]] = [
    ("ready", None, lambda: seen()),
    ("pending", None, lambda: seen(PENDING)),
    ("rolling", None, lambda: seen(ROLLING)),
    ("unobserved", None, lambda: seen(UNOBSERVED)),
    ("preflight", None, lambda: seen(PENDING, pod_problems=[preflight_failed()])),
    ("crash loop", None, lambda: seen(PENDING, pod_problems=[crash_looping()])),
    ("node lost", None, lambda: seen(pod_problems=on_lost_node())),
    ("token missing", None, lambda: seen(PENDING, pod_problems=token_missing())),
    ("refused", None, lambda: seen(refusals=[Refusal("decode", "llama-decode", "quota")])),
    ("apply refused", None, lambda: _blocked(write_failed("apply", ValueError("no")))),
    ("apply retried", None, lambda: _blocked(write_failed("apply", TimeoutError("slow")))),
    ("name conflict", None, lambda: seen(apply_error="x", apply_error_reason=ownership.REASON)),
    ("token taken", None, lambda: seen(apply_error="x", apply_error_reason=ownership.TOKEN_REASON)),
    ("model secret", TOKEN, lambda: _model(TOKEN, ModelFacts(secret_exists=False))),
    ("model key", TOKEN, lambda: _model(TOKEN, ModelFacts(secret_key_missing=True))),
    ("model claim", CLAIM, lambda: _model(CLAIM, ModelFacts(claims={}))),
    (
        "claim lost",
        CLAIM,
        lambda: _model(CLAIM, ModelFacts(claims={"weights": ClaimFacts("Lost")})),
    ),
    ("claim mode", CLAIM, lambda: _model(CLAIM, ModelFacts(claims={"weights": RWO}))),
    ("model unchecked", None, lambda: _model(None, ModelFacts(error="timeout"))),
    ("model there", None, lambda: _model(None, ModelFacts())),
    ("gang missing", MULTINODE, lambda: seen(gang=gang_readiness(make_pdd(MULTINODE), False))),
    ("gang there", MULTINODE, lambda: seen(gang=gang_readiness(make_pdd(MULTINODE), True))),
    ("uneven", UNEVEN, lambda: seen(parallelism=parallelism_verdict(make_pdd(UNEVEN).spec))),
    ("fits", None, lambda: seen(parallelism=parallelism_verdict(make_pdd().spec))),
    (
        "shape unknown",
        UNKNOWN_MODEL,
        lambda: seen(parallelism=parallelism_verdict(make_pdd(UNKNOWN_MODEL).spec)),
    ),
    ("no nodes", None, lambda: seen(placement=placed([]))),
    ("unplaced", UNPLACED, lambda: seen(placement=placed([], UNPLACED))),
    ("placed", None, lambda: seen(placement=placed(_nodes(4, CLIQUE)))),
    ("no room", None, lambda: seen(placement=placed(_nodes(1, CLIQUE)))),
    ("no labels", None, lambda: seen(placement=placed(_nodes(8, {})))),
    ("verified", None, lambda: probed()),
    ("tcp", None, lambda: probed(transport="tcp", gbps=1.0)),
    ("slow", None, lambda: probed(transport="rdma", gbps=1.0)),
    ("corrupt", None, lambda: probed(verified=False)),
    ("probe failed", None, lambda: probed(error="no peer")),
    ("at zero", None, lambda: seen(scaled_to_zero=True, scaling_held="")),
    ("held", None, lambda: seen(scaled_to_zero=False, scaling_held="KV path degraded")),
    ("old engine", {"engine": {"version": "0.0.1"}}, lambda: seen()),
    ("unknown engine", {"engine": {"image": "vllm/vllm-openai:latest"}}, lambda: seen()),
    ("cpu tier", {"kvCache": {"offload": {"cpu": "64Gi"}}}, lambda: seen()),
    (
        "cpu tier too small",
        {"engine": {"type": "sglang"}, "kvCache": {"offload": {"cpu": "1Gi"}}, **EIGHT_GPUS},
        lambda: seen(),
    ),
    (
        "kv_aware routing",
        {"engine": {"version": "0.33.0"}, "router": {"prefillPolicy": "kv_aware"}},
        lambda: seen(),
    ),
    (
        "kv_aware routing on a release without KV event sources",
        {"engine": {"version": "0.11.0"}, "router": {"prefillPolicy": "kv_aware"}},
        lambda: seen(),
    ),
]


def _blocked(blocked: Any) -> Observed:
    return seen(
        apply_error=blocked.message,
        apply_error_reason=blocked.reason,
        apply_error_transient=blocked.transient,
    )


def _model(patch: dict[str, Any] | None, facts: ModelFacts) -> Observed:
    return seen(model=model_readiness(make_pdd(patch), facts))


def _nodes(count: int, labels: dict[str, str]) -> list[NodeFacts]:
    return [NodeFacts(f"n{i}", labels, 8, 0) for i in range(count)]


def written(conditions: list[Condition], baseline: list[Condition]) -> set[str]:
    """The conditions' reasons and those of the events their change is told by."""
    events = [*transition_events([], conditions), *transition_events(baseline, conditions)]
    return {c.reason for c in conditions} | {e.reason for e in events}


@pytest.mark.parametrize(("patch", "observed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_reason_a_status_writes_is_a_constant(
    patch: dict[str, Any] | None, observed: Callable[[], Observed]
) -> None:
    pdd = make_pdd(patch)
    baseline = compute_status(pdd, seen(), T0).conditions
    status = compute_status(pdd, observed(), T1)
    assert written(status.conditions, baseline) - KUBERNETES_REASONS <= set(reasons.REASONS)


# The reasons no case above writes: events told outside the status (reconcile/, planning/),
# the unreadable spec's (below), and variants of a verdict a case already gives.
NOT_IN_CASES = frozenset(
    {
        reasons.DRIFT_CORRECTED,
        reasons.TOKEN_SECRET_RECREATED,
        reasons.INSTANCE_RESTARTED,
        reasons.INSTANCE_REPLACED,
        reasons.INVALID_SPEC,
        reasons.KV_HEADS_NOT_DIVISIBLE,
        reasons.EXPERTS_NOT_DIVISIBLE,
        reasons.MODEL_SHAPE_INCOMPLETE,
        reasons.WAITING_FOR_CAPACITY,
        reasons.RANK_PATH_DEGRADED,
    }
)


def test_the_cases_write_every_other_reason() -> None:
    """The cases are representative: a new reason gets a case (or a line above)."""
    found: set[str] = set()
    for _, patch, observed in CASES:
        found |= written(compute_status(make_pdd(patch), observed(), T1).conditions, [])
    assert set(reasons.REASONS) - found == NOT_IN_CASES


def test_an_unreadable_spec_writes_a_constant(pdd: PDDeployment) -> None:
    conditions = invalid_spec_conditions(pdd.status.conditions, 1, "spec.x: no", T0)
    assert {c.reason for c in conditions} == {reasons.INVALID_SPEC}


# --- reasons given elsewhere (the planner, the operator's events) ---------------------------


def _literal_reasons(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals given as a `reason` or `event` argument, or as such a field's value."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("reason", "event"):
            value: ast.expr | None = node.value
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            named = [t for t in targets if isinstance(t, ast.Name)]
            value = node.value if any(t.id in ("reason", "event") for t in named) else None
        else:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found.append((node.lineno, value.value))
    return found


def test_every_literal_reason_in_the_operator_is_a_constant() -> None:
    stray = [
        f"{path.relative_to(OPERATOR)}:{line}: {value}"
        for path in sorted(OPERATOR.rglob("*.py"))
        for line, value in _literal_reasons(ast.parse(path.read_text()))
        if value and value not in reasons.REASONS  # "": no reason (a default)
    ]
    assert not stray
