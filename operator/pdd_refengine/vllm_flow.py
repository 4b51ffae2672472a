"""vLLM's NixlConnector protocol, decode pulls (READ).

Prefill (``do_remote_decode``): compute the prompt's KV into blocks, keep them, answer with
``kv_transfer_params`` naming them, this engine's id and its side channel. The blocks are
freed when the decode's notification arrives, or after VLLM_NIXL_ABORT_REQUEST_TIMEOUT (as
vLLM does for a decode that never comes).

Decode (``do_remote_prefill``): ask the prefill's side channel (``remote_host:remote_port``,
VLLM_NIXL_SIDE_CHANNEL_HOST/PORT there) where its blocks are, load its NIXL agent metadata
from this pod's sidecar (never from the side channel: the sidecar drops metadata of departed
pods), READ the blocks with the free notification attached (vLLM attaches it the same way, so
the prefill frees once the READ is done), then check every byte.

The side channel here is HTTP (``GET /pdd/handshake``) where vLLM's is ZMQ; it carries only
the region layout (base address, block size), which vLLM's handshake carries too.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from aiohttp import web

from pdd_refengine.cli import EngineConfig
from pdd_refengine.engine import (
    Engine,
    KvOutcome,
    KvSteps,
    compute_prompt_kv,
    http_json,
    off_loop,
    region_of,
)
from pdd_refengine.kv_params import RemotePrefill, parse_remote_prefill
from pdd_refengine.kvcache import TransferError
from pdd_refengine.openai_api import Completion

FREE_TAG = b"pdd-free:"
HANDSHAKE_PATH = "/pdd/handshake"
HOLD_TIMEOUT_ENV = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"


class HeldBlocks:
    """Blocks kept for decodes to read, freed by notification or timeout."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._held: dict[tuple[int, ...], int] = {}  # block ids -> KV bytes
        self.timeout_s = float(os.environ.get(HOLD_TIMEOUT_ENV) or 120)

    def hold(self, blocks: list[int], kv_bytes: int, loop: asyncio.AbstractEventLoop) -> None:
        key = tuple(blocks)
        self._held[key] = kv_bytes
        loop.call_later(self.timeout_s, self._expire, key)

    def awaits_peers(self) -> bool:
        """Blocks held: a decode may read them (this engine is the read's passive side)."""
        return bool(self._held)

    def _expire(self, key: tuple[int, ...]) -> None:
        if self._held.pop(key, None) is not None:
            self._engine.cache.release(key)

    def on_notif(self, _agent: str, message: bytes) -> None:
        """Called from the notification thread: a decode finished reading these blocks."""
        if not message.startswith(FREE_TAG):
            return
        key = tuple(int(b) for b in message[len(FREE_TAG) :].decode().split(",") if b)
        kv_bytes = self._held.pop(key, None)
        if kv_bytes is not None:
            self._engine.cache.release(key)
            self._engine.metrics.kv_bytes_sent.inc(kv_bytes)


async def prefill(engine: Engine, held: HeldBlocks, req: Completion) -> dict[str, Any]:
    tokens = len(req.prompt_tokens)
    blocks = await compute_prompt_kv(engine, req)
    held.hold(blocks, tokens * engine.cache.bytes_per_token, asyncio.get_running_loop())
    params = RemotePrefill(
        tuple(blocks),
        engine.engine_id,
        *side_channel(engine.config),
        engine.config.tp_size,
        request_id=req.request_id,
        tokens=tokens,
    ).to_params(engine.config.protocol)
    return {"kv_transfer_params": params}


async def decode(engine: Engine, req: Completion, params: Any) -> KvOutcome:
    remote = parse_remote_prefill(params, engine.config.protocol)
    return await off_loop(_pull_and_verify, engine, req, remote)


def _pull_and_verify(engine: Engine, req: Completion, remote: RemotePrefill) -> KvOutcome:
    with engine.kv_steps(f"KV pull from {remote.engine_id}") as steps:
        return _pull_steps(engine, req, remote, steps)


def _pull_steps(
    engine: Engine, req: Completion, remote: RemotePrefill, steps: KvSteps
) -> KvOutcome:
    deadline = time.monotonic() + engine.kv_timeout_s
    url = f"http://{remote.host}:{remote.port}{HANDSHAKE_PATH}"
    handshake = http_json("GET", url, None, min(5.0, engine.kv_timeout_s))
    steps.done("handshake")
    region = region_of(handshake)
    if region.agent_name != remote.engine_id:
        raise_mismatch(remote, region.agent_name)
    engine.load_peer(remote.engine_id, deadline)
    steps.done("metadata")
    tokens = len(req.prompt_tokens)
    local = engine.cache.allocate(tokens)
    try:
        notif = FREE_TAG + ",".join(map(str, remote.block_ids)).encode()
        seconds = engine.cache.transfer(
            "READ",
            region,
            remote.block_ids,
            local,
            tokens,
            notif,
            max(0.1, deadline - time.monotonic()),
        )
        steps.done("transfer")
        problem = engine.cache.verify_prompt(local, req.digest, tokens)
    finally:
        engine.cache.release(local)
    outcome = KvOutcome(
        str(handshake.get("identity", remote.host)),
        engine.identity,
        tokens * engine.cache.bytes_per_token,
        problem is None,
        seconds,
        str(handshake.get("address", remote.host)),
        engine.address,
    )
    engine.record_received(outcome)
    if problem is not None:
        raise TransferError(f"KV from {outcome.prefill} failed verification: {problem}")
    return outcome


def raise_mismatch(remote: RemotePrefill, serving: str) -> None:
    raise TransferError(
        f"{remote.host}:{remote.port} serves engine {serving}, not {remote.engine_id} "
        "(the prefill restarted since it answered?)"
    )


def side_channel(config: EngineConfig) -> tuple[str, int]:
    """Where this engine's side channel listens (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, as vLLM's):
    the pull and push flows name it in their answers, the server binds it."""
    host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or config.host
    return host, int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT") or 5600)


def side_channel_app(engine: Engine) -> web.Application:
    async def handshake(_request: web.Request) -> web.Response:
        return web.json_response(engine.region_json())

    app = web.Application()
    app.router.add_get(HANDSHAKE_PATH, handshake)
    return app
