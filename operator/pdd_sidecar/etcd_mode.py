"""Mode etcd: engines exchange NIXL metadata through NIXL's own etcd client; the sidecar removes
what a departed agent left behind.

NIXL key layout (nixl 1.5.1, ``libnixl.so``; observed with the real wheel against etcd 3.6):
every key of an agent lives under ``{NIXL_ETCD_NAMESPACE}/{agent}/`` - the namespace string,
a ``/``, the agent name, a ``/`` - with the full metadata at ``.../metadata``, partial metadata at
``.../{label}`` and an empty marker key ``{namespace}/{agent}/`` itself. The default namespace is
``/nixl/agents/``, which yields ``/nixl/agents//{agent}/metadata`` (double slash). The keys carry
no lease: an engine killed without ``invalidate_local_metadata()`` leaves them forever, and a
peer engine whose NIXL watches the key is told to drop the agent only when the key is deleted.

Deletion is guarded by the metadata key's ``mod_revision`` as the departed pod's own sidecar last
reported it: a successor that re-used the agent name and re-published has a newer revision, and
its keys are left alone. The etcd v3 JSON gateway (``/v3/kv/...``, base64 keys) is used through
aiohttp so no etcd client library is needed.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp

from pdd_sidecar.config import EtcdSettings
from pdd_sidecar.metrics import SidecarMetrics
from pdd_sidecar.peer_view import POD_GONE, UID_CHANGED, UNPUBLISHED, Removal
from pdd_sidecar.registry import LocalAgents

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "/nixl/agents/"
METADATA_LABEL = "metadata"
# Departures that mean the agent is gone for good; an unreachable pod may still be running.
CLEANUP_REASONS = frozenset({POD_GONE, UID_CHANGED, UNPUBLISHED})


def agent_prefix(namespace: str, agent: str) -> str:
    return f"{namespace}/{agent}/"


def metadata_key(namespace: str, agent: str, label: str = METADATA_LABEL) -> str:
    return f"{agent_prefix(namespace, agent)}{label}"


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key starting with prefix": the prefix plus one, carried."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"  # all 0xff: to the end of the keyspace


def _b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


class EtcdGateway:
    """The few etcd v3 calls the sidecar needs, over the HTTP/JSON gateway."""

    def __init__(self, endpoints: Sequence[str], session: aiohttp.ClientSession) -> None:
        if not endpoints:
            raise ValueError("etcd mode needs at least one endpoint (NIXL_ETCD_ENDPOINTS)")
        self._endpoints = [e if "://" in e else f"http://{e}" for e in endpoints]
        self._session = session

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors = []
        for endpoint in self._endpoints:
            try:
                async with self._session.post(
                    f"{endpoint.rstrip('/')}{path}",
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as response:
                    if response.status != 200:
                        raise aiohttp.ClientError(f"HTTP {response.status}")
                    document: dict[str, Any] = await response.json(content_type=None)
                    return document
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors.append(f"{endpoint}: {exc}")
        raise ConnectionError("; ".join(errors))

    async def mod_revision(self, key: str) -> int | None:
        document = await self._call("/v3/kv/range", {"key": _b64(key), "keys_only": True})
        kvs = document.get("kvs") or []
        return int(kvs[0]["mod_revision"]) if kvs else None

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        body = {
            "key": _b64(prefix),
            "range_end": _b64(prefix_range_end(prefix.encode())),
            "keys_only": True,
        }
        document = await self._call("/v3/kv/range", body)
        return [base64.b64decode(kv["key"]).decode() for kv in document.get("kvs") or []]

    async def delete_prefix_if_unchanged(self, prefix: str, key: str, mod_revision: int) -> bool:
        """Delete every key under ``prefix`` iff ``key`` is still at ``mod_revision``."""
        body = {
            "compare": [
                {
                    "key": _b64(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(mod_revision),
                }
            ],
            "success": [
                {
                    "request_delete_range": {
                        "key": _b64(prefix),
                        "range_end": _b64(prefix_range_end(prefix.encode())),
                    }
                }
            ],
        }
        document = await self._call("/v3/kv/txn", body)
        return bool(document.get("succeeded"))


class EtcdJanitor:
    """Reports this pod's agents' etcd revisions, and deletes the keys of departed peers."""

    def __init__(
        self,
        settings: EtcdSettings,
        gateway: EtcdGateway,
        local: LocalAgents,
        metrics: SidecarMetrics,
    ) -> None:
        self.namespace = settings.namespace
        self._gateway = gateway
        self._local = local
        self._metrics = metrics

    async def revision(self, agent: str) -> int | None:
        """The agent's metadata key revision now; None when absent or etcd is unreachable."""
        try:
            return await self._gateway.mod_revision(metadata_key(self.namespace, agent))
        except ConnectionError as exc:
            log.warning("reading the NIXL etcd key of agent %s failed: %s", agent, exc)
            return None

    async def refresh_own_revisions(self) -> None:
        """What peers will compare against once this pod is gone."""
        for agent in self._local.all():
            revision = await self._gateway.mod_revision(metadata_key(self.namespace, agent.name))
            self._local.set_etcd_revision(agent.name, revision)

    async def run_refresh(self, interval_s: float) -> None:
        while True:
            try:
                await self.refresh_own_revisions()
            except ConnectionError as exc:
                log.warning("reading own NIXL etcd keys failed: %s", exc)
            await asyncio.sleep(interval_s)

    async def on_removed(self, removals: list[Removal]) -> None:
        for removal in removals:
            record = removal.record
            if removal.reason not in CLEANUP_REASONS or record.etcd_mod_revision is None:
                continue
            try:
                deleted = await self._gateway.delete_prefix_if_unchanged(
                    agent_prefix(self.namespace, record.name),
                    metadata_key(self.namespace, record.name),
                    record.etcd_mod_revision,
                )
            except ConnectionError as exc:
                log.warning("deleting NIXL etcd keys of agent %s failed: %s", record.name, exc)
                continue
            if deleted:
                self._metrics.etcd_keys_deleted.inc()
                log.info(
                    "deleted NIXL etcd keys of departed agent %s (%s)", record.name, removal.reason
                )
            else:
                # Another peer was first, or a successor re-published under the same name.
                log.info("NIXL etcd keys of agent %s already gone or re-published", record.name)
