"""KV-transfer verification (pure): when to ask for a probe, and what its result means.

The operator never talks to pods. It stamps a request id on the prober pod (prefill ordinal 0)
when the deployment has just become Ready and again every `verification.intervalSeconds`; that
pod's sidecar runs the NIXL probe against a decode peer and writes the result back onto its own
pod, where the operator's pod watch picks it up.

Where instances span nodes every prefill rank is a prober (planning.probe_pairs), asked with
the same request id and the decode pod to measure against; each rank's answer is a line of
status.transfer.ranks, and the worst rank's is status.transfer itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pdd_contract.probe_result import REASON_VERIFIED, classify_probe
from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment, RankTransferStatus, TransferStatus
from pdd_operator.engines.registry import adapter_for
from pdd_operator.planning.kv_layout import PRICED_PROMPT_TOKENS, prompt_kv_bytes
from pdd_operator.planning.probe_pairs import ProbePair, probe_pairs
from pdd_operator.status.costly_settings import costly_settings
from pdd_operator.status.observe import PodSummary

# What the KV path should reach when the result does not say (GB/s, DESIGN.md's table):
# the intended path is GPU->GPU over a 400 Gb/s NIC; NVLink when the probe found cuda_ipc.
DEFAULT_EXPECTED_GBPS = {"nvlink": 400.0}
DEFAULT_RDMA_GBPS = 50.0
# Below this share of the link at the engine's own descriptor size, the status says which
# setting moves it.
ENGINE_FRACTION_HINT = 0.5
# KVTransferVerified's reason where instances span nodes and a rank's own path fails.
REASON_RANK_DEGRADED = reasons.RANK_PATH_DEGRADED


@dataclass(frozen=True)
class TransferOutcome:
    status: TransferStatus
    ok: bool | None  # None: no result yet
    reason: str


def probe_due(pdd: PDDeployment, ready: bool, prober: PodSummary | None, now: str) -> bool:
    """Ask for a probe once the deployment is Ready, then every interval; never twice for
    the same pending request.

    The last request is the later of status.transfer.requestedAt and the prober pod's own
    request annotation: the pod's watch event can arrive before the status write that
    recorded the request, and stamping again then would renew it on every pass."""
    return rank_probe_due(pdd, ready, [prober] if prober is not None else [], now)


def rank_probe_due(pdd: PDDeployment, ready: bool, probers: Sequence[PodSummary], now: str) -> bool:
    """`probe_due` for a round asked of several prober pods at once: due while one of them
    is ready, counted from the latest request on any of them."""
    verification = pdd.spec.kvTransfer.verification
    if not verification.enabled or not ready or not any(p.ready for p in probers):
        return False
    last = max([pdd.status.transfer.requestedAt, *(p.probe_request for p in probers)])
    if not last or last > now:  # a request time from the future was not written by us
        return True
    if verification.intervalSeconds == 0:
        return False
    return _seconds_between(last, now) >= verification.intervalSeconds


def transfer_outcome(pdd: PDDeployment, prober: PodSummary | None) -> TransferOutcome | None:
    """The status.transfer and KVTransferVerified verdict from the latest answered probe."""
    if prober is None or prober.probe_result is None:
        return None
    # An answer to an older request is still the latest measurement (the one the previous
    # status was computed from): computed again each pass, never taken from the status.
    result = prober.probe_result
    requested = pdd.status.transfer.requestedAt
    expected = expected_gbps(result)
    ok, reason, message = classify_probe(
        result, expected, pdd.spec.kvTransfer.verification.minFraction
    )
    measured = round(float(result.get("gbps") or 0.0), 3)
    descriptor, at_descriptor = engine_figure(result)
    prompt_bytes = prompt_kv_bytes(pdd.spec)
    prompt_s = prompt_seconds(prompt_bytes, at_descriptor or measured)
    status = TransferStatus(
        path=str(result.get("path", "")),
        transport=str(result.get("transport", "")),
        measuredGBps=measured,
        expectedGBps=expected,
        verified=ok,
        message=message
        + _where(result)
        + _engine_note(descriptor, at_descriptor, measured, bool(pdd.spec.engine.kvBlockSize))
        + _prompt_note(prompt_bytes, prompt_s)
        + "".join(
            f"; {hint}" for hint in costly_settings(pdd.spec, adapter_for(pdd.spec.engine.type))
        ),
        lastProbeTime=str(result.get("started_at", "")),
        requestedAt=requested,
        measuredBy=str(result.get("measured_by") or "sidecar"),
        link=str(result.get("link", "")),
        engineDescriptorBytes=descriptor,
        engineGBps=at_descriptor,
        direction=str(result.get("operation") or ""),
        peerBoundary=str(result.get("peer_boundary") or ""),
        ucxLanes=[str(lane) for lane in (result.get("lanes") or [])][:16],
        emulated=bool(result.get("emulated")),
        promptKVSeconds=prompt_s,
    )
    return TransferOutcome(status, ok, reason)


def prompt_seconds(nbytes: int | None, gbps: float) -> float:
    """A prompt's KV per engine rank, ``nbytes`` (None: the model's shape is unknown), at
    ``gbps``; 0 when either is unknown."""
    if not nbytes or gbps <= 0:
        return 0.0
    return round(nbytes / (gbps * 1e9), 4)


def _prompt_note(nbytes: int | None, seconds: float) -> str:
    if not seconds or not nbytes:
        return ""
    took = f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
    return (
        f"; a {PRICED_PROMPT_TOKENS:,}-token prompt's KV ({nbytes / 1e9:.2f} GB per engine "
        f"rank) takes {took} at that rate"
    )


@dataclass(frozen=True)
class RankProber:
    """A prefill rank asked to probe, with the pod as last seen."""

    pair: ProbePair
    pod: PodSummary


def rank_probers(pdd: PDDeployment, pods: Sequence[PodSummary]) -> list[RankProber]:
    """The prefill ranks that probe (planning.probe_pairs) among the pods that exist."""
    by_name = {pod.name: pod for pod in pods}
    return [RankProber(pair, by_name[pair.pod]) for pair in probe_pairs(pdd) if pair.pod in by_name]


def rank_probe_requests(
    pdd: PDDeployment, ready: bool, probers: Sequence[RankProber], now: str
) -> list[tuple[str, dict[str, str]]]:
    """The annotations to stamp: when a round is due, the same request id on every ready
    prober, each with the decode pod it measures against; between rounds, the last round's
    id on a ready prober never asked yet (a slice just opened, a rank pod replaced), so a
    new path is measured now rather than an interval later."""
    if rank_probe_due(pdd, ready, [p.pod for p in probers], now):
        return [_request(p, now) for p in probers if p.pod.ready]
    verification = pdd.spec.kvTransfer.verification
    last = max([pdd.status.transfer.requestedAt, *(p.pod.probe_request for p in probers)])
    if not verification.enabled or not ready or not last:
        return []
    return [_request(p, last) for p in probers if p.pod.ready and not p.pod.probe_request]


def _request(prober: RankProber, request_id: str) -> tuple[str, dict[str, str]]:
    annotations = {
        names.ANNOTATION_PROBE_REQUEST: request_id,
        names.ANNOTATION_PROBE_PEER: prober.pair.peer,
    }
    return prober.pair.pod, annotations


def rank_transfer_outcome(
    pdd: PDDeployment, probers: Sequence[RankProber]
) -> TransferOutcome | None:
    """Every rank's latest answer as a line of `ranks`; the worst rank decides the verdict,
    and the message names it. None until one rank has answered."""
    measured = [(p.pair, o) for p in probers if (o := transfer_outcome(pdd, p.pod)) is not None]
    if not measured:
        return None
    ranks = [_rank_line(pair, outcome) for pair, outcome in measured]
    worst_pair, worst = min(measured, key=lambda m: _severity(m[1]))
    failing = sum(1 for _, outcome in measured if not outcome.ok)
    unmeasured = len(probe_pairs(pdd)) - len(measured)
    message = _rank_summary(worst_pair, worst, failing, len(measured), unmeasured)
    reason = _reason(worst_pair, worst, failing)
    status = worst.status.model_copy(update={"message": message, "ranks": ranks})
    return TransferOutcome(status, not failing, reason)


def _severity(outcome: TransferOutcome) -> tuple[bool, float]:
    """Failing before verified, then the smallest share of what the path should reach."""
    expected = outcome.status.expectedGBps
    share = outcome.status.measuredGBps / expected if expected > 0 else 0.0
    return bool(outcome.ok), share


def _rank_line(pair: ProbePair, outcome: TransferOutcome) -> RankTransferStatus:
    status = outcome.status
    return RankTransferStatus(
        pod=pair.pod,
        instance=pair.instance,
        rank=pair.rank,
        peer=pair.peer,
        slice=pair.slice,
        path=status.path,
        transport=status.transport,
        measuredGBps=status.measuredGBps,
        expectedGBps=status.expectedGBps,
        verified=bool(outcome.ok),
        reason=outcome.reason,
        message=status.message,
    )


def _reason(worst_pair: ProbePair, worst: TransferOutcome, failing: int) -> str:
    """A slice's path fails for its own reason (TCPFallback, ...: the message names the
    slice); a rank's as RankPathDegraded, its own reason in the message."""
    if not failing:
        return REASON_VERIFIED
    return worst.reason if worst_pair.slice is not None else REASON_RANK_DEGRADED


def _rank_summary(
    pair: ProbePair, worst: TransferOutcome, failing: int, measured: int, unmeasured: int
) -> str:
    if pair.slice is not None:
        noun, where = "slice", f"slice {pair.slice}"
    else:
        noun, where = "rank", f"prefill instance {pair.instance} rank {pair.rank}"
    who = f"{pair.pod} ({where} -> {pair.peer})"
    if failing:
        head = f"{failing} of {measured} measured {noun}s degraded; worst {who}: {worst.reason}: "
        tail = f"; every {noun}'s path is in status.transfer.ranks"
    else:
        head = f"all {measured} measured {noun}s verified; slowest {who}: "
        tail = ""
    if unmeasured:
        tail += f"; {unmeasured} {noun}(s) not measured yet"
    return head + worst.status.message + tail


def engine_figure(result: Mapping[str, Any]) -> tuple[int, float]:
    """The engine's descriptor size and what the probe moved at that size (0 when not
    measured)."""
    descriptor = int(result.get("engine_descriptor_bytes") or 0)
    for row in result.get("per_block_size") or []:
        if descriptor and isinstance(row, Mapping) and row.get("block_size") == descriptor:
            return descriptor, round(float(row.get("gbps") or 0.0), 3)
    return descriptor, 0.0


def _where(result: Mapping[str, Any]) -> str:
    if result.get("measured_by") != "preflight":
        return "; measured between the sidecars, without the engine's GPUs"
    where = f"; measured with the engine's devices ({result.get('link') or 'unknown'} link"
    if result.get("operation"):
        where += f", {result['operation']}"
    if result.get("peer_boundary") == "pod":
        where += ", to a peer beyond a pod boundary"
    elif result.get("peer_boundary") == "host-pid":
        where += ", to a peer in another pod's IPC and mount namespaces, in the host's PID one"
        where += _own_gpus_only(result)
    elif result.get("peer_boundary") == "host-pid-ipc":
        where += ", to a peer in another pod's mount namespace, in the host's PID and IPC ones"
        where += _own_gpus_only(result)
    if result.get("boundary_emulation"):
        # An unprivileged pod may not make namespaces: the peer ran in this pod, on the
        # transports that cross the boundary only (pdd_probe.boundary).
        where += f"; boundary emulated: peer kept to {result['boundary_emulation']}"
    return where + ")"


def _own_gpus_only(result: Mapping[str, Any]) -> str:
    """A cuda_ipc lane measured between two pods that share a PID namespace: the check's peer
    used this pod's own GPUs. The other role's pod holds other GPUs, which the device plugin
    keeps out of this pod's sight, and CUDA IPC between GPUs needs each process to see the
    other's GPU (docs/topology.md): that lane is not what was measured."""
    if result.get("link") == "host" or not any(
        str(lane).startswith("cuda_ipc") for lane in result.get("lanes") or []
    ):
        return ""
    return (
        "; its peer used this pod's own GPUs: whether cuda_ipc reaches the other pod's GPUs, "
        "which this pod cannot see, is not measured (docs/topology.md)"
    )


def _engine_note(descriptor: int, at_descriptor: float, link: float, user_block: bool) -> str:
    """Where the engine's KV layout keeps a transfer far below the link, say so with the
    numbers, and with the setting that moves it where the user chose the block size (the
    operator's own choice is already the measured one: docs/engines.md, "KV blocks")."""
    if not descriptor or not at_descriptor or not link:
        return ""
    note = (
        f"; at the engine's {_size(descriptor)} KV descriptors {at_descriptor:.1f} GB/s "
        f"({at_descriptor / link:.0%} of the link's {link:.1f})"
    )
    if user_block and at_descriptor < ENGINE_FRACTION_HINT * link:
        note += ": a larger spec.engine.kvBlockSize makes larger descriptors (docs/benchmarks.md)"
    return note


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def expected_gbps(result: Mapping[str, Any]) -> float:
    given = result.get("expected_gbps")
    if isinstance(given, int | float) and given > 0:
        return float(given)
    return DEFAULT_EXPECTED_GBPS.get(str(result.get("transport", "")), DEFAULT_RDMA_GBPS)


def prober(pods: Sequence[PodSummary], pdd_name: str, prefill_nodes: int = 1) -> PodSummary | None:
    wanted = names.prober_pod_name(pdd_name, prefill_nodes)
    return next((p for p in pods if p.name == wanted), None)


def _seconds_between(earlier: str, later: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        return (datetime.strptime(later, fmt) - datetime.strptime(earlier, fmt)).total_seconds()
    except ValueError:  # a hand-edited annotation: ask again rather than never
        return float("inf")
