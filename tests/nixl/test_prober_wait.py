"""The operator's probe request seen before discovery has found a peer (a prober sidecar that
just started finds the request already on its pod): it waits for a live peer of the other
role, bounded, instead of answering with an error the operator keeps until the next interval.
Pure asyncio, no processes."""

from __future__ import annotations

import asyncio
import time

from pdd_probe.probe import ProbeResult, ProbeSpec
from pdd_sidecar.config import Identity, SidecarConfig
from pdd_sidecar.peers import PeerEndpoint, PeerState, StaticPeerSource
from pdd_sidecar.server import Sidecar


def _sidecar(wait_s: float) -> Sidecar:
    identity = Identity("kv", "ns", "prefill", "kv-prefill-0", "uid-p", "127.0.0.2")
    config = SidecarConfig(identity, token=lambda: "t", probe_peer_wait_s=wait_s)
    return Sidecar(config, StaticPeerSource([]))


def test_a_peer_found_while_waiting_is_probed() -> None:
    sidecar = _sidecar(wait_s=10)
    decode = PeerState(PeerEndpoint("decode", "127.0.0.3", 8790, "kv-decode-0", "uid-d"))
    prefill = PeerState(PeerEndpoint("prefill", "127.0.0.4", 8790, "kv-prefill-1", "uid-q"))
    found_at = time.monotonic() + 0.6
    sidecar.tracker.live_peers = lambda: (  # type: ignore[method-assign]
        [prefill, decode] if time.monotonic() >= found_at else [prefill]
    )
    probed: list[str] = []

    async def probe_peer(peer: PeerState, spec: ProbeSpec) -> ProbeResult:
        probed.append(peer.pod_name)
        return ProbeResult(verified=True, gbps=1.0)

    sidecar.probe_peer = probe_peer  # type: ignore[method-assign]
    result = asyncio.run(sidecar.probe_other_role())
    assert probed == ["kv-decode-0"] and result.verified and result.error is None
    assert time.monotonic() >= found_at


def test_no_peer_at_all_is_an_error_after_the_wait() -> None:
    sidecar = _sidecar(wait_s=0.5)
    started = time.monotonic()
    result = asyncio.run(sidecar.probe_other_role())
    assert 0.5 <= time.monotonic() - started < 5
    assert result.error == "no decode pod with a reachable sidecar to probe"
    assert (result.src_role, result.dst_role) == ("prefill", "decode")


def test_a_named_peer_is_the_one_probed_and_waited_for() -> None:
    # Where instances span nodes the request names this rank's pair: another live decode pod
    # does not stand in for it.
    sidecar = _sidecar(wait_s=10)
    first = PeerState(PeerEndpoint("decode", "127.0.0.3", 8790, "kv-decode-0-0", "uid-d0"))
    pair = PeerState(PeerEndpoint("decode", "127.0.0.5", 8790, "kv-decode-0-1", "uid-d1"))
    found_at = time.monotonic() + 0.6
    sidecar.tracker.live_peers = lambda: (  # type: ignore[method-assign]
        [first, pair] if time.monotonic() >= found_at else [first]
    )
    probed: list[str] = []

    async def probe_peer(peer: PeerState, spec: ProbeSpec) -> ProbeResult:
        probed.append(peer.pod_name)
        return ProbeResult(verified=True, gbps=1.0)

    sidecar.probe_peer = probe_peer  # type: ignore[method-assign]
    result = asyncio.run(sidecar.probe_other_role("kv-decode-0-1"))
    assert probed == ["kv-decode-0-1"] and result.verified


def test_a_named_peer_that_never_answers_is_an_error_naming_it() -> None:
    sidecar = _sidecar(wait_s=0.5)
    other = PeerState(PeerEndpoint("decode", "127.0.0.3", 8790, "kv-decode-0-0", "uid-d0"))
    sidecar.tracker.live_peers = lambda: [other]  # type: ignore[method-assign]
    result = asyncio.run(sidecar.probe_other_role("kv-decode-0-1"))
    assert result.error is not None
    assert result.error.startswith("decode pod kv-decode-0-1, this rank's pair, has no reachable")
    assert result.peer == "kv-decode-0-1"
