"""The probe across two pods: this sidecar starts the initiator, the peer sidecar the target.

``POST /v1/probe`` (on the initiating sidecar) asks the peer's ``POST /v1/probe/targets`` for a
target process, runs the initiator locally against it, and collects the target's verdict from
``GET /v1/probe/targets/{id}``. Both halves are ``pdd_probe.worker`` subprocesses with
this sidecar's environment, which the operator renders with the engine's UCX settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import aiohttp

from pdd_probe.probe import (
    MARKER,
    ProbeResult,
    ProbeSpec,
    merge_results,
    new_agent_name,
    worker_command,
    worker_env,
)

log = logging.getLogger(__name__)

_LINE_LIMIT = 16 << 20  # agent metadata (base64) travels in one JSON line


class ProbeBusy(Exception):
    """A probe is already running here; they would compete for the same memory and link."""


class WorkerProcess:
    """One probe worker subprocess speaking JSON lines (asyncio flavour)."""

    def __init__(self, role: str, proc: asyncio.subprocess.Process, stderr: IO[bytes]) -> None:
        self.role = role
        self._proc = proc
        self._stderr = stderr

    @classmethod
    async def start(cls, role: str, spec: Mapping[str, Any]) -> WorkerProcess:
        stderr = await asyncio.to_thread(tempfile.TemporaryFile)  # closed in stop()
        proc = await asyncio.create_subprocess_exec(
            *worker_command(role),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=worker_env(),
            limit=_LINE_LIMIT,
        )
        worker = cls(role, proc, stderr)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(dict(spec)).encode() + b"\n")
        await proc.stdin.drain()
        return worker

    async def read_event(self, event: str, wait_s: float) -> dict[str, Any]:
        async with asyncio.timeout(wait_s):
            return await self._read_event(event)

    async def _read_event(self, event: str) -> dict[str, Any]:
        assert self._proc.stdout is not None
        while True:
            line = await self._proc.stdout.readline()
            if not line:
                raise RuntimeError(f"probe {self.role} exited (rc={await self._proc.wait()})")
            text = line.decode(errors="replace")
            if text.startswith(MARKER):
                document: dict[str, Any] = json.loads(text[len(MARKER) :])
                if document.get("event") == event:
                    return document

    async def stop(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        await self._proc.wait()
        self._stderr.close()

    async def stderr_tail(self, limit: int = 600) -> str:
        return await asyncio.to_thread(self._read_stderr_tail, limit)

    def _read_stderr_tail(self, limit: int) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:].strip()


@dataclass
class _Target:
    worker: WorkerProcess
    expires: float


class ProbeTargets:
    """Target processes this sidecar runs for peers; at most one at a time."""

    def __init__(self) -> None:
        self._targets: dict[str, _Target] = {}

    async def create(self, spec: ProbeSpec) -> dict[str, Any]:
        await self._reap_expired()
        if self._targets:
            raise ProbeBusy("a probe target is already running in this pod")
        worker = await WorkerProcess.start("target", spec.target_spec(new_agent_name("target")))
        try:
            ready = await worker.read_event("ready", min(spec.timeout_s, 60))
        except (TimeoutError, RuntimeError) as exc:
            tail = await worker.stderr_tail()
            await worker.stop()
            raise RuntimeError(f"probe target did not start: {exc} {tail}".strip()) from exc
        target_id = uuid.uuid4().hex
        self._targets[target_id] = _Target(worker, time.monotonic() + spec.timeout_s + 30)
        ready.pop("event", None)
        return {"id": target_id, "target": ready}

    async def verdict(self, target_id: str, wait_s: float) -> dict[str, Any]:
        target = self._targets.get(target_id)
        if target is None:
            raise KeyError(target_id)
        try:
            verdict = await target.worker.read_event("verified", wait_s)
        except (TimeoutError, RuntimeError) as exc:
            verdict = {"verified": False, "error": f"target: {exc}"}
        await self.delete(target_id)
        verdict.pop("event", None)
        return verdict

    async def delete(self, target_id: str) -> bool:
        target = self._targets.pop(target_id, None)
        if target is None:
            return False
        await target.worker.stop()
        return True

    async def close(self) -> None:
        for target_id in list(self._targets):
            await self.delete(target_id)

    async def _reap_expired(self) -> None:
        now = time.monotonic()
        for target_id in [t for t, target in self._targets.items() if target.expires < now]:
            await self.delete(target_id)


async def run_remote_probe(
    session: aiohttp.ClientSession, peer_url: str, token: str, spec: ProbeSpec
) -> ProbeResult:
    """Initiator here, target in the peer pod. Errors come back inside the result."""
    headers = {"Authorization": f"Bearer {token}"}
    path = f"{spec.src_mem}->{spec.dst_mem}"
    try:
        created = await _post_json(session, f"{peer_url}/v1/probe/targets", spec.to_dict(), headers)
    except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
        return ProbeResult(path=path, block_sizes=list(spec.block_sizes), error=str(exc))
    target_url = f"{peer_url}/v1/probe/targets/{created['id']}"
    initiator = await WorkerProcess.start(
        "initiator", spec.initiator_spec(new_agent_name("initiator"), created["target"])
    )
    try:
        measured = await initiator.read_event("result", spec.timeout_s + 30)
    except (TimeoutError, RuntimeError) as exc:
        tail = await initiator.stderr_tail()
        measured = {"path": path, "error": f"initiator: {exc} {tail}".strip()}
    finally:
        await initiator.stop()
    if measured.get("error"):
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.delete(target_url, headers=headers):
                pass  # the peer kills its target process now instead of at its timeout
        return merge_results(measured, None)
    verdict = await _get_json(session, f"{target_url}?wait_s=30", headers)
    return merge_results(measured, verdict)


async def _post_json(
    session: aiohttp.ClientSession, url: str, body: Mapping[str, Any], headers: Mapping[str, str]
) -> dict[str, Any]:
    async with session.post(
        url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=90)
    ) as response:
        document: dict[str, Any] = await response.json(content_type=None)
        if response.status != 200:
            raise RuntimeError(f"peer sidecar: HTTP {response.status}: {document.get('error')}")
        return document


async def _get_json(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]
) -> dict[str, Any] | None:
    try:
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=60)
        ) as response:
            if response.status != 200:
                return None
            document: dict[str, Any] = await response.json(content_type=None)
            return document
    except (aiohttp.ClientError, TimeoutError):
        return None
