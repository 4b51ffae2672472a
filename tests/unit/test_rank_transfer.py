"""Per-rank KV-path verification where instances span nodes: which prefill rank probes which
decode pod (planning.probe_pairs), the requests the operator stamps, and status.transfer with
its `ranks` list and the RankPathDegraded verdict (status.transfer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import MAX_TRANSFER_RANKS, PDDeployment, TransferStatus
from pdd_operator.planning.probe_pairs import per_rank_probes, probe_pairs
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.transfer import (
    REASON_RANK_DEGRADED,
    rank_probe_requests,
    rank_probers,
    rank_transfer_outcome,
)

NOW = "2026-12-01T03:00:00Z"
REQUEST, PEER = "pdd.dev/probe-request", "pdd.dev/probe-peer"


def deployment(prefill: tuple[int, int], decode: tuple[int, int]) -> PDDeployment:
    """(instances, nodes per instance) of each role."""

    def role(shape: tuple[int, int]) -> dict[str, int]:
        return {"replicas": shape[0], "gpusPerInstance": 8, "nodesPerInstance": shape[1]}

    return make_pdd({"prefill": role(prefill), "decode": role(decode)})


def pairs(pdd: PDDeployment) -> list[tuple[str, str]]:
    return [(p.pod, p.peer) for p in probe_pairs(pdd)]


def pod(name: str, result: dict[str, Any] | None = None, ready: bool = True) -> PodSummary:
    return PodSummary(
        name=name, uid=f"u-{name}", role="prefill", node="n", ready=ready,
        revision="r1", problem=None, probe_result=result,
    )  # fmt: skip


def answer(gbps: float, transport: str = "rdma", **fields: Any) -> dict[str, Any]:
    return {"transport": transport, "gbps": gbps, "expected_gbps": 50.0, "verified": True,
            "ucx_net_devices": "mlx5_1:1", "measured_by": "preflight", "link": "rdma",
            "started_at": "2026-12-01T02:59:00Z", **fields}  # fmt: skip


# --- pairs ---------------------------------------------------------------------------------


def test_single_node_roles_keep_the_one_prober() -> None:
    pdd = deployment((2, 1), (2, 1))
    assert not per_rank_probes(pdd) and probe_pairs(pdd) == []


def test_every_prefill_rank_probes_the_same_rank_of_its_paired_decode_instance() -> None:
    assert pairs(deployment((1, 2), (1, 2))) == [
        ("llama-prefill-0-0", "llama-decode-0-0"),
        ("llama-prefill-0-1", "llama-decode-0-1"),
    ]
    # Instance i -> decode instance i mod D; rank r -> rank r mod M.
    assert pairs(deployment((3, 2), (2, 1))) == [
        ("llama-prefill-0-0", "llama-decode-0"),
        ("llama-prefill-0-1", "llama-decode-0"),
        ("llama-prefill-1-0", "llama-decode-1"),
        ("llama-prefill-1-1", "llama-decode-1"),
        ("llama-prefill-2-0", "llama-decode-0"),
        ("llama-prefill-2-1", "llama-decode-0"),
    ]
    assert pairs(deployment((2, 1), (1, 4))) == [
        ("llama-prefill-0", "llama-decode-0-0"),
        ("llama-prefill-1", "llama-decode-0-0"),
    ]


def test_the_pairs_are_bounded_and_none_without_a_decode_instance() -> None:
    assert len(probe_pairs(deployment((8, 8), (1, 8)))) == MAX_TRANSFER_RANKS
    assert probe_pairs(deployment((1, 2), (0, 2))) == []


# --- requests ------------------------------------------------------------------------------


def test_one_request_id_on_every_ready_rank_each_with_its_pair() -> None:
    pdd = deployment((1, 2), (1, 2))
    pods = [pod("llama-prefill-0-0"), pod("llama-prefill-0-1"), pod("llama-decode-0-0")]
    asked = rank_probe_requests(pdd, True, rank_probers(pdd, pods), NOW)
    assert asked == [
        ("llama-prefill-0-0", {REQUEST: NOW, PEER: "llama-decode-0-0"}),
        ("llama-prefill-0-1", {REQUEST: NOW, PEER: "llama-decode-0-1"}),
    ]
    assert rank_probe_requests(pdd, False, rank_probers(pdd, pods), NOW) == []


def test_a_round_is_not_asked_again_before_the_interval() -> None:
    pdd = deployment((1, 2), (1, 2))
    # One rank already carries this round's request (its watch event came before our status).
    pods = [replace(pod("llama-prefill-0-0"), probe_request="2026-12-01T02:59:59Z"),
            pod("llama-prefill-0-1", ready=False)]  # fmt: skip
    assert rank_probe_requests(pdd, True, rank_probers(pdd, pods), NOW) == []
    asked_long_ago = with_requested(pdd, "2026-12-01T01:00:00Z")
    pods[0] = replace(pods[0], probe_request="2026-12-01T01:00:00Z")
    asked = rank_probe_requests(asked_long_ago, True, rank_probers(pdd, pods), NOW)
    assert [name for name, _ in asked] == ["llama-prefill-0-0"]  # the ready one


def test_a_rank_never_asked_is_asked_between_rounds_with_the_rounds_id() -> None:
    """A replaced rank pod (no request on it yet) is measured now, not an interval later;
    the others are left until the next round."""
    round_id = "2026-12-01T02:59:59Z"
    pdd = with_requested(deployment((1, 2), (1, 2)), round_id)
    pods = [replace(pod("llama-prefill-0-0"), probe_request=round_id),
            pod("llama-prefill-0-1")]  # fmt: skip
    asked = rank_probe_requests(pdd, True, rank_probers(pdd, pods), NOW)
    assert asked == [("llama-prefill-0-1", {REQUEST: round_id, PEER: "llama-decode-0-1"})]
    # Not while the deployment is not Ready, and never a first round this way.
    assert rank_probe_requests(pdd, False, rank_probers(pdd, pods), NOW) == []


def with_requested(pdd: PDDeployment, requested: str) -> PDDeployment:
    status = pdd.status.model_copy(update={"transfer": TransferStatus(requestedAt=requested)})
    return pdd.model_copy(update={"status": status})


# --- status --------------------------------------------------------------------------------


def outcome(pdd: PDDeployment, *pods: PodSummary):  # type: ignore[no-untyped-def]
    return rank_transfer_outcome(pdd, rank_probers(pdd, list(pods)))


def test_no_verdict_before_a_rank_answers() -> None:
    pdd = deployment((1, 2), (1, 2))
    assert outcome(pdd, pod("llama-prefill-0-0"), pod("llama-prefill-0-1")) is None


def test_all_ranks_verified_names_the_slowest_and_lists_each_rank() -> None:
    pdd = deployment((1, 2), (1, 2))
    out = outcome(pdd, pod("llama-prefill-0-0", answer(48.0)),
                  pod("llama-prefill-0-1", answer(41.5)))  # fmt: skip
    assert out.ok is True and out.reason == "TransferVerified"
    assert out.status.measuredGBps == 41.5  # the aggregate is the slowest rank's
    assert out.status.message.startswith(
        "all 2 measured ranks verified; slowest llama-prefill-0-1 (prefill instance 0 rank 1 "
        "-> llama-decode-0-1): rdma: 41.5 GB/s"
    )
    assert [(r.pod, r.rank, r.peer, r.measuredGBps, r.verified) for r in out.status.ranks] == [
        ("llama-prefill-0-0", 0, "llama-decode-0-0", 48.0, True),
        ("llama-prefill-0-1", 1, "llama-decode-0-1", 41.5, True),
    ]


def test_one_degraded_rank_makes_the_verdict_and_is_named_with_its_numbers() -> None:
    pdd = deployment((1, 2), (1, 2))
    out = outcome(pdd, pod("llama-prefill-0-0", answer(48.0)),
                  pod("llama-prefill-0-1", answer(9.0)))  # fmt: skip
    assert out.ok is False and out.reason == REASON_RANK_DEGRADED
    message = out.status.message
    assert message.startswith(
        "1 of 2 measured ranks degraded; worst llama-prefill-0-1 (prefill instance 0 rank 1 -> "
        "llama-decode-0-1): BelowExpectedBandwidth: rdma: 9.0 GB/s, expected ≥ 25 GB/s over "
        "mlx5_1:1: check the NIC is the one nearest the GPU"
    )
    assert message.endswith("; every rank's path is in status.transfer.ranks")
    degraded = out.status.ranks[1]
    assert (degraded.verified, degraded.reason) == (False, "BelowExpectedBandwidth")
    assert out.status.ranks[0].verified is True


def test_a_failed_probe_is_worse_than_a_slow_one_and_unanswered_ranks_are_counted() -> None:
    pdd = deployment((2, 2), (1, 2))
    failed = answer(0.0, error="decode pod llama-decode-0-1, this rank's pair, has no "
                    "reachable sidecar")  # fmt: skip
    out = outcome(pdd, pod("llama-prefill-0-0", answer(9.0)),
                  pod("llama-prefill-0-1", failed), pod("llama-prefill-1-0"))  # fmt: skip
    assert out.reason == REASON_RANK_DEGRADED
    assert out.status.message.startswith("2 of 2 measured ranks degraded; worst llama-prefill-0-1")
    assert "ProbeFailed: transfer probe failed" in out.status.message
    assert out.status.message.endswith("; 2 rank(s) not measured yet")
    assert len(out.status.ranks) == 2
