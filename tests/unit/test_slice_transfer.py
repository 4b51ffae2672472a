"""KV-path verification per slice where a deployment may grow by slices: the first prefill
pod of every slice probes the first decode pod of the same slice (planning.probe_pairs), the
sidecar Role lets exactly those pods write their answers, and a slice whose path fails is
named in status.transfer with its own reason (status.transfer)."""

from __future__ import annotations

from typing import Any

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.planning.probe_pairs import per_rank_probes, probe_pairs
from pdd_operator.planning.slices import Slice
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.transfer import rank_probers, rank_transfer_outcome

LEVEL = "nvidia.com/gpu.clique"
AUTOSCALED = {"decode": {"minReplicas": 0, "maxReplicas": 16}, "follower": "prefill"}


def sliceable(shown: list[Slice] | None = None) -> PDDeployment:
    """An autoscaled deployment with a follower, placed (so it may grow by slices), with
    status.slices showing `shown`."""
    pdd = make_pdd({"autoscaling": AUTOSCALED})
    body = {"metadata": {"name": pdd.name, "namespace": pdd.namespace, "uid": pdd.uid},
            "spec": pdd.spec.model_dump(), "status": {"slices": [
                {"index": s.index, "level": s.level, "domain": s.domain, "prefill": s.prefill,
                 "decode": s.decode} for s in shown or []]}}  # fmt: skip
    return PDDeployment.from_body(body)


def slice_(index: int, prefill: int, decode: int) -> Slice:
    return Slice(index, LEVEL, f"clique-{index}", prefill, decode)


def pod(name: str, result: dict[str, Any] | None = None) -> PodSummary:
    return PodSummary(
        name=name, uid=f"u-{name}", role="prefill", node="n", ready=True,
        revision="r1", problem=None, probe_result=result,
    )  # fmt: skip


def answer(gbps: float, transport: str) -> dict[str, Any]:
    return {"transport": transport, "gbps": gbps, "expected_gbps": 400.0, "verified": True,
            "measured_by": "sidecar", "started_at": "2026-12-01T02:59:00Z"}  # fmt: skip


def test_a_sliceable_deployment_pairs_each_slice_inside_itself() -> None:
    pdd = sliceable()
    assert per_rank_probes(pdd)
    # Only the home so far: its first prefill pod names its own first decode as the peer
    # (any decode could be another slice's, a path no request takes).
    assert [(p.pod, p.peer, p.slice) for p in probe_pairs(pdd)] == [
        ("llama-prefill-0", "llama-decode-0", 0)
    ]
    # This pass runs slice 1 with both roles (paired inside itself) and slice 2 without a
    # prefill (nothing to measure there).
    beyond = [slice_(1, 2, 4), slice_(2, 0, 1)]
    assert [(p.pod, p.peer, p.slice) for p in probe_pairs(pdd, beyond)] == [
        ("llama-prefill-0", "llama-decode-0", 0),
        ("llama-prefill-s1-0", "llama-decode-s1-0", 1),
    ]


def test_without_a_render_context_the_slices_are_those_status_shows() -> None:
    pdd = sliceable([slice_(0, 2, 4), slice_(1, 1, 2)])
    assert [p.pod for p in probe_pairs(pdd)] == ["llama-prefill-0", "llama-prefill-s1-0"]


def test_deployments_that_cannot_slice_keep_the_one_prober() -> None:
    unplaced = make_pdd({"autoscaling": AUTOSCALED, "topology": {"placement": "none"}})
    no_follower = make_pdd({"autoscaling": {"decode": {"minReplicas": 1, "maxReplicas": 4}}})
    assert not per_rank_probes(unplaced) and probe_pairs(unplaced) == []
    assert not per_rank_probes(no_follower)


def test_each_slices_prober_answers_as_itself_and_may_write_only_on_itself() -> None:
    objs = {
        (c["kind"], c["metadata"]["name"]): c
        for c in render_children(sliceable(), RenderContext(slices=(slice_(1, 1, 2),)))
    }
    for name in ("llama-prefill", "llama-prefill-s1"):
        containers = objs[("StatefulSet", name)]["spec"]["template"]["spec"]["containers"]
        sidecar = next(c for c in containers if c["name"] == "nixl-sidecar")
        prober = next(e for e in sidecar["env"] if e["name"] == "PDD_PROBER_POD")
        assert prober["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    patch = next(r for r in objs[("Role", "llama-sidecar")]["rules"] if r["verbs"] == ["patch"])
    assert patch["resourceNames"] == ["llama-prefill-0", "llama-prefill-s1-0"]


def test_a_degraded_slice_is_named_with_its_own_reason() -> None:
    pdd = sliceable([slice_(0, 1, 2), slice_(1, 1, 2)])
    pods = [pod("llama-prefill-0", answer(390.0, "nvlink")),
            pod("llama-prefill-s1-0", answer(0.8, "tcp"))]  # fmt: skip
    out = rank_transfer_outcome(pdd, rank_probers(pdd, pods))
    assert out is not None and out.ok is False and out.reason == "TCPFallback"
    assert out.status.message.startswith(
        "1 of 2 measured slices degraded; worst llama-prefill-s1-0 (slice 1 -> llama-decode-s1-0)"
    )
    assert [(r.pod, r.slice, r.verified) for r in out.status.ranks] == [
        ("llama-prefill-0", 0, True),
        ("llama-prefill-s1-0", 1, False),
    ]
    healthy = [pods[0], pod("llama-prefill-s1-0", answer(380.0, "nvlink"))]
    verified = rank_transfer_outcome(pdd, rank_probers(pdd, healthy))
    assert verified is not None and verified.ok is True
    assert verified.status.message.startswith("all 2 measured slices verified")
