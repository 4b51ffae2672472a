"""When the operator asks the prober pod for a KV-transfer probe (status.transfer.probe_due)."""

from __future__ import annotations

from dataclasses import replace

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeployment, TransferStatus
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.transfer import probe_due

NOW = "2026-11-29T12:00:00Z"
PROBER = PodSummary(
    name="llama-prefill-0",
    uid="u0",
    role="prefill",
    node="gpu-a-00",
    ready=True,
    revision="r1",
    problem=None,
)


def with_requested(pdd: PDDeployment, requested: str) -> PDDeployment:
    status = pdd.status.model_copy(update={"transfer": TransferStatus(requestedAt=requested)})
    return pdd.model_copy(update={"status": status})


def test_first_probe_is_asked_once_ready() -> None:
    pdd = make_pdd()
    assert probe_due(pdd, True, PROBER, NOW)
    assert not probe_due(pdd, False, PROBER, NOW)
    assert not probe_due(pdd, True, replace(PROBER, ready=False), NOW)


def test_a_request_already_on_the_pod_is_not_renewed_before_status_shows_it() -> None:
    # The pod's watch event (with our annotation) arrived before our status write did.
    asked = replace(PROBER, probe_request="2026-11-29T11:59:58Z")
    assert not probe_due(make_pdd(), True, asked, NOW)


def test_the_interval_counts_from_the_latest_request() -> None:
    pdd = with_requested(make_pdd(), "2026-11-29T10:00:00Z")  # two hours ago
    assert probe_due(pdd, True, PROBER, NOW)
    recent = replace(PROBER, probe_request="2026-11-29T11:30:00Z")  # 30 minutes ago
    assert not probe_due(pdd, True, recent, NOW)


def test_a_hand_edited_request_time_asks_again_instead_of_never() -> None:
    assert probe_due(with_requested(make_pdd(), "yesterday"), True, PROBER, NOW)
