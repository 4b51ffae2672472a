"""Can this pod reach its peers' engine side channels?

vLLM's NixlConnector exchanges NIXL metadata over a ZMQ side channel on port 5600 + dp rank of
``VLLM_NIXL_SIDE_CHANNEL_HOST`` (which must be the pod IP); SGLang's decode side fetches it from
the prefill side's bootstrap server on port 8998. A side channel that is not reachable (wrong
host, NetworkPolicy, engine not up) makes every request wait for a handshake timeout, so the
sidecar checks each peer's port with a plain TCP connect and reports it. Which ports to check
on peers of which roles comes from the operator's environment (pdd_contract.ports), so an
engine the sidecar has never heard of is checked the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pdd_contract.env import PDD_SIDE_CHANNEL_PORTS, PDD_SIDE_CHANNEL_ROLES
from pdd_contract.ports import NO_SIDE_CHANNEL, SIDE_CHANNEL_SERVED_BY, RankPorts, ports_of_rank
from pdd_sidecar.config import ROLES
from pdd_sidecar.metrics import SidecarMetrics
from pdd_sidecar.peers import PeerEndpoint, PeerState


@dataclass(frozen=True)
class SideChannel:
    """Which ports to check, on peers of which roles: ``ports`` on every pod, except for the
    roles in ``rank_ports``, whose pods listen on their rank's."""

    ports: tuple[int, ...]
    target_roles: frozenset[str]
    rank_ports: Mapping[str, RankPorts] = field(default_factory=dict)

    def ports_of(self, endpoint: PeerEndpoint) -> tuple[int, ...]:
        if endpoint.role in self.rank_ports:
            return ports_of_rank(self.rank_ports[endpoint.role], endpoint.pod_index)
        return self.ports


def side_channel_for(
    channel: str,
    own_role: str,
    ports: tuple[int, ...],
    served_by: tuple[str, ...] = (),
    rank_ports: Mapping[str, RankPorts] | None = None,
) -> SideChannel | None:
    """The side channel seen from a pod of ``own_role``: ``ports`` on the peers of the roles
    that serve it other than its own (their rank's where ``rank_ports`` names the role).
    ``served_by`` defaults to what ports.py knows of the channel."""
    if channel == NO_SIDE_CHANNEL:
        return None
    roles = served_by or SIDE_CHANNEL_SERVED_BY.get(channel, ())
    if not roles:
        raise ValueError(
            f"side channel {channel!r}: name the roles whose pods serve it "
            f"({PDD_SIDE_CHANNEL_ROLES}), or use {NO_SIDE_CHANNEL!r}"
        )
    if not ports:
        raise ValueError(f"side channel {channel!r}: give its ports ({PDD_SIDE_CHANNEL_PORTS})")
    if unserved := sorted(set(rank_ports or {}) - set(roles)):
        raise ValueError(f"ports per rank for {', '.join(unserved)}, which does not serve it")
    return SideChannel(ports, frozenset(roles) - {own_role}, dict(rank_ports or {}))


@dataclass(frozen=True)
class PortCheck:
    reachable: bool
    latency_ms: float | None
    error: str | None
    checked_at: float

    def to_json(self) -> dict[str, object]:
        return {
            "reachable": self.reachable,
            "latency_ms": self.latency_ms,
            "error": self.error,
            "checked_at": self.checked_at,
        }


async def check_port(host: str, port: int, timeout_s: float) -> PortCheck:
    """A TCP connect, closed at once: the engine sees a connection without a message."""
    started = time.monotonic()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        error = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        return PortCheck(False, None, error, time.time())
    latency = round((time.monotonic() - started) * 1000, 2)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return PortCheck(True, latency, None, time.time())


class ReachabilityChecker:
    """Checks every live peer of the target roles each interval; results in status + metrics."""

    def __init__(
        self,
        channel: SideChannel,
        peers: Callable[[], list[PeerState]],
        metrics: SidecarMetrics,
        timeout_s: float = 2.0,
    ) -> None:
        self.channel = channel
        self._peers = peers
        self._metrics = metrics
        self._timeout_s = timeout_s
        self.results: dict[tuple[str, int], PortCheck] = {}  # (pod, port) -> last check

    async def check_once(self) -> None:
        targets = [
            (peer.pod_name, peer.endpoint.host, port)
            for peer in self._peers()
            if peer.endpoint.role in self.channel.target_roles and peer.endpoint.role in ROLES
            for port in self.channel.ports_of(peer.endpoint)
        ]
        checks = await asyncio.gather(
            *(check_port(host, port, self._timeout_s) for _, host, port in targets)
        )
        fresh = {(pod, port): check for (pod, _, port), check in zip(targets, checks, strict=True)}
        for pod, port in set(self.results) - set(fresh):
            # Keep label cardinality bounded: a departed pod's series goes away with it.
            with contextlib.suppress(KeyError):
                self._metrics.peer_reachable.remove(pod, str(port))
        for (pod, port), check in fresh.items():
            self._metrics.peer_reachable.labels(pod, str(port)).set(1 if check.reachable else 0)
        self.results = fresh

    async def run(self, interval_s: float) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(interval_s)

    def to_json(self) -> list[dict[str, object]]:
        return [
            {"pod": pod, "port": port, **check.to_json()}
            for (pod, port), check in sorted(self.results.items())
        ]
