"""The prober sidecar's request loop: one probe per request id, against the peer the request
names where it names one (every prefill rank of a multi-node instance has its own pair)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from pdd_contract.probe_result import ProbeResult
from pdd_sidecar.prober import PodAnnotations, ProbeRequests

REQUEST, RESULT, PEER = "pdd.dev/probe-request", "pdd.dev/probe-result", "pdd.dev/probe-peer"


class PodInMemory(PodAnnotations):
    """One pod's annotations in a dict: the loop's only contact with the API server."""

    def __init__(self, annotations: dict[str, str]) -> None:
        super().__init__("ns", "kv-prefill-0-1")
        self.annotations = annotations

    async def read(self) -> dict[str, str]:
        return dict(self.annotations)

    async def patch(self, annotations: Mapping[str, str]) -> None:
        self.annotations.update(annotations)


def run_once(pod: PodInMemory, probed: list[str]) -> str | None:
    async def probe(peer: str) -> ProbeResult:
        probed.append(peer)
        return ProbeResult(verified=True, gbps=2.0, peer=peer)

    return asyncio.run(ProbeRequests(pod, probe).check_once())


def test_the_named_peer_is_probed_and_the_answer_carries_the_request_id() -> None:
    pod = PodInMemory({REQUEST: "2026-12-01T00:00:00Z", PEER: "kv-decode-0-1"})
    probed: list[str] = []
    assert run_once(pod, probed) == "2026-12-01T00:00:00Z"
    assert probed == ["kv-decode-0-1"]
    answer = json.loads(pod.annotations[RESULT])
    assert answer["request_id"] == "2026-12-01T00:00:00Z" and answer["peer"] == "kv-decode-0-1"
    assert run_once(pod, probed) is None and probed == ["kv-decode-0-1"]  # answered: not again


def test_without_a_named_peer_any_peer_will_do() -> None:
    probed: list[str] = []
    run_once(PodInMemory({REQUEST: "2026-12-01T00:00:00Z"}), probed)
    assert probed == [""]
