"""ParallelismSupported and what it does to Ready and Stalled: a layout the model's known shape
cannot be split by is refused with the sizes that fit; an unknown shape is a quiet note."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment, PDDeploymentStatus
from pdd_operator.status.compute import Observed, WorkloadState, compute_status
from pdd_operator.status.conditions import find, transition_events
from pdd_operator.status.parallelism import (
    CONDITION,
    ParallelismVerdict,
    engines_held_by,
    parallelism_verdict,
)

T0 = "2026-01-01T00:00:00Z"
LLAMA_70B = {"name": "meta-llama/Llama-3.1-70B-Instruct"}
SGLANG = {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"}


def spec_of(**patch: Any) -> Any:
    return make_pdd(patch).spec


def tp(gpus: int) -> dict[str, Any]:
    return {"prefill": {"gpusPerInstance": gpus}, "decode": {"gpusPerInstance": gpus}}


@pytest.mark.parametrize(
    ("patch", "fits", "reason"),
    [
        ({"model": LLAMA_70B, **tp(8)}, True, "FitsModel"),
        ({"model": LLAMA_70B, **tp(3)}, False, "AttentionHeadsNotDivisible"),
        (
            {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, **tp(8)},
            False,
            "AttentionHeadsNotDivisible",
        ),
        (
            {
                "model": {"name": "Qwen/Qwen3-235B-A22B"},
                "engine": SGLANG,
                "prefill": {"gpusPerInstance": 8, "parallelism": {"tensor": 8, "expert": 8}},
                "decode": {
                    "gpusPerInstance": 8,
                    "nodesPerInstance": 3,
                    "parallelism": {"tensor": 24, "data": 3, "expert": 24},
                },
            },
            False,
            "ExpertsNotDivisible",
        ),
        (
            {
                "model": {
                    "name": "my-org/finetune",
                    "kvCache": {"layers": 8, "kvHeads": 8, "headDim": 128, "attentionHeads": 64},
                },
                **tp(6),
            },
            False,
            "AttentionHeadsNotDivisible",  # past CEL only with a CRD without its rules
        ),
        ({"model": {"name": "my-org/finetune"}}, None, "ModelShapeUnknown"),
        (
            {"model": {"name": "m", "kvCache": {"layers": 8, "kvHeads": 8, "headDim": 128}}},
            None,
            "ModelShapeIncomplete",
        ),
    ],
)
def test_the_verdict(patch: dict[str, Any], fits: bool | None, reason: str) -> None:
    verdict = parallelism_verdict(spec_of(**patch))
    assert verdict is not None
    assert (verdict.fits, verdict.reason) == (fits, reason)
    assert engines_held_by(verdict) is (fits is False)


def test_a_refusal_names_the_field_the_counts_and_the_sizes_that_fit() -> None:
    verdict = parallelism_verdict(spec_of(model=LLAMA_70B, **tp(3)))
    assert verdict is not None
    assert verdict.message == (
        "spec.prefill: tensor-parallel size 3 (spec.prefill.gpusPerInstance) does not divide "
        "the 64 attention heads of meta-llama/Llama-3.1-70B-Instruct (from the operator's table "
        "of known models): vLLM fails at start with it; use a tensor-parallel size of 1, 2, 4 "
        "or 8 (spec.decode does not fit either); the engine pods are neither started nor "
        "changed until it fits"
    )


def test_a_refusal_of_the_kv_heads_and_of_dp_attention_names_tensor_over_data() -> None:
    # 48 attention heads split over 12 / 2 = 6 ranks; 8 KV heads do not.
    kv_cache = {"layers": 8, "kvHeads": 8, "headDim": 128, "attentionHeads": 48}
    spec = spec_of(
        model={"name": "my-org/finetune", "kvCache": kv_cache},
        engine=SGLANG,
        prefill={
            "gpusPerInstance": 4,
            "nodesPerInstance": 3,
            "parallelism": {"tensor": 12, "data": 2},
        },
        decode={"gpusPerInstance": 4},
    )
    verdict = parallelism_verdict(spec)
    assert verdict is not None
    assert verdict.reason == "KVHeadsNotDivisible"
    assert verdict.message == (
        "spec.prefill: tensor-parallel size 6 (spec.prefill.parallelism.tensor / data) and the "
        "8 KV heads of my-org/finetune (from spec.model.kvCache) do not divide one another: "
        "SGLang fails at start with it; use a tensor-parallel size of 1, 2, 4 or 8; the engine "
        "pods are neither started nor changed until it fits"
    )


def test_messages_of_a_fit_and_of_what_is_not_checked() -> None:
    fit = parallelism_verdict(spec_of(model=LLAMA_70B, **tp(8)))
    assert fit is not None
    assert fit.message == (
        "meta-llama/Llama-3.1-70B-Instruct (from the operator's table of known models): its 64 "
        "attention heads and 8 KV heads split evenly over both roles' parallel ranks"
    )
    unknown = parallelism_verdict(spec_of(model={"name": "/models/mine"}))
    assert unknown is not None
    assert "set spec.model.kvCache, with attentionHeads" in unknown.message


def test_a_custom_engine_gets_no_condition() -> None:
    custom = {"type": "custom", "image": "example.com/engine:1"}
    assert parallelism_verdict(spec_of(engine=custom, router={"enabled": False})) is None
    pdd = make_pdd({"engine": custom, "router": {"enabled": False}})
    assert find(compute_status(pdd, Observed(), T0).conditions, CONDITION) is None


def status_with(pdd: PDDeployment, verdict: ParallelismVerdict | None) -> PDDeploymentStatus:
    """The status of a deployment whose pods are all ready, with that verdict."""
    counts = {"prefill": 2, "decode": 4, "router": 1}
    workloads = {r: WorkloadState(True, n, n, n, "r1", "r1", 2, 2) for r, n in counts.items()}
    observed = Observed(workloads=workloads, wanted=counts, parallelism=verdict)
    return compute_status(pdd, observed, T0)


def conditions(status: PDDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_a_refused_layout_is_stalled_and_not_ready_whatever_the_pods_say() -> None:
    pdd = make_pdd({"model": LLAMA_70B, **tp(3)})
    verdict = parallelism_verdict(pdd.spec)
    status = status_with(pdd, verdict)
    found = conditions(status)
    reason = "AttentionHeadsNotDivisible"
    assert found["Ready"] == ("False", reason)
    assert found["Stalled"] == ("True", reason)
    assert found["Progressing"] == ("False", reason)
    assert found["Reconciling"][0] == "False"
    assert found[CONDITION] == ("False", reason)
    assert verdict is not None
    assert all(
        c.message == verdict.message
        for c in status.conditions
        if c.type in ("Ready", "Stalled", CONDITION)
    )
    # One Warning event, though three conditions say it.
    events = transition_events([], status.conditions)
    assert [e for e in events if e.reason == reason] == [("Warning", reason, verdict.message)]


def test_a_fitting_or_unknown_shape_leaves_readiness_alone_and_says_nothing() -> None:
    for model, expected in (
        (LLAMA_70B, ("True", "FitsModel")),
        ({"name": "x/y"}, ("Unknown", "ModelShapeUnknown")),
    ):
        pdd = make_pdd({"model": model})
        status = status_with(pdd, parallelism_verdict(pdd.spec))
        found = conditions(status)
        assert found[CONDITION] == expected
        assert (found["Ready"], found["Stalled"][0]) == (("True", "AllReplicasReady"), "False")
        assert not [e for e in transition_events([], status.conditions) if e.reason == expected[1]]
