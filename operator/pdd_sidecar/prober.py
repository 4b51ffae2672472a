"""Probes the operator asks for: the prober pod's sidecar answers annotations on its own pod.

The operator never talks to pods. When it wants the KV path verified it stamps
``pdd.dev/probe-request: <id>`` on the prober pod (prefill ordinal 0, ``PDD_PROBER_POD``); this
sidecar notices, runs the transfer probe from its pod to a decode peer, and writes the result,
with ``request_id``, as JSON into ``pdd.dev/probe-result`` on the same pod, where the operator's
pod watch reads it (``pdd_operator.status.transfer``). RBAC: get and patch on that one pod.

Where instances span nodes every prefill rank is a prober (``PDD_PROBER_POD`` is the pod's own
name), and the request comes with ``pdd.dev/probe-peer``: the decode pod that rank measures
against, so that every rank's own GPUs and NICs are on a measured path.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdd_contract.labels import (
    ANNOTATION_PROBE_PEER,
    ANNOTATION_PROBE_REQUEST,
    ANNOTATION_PROBE_RESULT,
)
from pdd_contract.probe_result import ProbeResult

log = logging.getLogger(__name__)


def pending_request(annotations: Mapping[str, str], attempted: str | None) -> str | None:
    """The request id to answer now, if any: stamped, not yet answered, not already tried."""
    request = annotations.get(ANNOTATION_PROBE_REQUEST, "")
    if not request or request == attempted:
        return None
    try:
        answered = json.loads(annotations.get(ANNOTATION_PROBE_RESULT, "") or "{}")
    except ValueError:
        answered = {}
    if isinstance(answered, dict) and answered.get("request_id") == request:
        return None
    return request


def operator_answer(peer: ProbeResult, device: ProbeResult | None) -> ProbeResult:
    """What the operator's KVTransferVerified is computed from. The sidecar has none of the
    engine's GPUs or NICs, so its own probe only shows the peers reach each other; the
    bandwidth and the transport come from the preflight's check with the engine's devices
    when it ran. A peer that cannot be reached fails the answer either way."""
    if device is None or peer.error:
        return peer
    return replace(device, src_role=peer.src_role, dst_role=peer.dst_role, peer=peer.peer)


def read_kv_path_check(path: Path) -> ProbeResult | None:
    """The preflight's result, or None where it did not run (or left nothing readable)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return ProbeResult.from_dict(document) if isinstance(document, dict) else None


def result_annotation(result: ProbeResult, request_id: str) -> dict[str, str]:
    document = {**result.to_dict(), "request_id": request_id}
    return {ANNOTATION_PROBE_RESULT: json.dumps(document, separators=(",", ":"))}


class PodAnnotations:
    """Get/patch one pod's annotations with the ``kubernetes`` client, in a thread."""

    def __init__(self, namespace: str, pod: str) -> None:
        self._namespace, self._pod = namespace, pod
        self._api: Any = None

    def _core(self) -> Any:
        if self._api is None:
            from pdd_kubeconfig import core_v1_api

            self._api = core_v1_api()
        return self._api

    # The client is made in the worker thread too: importing ``kubernetes`` and loading the
    # config take seconds, which would stall the event loop (and /healthz) at start-up.

    async def read(self) -> dict[str, str]:
        pod = await asyncio.to_thread(
            lambda: self._core().read_namespaced_pod(
                self._pod, self._namespace, _request_timeout=30
            )
        )
        return dict(pod.metadata.annotations or {})

    async def patch(self, annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        await asyncio.to_thread(
            lambda: self._core().patch_namespaced_pod(
                self._pod, self._namespace, body, _request_timeout=30
            )
        )


class ProbeRequests:
    """Polls the pod for a new request id; runs one probe per id and writes its result.
    ``run_probe`` is given the peer pod the request names ("" for any peer of the other
    role)."""

    def __init__(
        self,
        pod: PodAnnotations,
        run_probe: Callable[[str], Awaitable[ProbeResult]],
        poll_s: float = 5.0,
    ) -> None:
        self._pod = pod
        self._run_probe = run_probe
        self._poll_s = poll_s
        self._attempted: str | None = None

    async def check_once(self) -> str | None:
        annotations = await self._pod.read()
        request = pending_request(annotations, self._attempted)
        if request is None:
            return None
        # Mark before running: a probe that crashes the worker must not be retried in a loop;
        # the operator stamps a new id when it wants another attempt.
        self._attempted = request
        peer = annotations.get(ANNOTATION_PROBE_PEER, "")
        log.info("running the transfer probe requested at %s (peer: %s)", request, peer or "any")
        result = await self._run_probe(peer)
        await self._pod.patch(result_annotation(result, request))
        return request

    async def run(self) -> None:
        delay = self._poll_s
        while True:
            try:
                await self.check_once()
                delay = self._poll_s
            except Exception as exc:  # API server unreachable, RBAC missing: say so, back off
                log.warning("probe requests: %s", exc)
                delay = min(delay * 2, 60.0)
            await asyncio.sleep(delay)
