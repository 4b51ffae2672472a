"""The NIXL agents this pod's engine published to its own sidecar."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import dataclass
from typing import Any


class ChangeSignal:
    """Wakes long-polls when something changed. One event per change, replaced after firing,
    so a waiter never misses a change that happened between its check and its wait."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, wait_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), wait_s)


@dataclass
class LocalAgent:
    name: str
    metadata: bytes
    sha256: str
    published_at: float
    expires_at: float | None  # monotonic deadline; None: until unpublished
    etcd_mod_revision: int | None = None

    def to_json(self, include_metadata: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "sha256": self.sha256,
            "published_at": self.published_at,
            "etcd_mod_revision": self.etcd_mod_revision,
        }
        if include_metadata:
            import base64

            doc["metadata_b64"] = base64.b64encode(self.metadata).decode()
        return doc


class LocalAgents:
    """Published agents with a generation counter peers long-poll on.

    Re-publishing identical bytes only refreshes the TTL: it is the engine's heartbeat, so an
    engine that dies inside a live pod stops being served once its TTL runs out.
    """

    def __init__(self, start_generation: int = 0) -> None:
        self.generation = start_generation
        self._agents: dict[str, LocalAgent] = {}
        self._signal = ChangeSignal()

    def publish(
        self, name: str, metadata: bytes, ttl_s: float | None, etcd_mod_revision: int | None = None
    ) -> LocalAgent:
        sha = hashlib.sha256(metadata).hexdigest()
        expires = time.monotonic() + ttl_s if ttl_s else None
        current = self._agents.get(name)
        if current is not None and (current.sha256, current.etcd_mod_revision) == (
            sha,
            etcd_mod_revision,
        ):
            current.expires_at = expires
            return current
        agent = LocalAgent(name, metadata, sha, time.time(), expires, etcd_mod_revision)
        self._agents[name] = agent
        self._bump()
        return agent

    def unpublish(self, name: str) -> bool:
        if self._agents.pop(name, None) is None:
            return False
        self._bump()
        return True

    def expire(self) -> list[str]:
        now = time.monotonic()
        gone = [
            a.name for a in self._agents.values() if a.expires_at is not None and a.expires_at < now
        ]
        for name in gone:
            del self._agents[name]
        if gone:
            self._bump()
        return gone

    def set_etcd_revision(self, name: str, revision: int | None) -> None:
        agent = self._agents.get(name)
        if agent is not None and agent.etcd_mod_revision != revision:
            agent.etcd_mod_revision = revision
            self._bump()

    def get(self, name: str) -> LocalAgent | None:
        return self._agents.get(name)

    def all(self) -> list[LocalAgent]:
        return list(self._agents.values())

    async def wait_changed(self, since: int, wait_s: float) -> None:
        if since == self.generation:
            await self._signal.wait(wait_s)

    def release_waiters(self) -> None:
        self._signal.fire()

    def _bump(self) -> None:
        self.generation += 1
        self._signal.fire()
