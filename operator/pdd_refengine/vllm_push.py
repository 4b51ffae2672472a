"""vLLM's NixlPushConnector protocol (0.24 and later), prefill pushes (WRITE).

The prefill answers its leg with ``kv_transfer_params`` (0.33.0 ``nixl/push_scheduler.py``
``request_finished``: the pull answer's keys with ``transfer_mode: push``) and keeps the
blocks. vllm-router 0.1.17 sends the first request's decode leg after that answer and, once
it knows the prefill pushes, every later one at the same time as the prefill's, with the
prefill's engine id, side channel and the request's shared id (``X-Request-Id``) but no
block ids (``kv_params.parse_push_prefill``). The decode allocates its
blocks for the prompt and registers them with the prefill by a NIXL notification (vLLM's
decode worker sends its block ids and side channel the same way, ``push_registrations``);
the prefill asks the decode's side channel for its region layout (vLLM's "reverse
handshake"), WRITEs its blocks into the decode's and notifies; the decode checks every byte.
A registration that arrives before the prefill has finished waits for it, as vLLM's prefill
worker matches registrations against finished requests in either order.

Notifications, the reference engine's own, each a tag and JSON: ``pdd-push-reg:`` a
registration (decode to prefill), ``pdd-pushed:`` the request id with the prefill's identity
and address once the KV landed, or with an ``error`` (prefill to decode). The decode's agent
metadata comes from the prefill pod's sidecar, never from the
registration.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from pdd_refengine.engine import (
    Engine,
    KvOutcome,
    compute_prompt_kv,
    http_json,
    off_loop,
    region_of,
)
from pdd_refengine.kv_params import KvParamsError, RemotePrefill, parse_push_prefill
from pdd_refengine.kvcache import TransferError
from pdd_refengine.openai_api import Completion
from pdd_refengine.vllm_flow import HANDSHAKE_PATH, side_channel

REGISTER_TAG = b"pdd-push-reg:"
PUSHED_TAG = b"pdd-pushed:"
TRANSFER_MODE = "push"


@dataclass(frozen=True)
class Registration:
    """A decode's blocks for one request, and where its side channel answers."""

    request_id: str
    agent: str
    host: str
    port: int
    blocks: tuple[int, ...]
    tokens: int

    def encode(self) -> bytes:
        body = {**self.__dict__, "blocks": list(self.blocks)}
        return REGISTER_TAG + json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, message: bytes) -> Registration:
        body = json.loads(message[len(REGISTER_TAG) :])
        return cls(
            str(body["request_id"]),
            str(body["agent"]),
            str(body["host"]),
            int(body["port"]),
            tuple(int(b) for b in body["blocks"]),
            int(body["tokens"]),
        )


@dataclass(frozen=True)
class Finished:
    """A prefilled request's blocks, kept until a decode's registration takes them."""

    blocks: tuple[int, ...]
    tokens: int
    until: float


class Pushes:
    """The prefill's finished requests and the decodes' registrations, matched in either
    order; the decode's waits for the prefill's notification."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._loop = loop
        self.timeout_s = float(os.environ.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT") or 120)
        self.finished: dict[str, Finished] = {}
        self.registered: dict[str, Registration] = {}
        self.arrivals: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def awaits_peers(self) -> bool:
        """A finished request awaits its decode's registration, or a decode its push."""
        return bool(self.finished or self.arrivals)

    def on_notif(self, _agent: str, message: bytes) -> None:
        """From the notification thread: a registration (prefill) or a pushed KV (decode)."""
        if message.startswith(REGISTER_TAG):
            try:
                registration = Registration.decode(message)
            except (ValueError, KeyError, TypeError):
                return  # not ours to answer: the decode times out and says so
            self._loop.call_soon_threadsafe(self._registered, registration)
        elif message.startswith(PUSHED_TAG):
            try:
                pushed = json.loads(message[len(PUSHED_TAG) :])
            except ValueError:
                return
            self._loop.call_soon_threadsafe(self._arrived, str(pushed.get("request_id")), pushed)

    def finish(self, request_id: str, blocks: list[int], tokens: int) -> None:
        """The prefill holds these blocks for a decode's registration, or until the lease."""
        until = time.monotonic() + self.timeout_s
        self.finished[request_id] = Finished(tuple(blocks), tokens, until)
        self._loop.call_later(self.timeout_s, self._expire, request_id)
        self._match(request_id)

    def _registered(self, registration: Registration) -> None:
        self.registered[registration.request_id] = registration
        self._match(registration.request_id)

    def _match(self, request_id: str) -> None:
        if request_id in self.finished and request_id in self.registered:
            done, registration = self.finished.pop(request_id), self.registered.pop(request_id)
            self._loop.create_task(self._push(done, registration))

    async def _push(self, done: Finished, registration: Registration) -> None:
        engine = self._engine
        try:
            seconds = await off_loop(_write, engine, done, registration)
        except Exception as exc:  # reported to the decode, which answers its client
            await off_loop(_tell_failed, engine, registration, str(exc))
        else:
            engine.metrics.kv_bytes_sent.inc(done.tokens * engine.cache.bytes_per_token)
            engine.metrics.kv_transfer_seconds.observe(seconds)
        finally:
            engine.cache.release(done.blocks)

    def _expire(self, request_id: str) -> None:
        done = self.finished.get(request_id)
        if done is not None and done.until <= time.monotonic():
            del self.finished[request_id]
            self._engine.cache.release(done.blocks)

    def _arrived(self, request_id: str, pushed: dict[str, Any]) -> None:
        future = self.arrivals.get(request_id)
        if future is not None and not future.done():
            future.set_result(pushed)


def _write(engine: Engine, done: Finished, registration: Registration) -> float:
    """The reverse handshake with the decode's side channel, then the WRITE."""
    with engine.kv_steps(f"KV push to {registration.agent}") as steps:
        deadline = time.monotonic() + engine.kv_timeout_s
        if registration.tokens != done.tokens:
            raise TransferError(
                f"the decode expects {registration.tokens} tokens, not {done.tokens}"
            )
        url = f"http://{registration.host}:{registration.port}{HANDSHAKE_PATH}"
        region = region_of(http_json("GET", url, None, min(5.0, engine.kv_timeout_s)))
        if region.agent_name != registration.agent:
            raise TransferError(f"{url} serves engine {region.agent_name}, not the registrant")
        steps.done("handshake")
        engine.load_peer(registration.agent, deadline)
        steps.done("metadata")
        seconds = engine.cache.transfer(
            "WRITE",
            region,
            registration.blocks,
            done.blocks,
            done.tokens,
            pushed_message(
                registration.request_id, identity=engine.identity, address=engine.address
            ),
            max(0.1, deadline - time.monotonic()),
        )
        steps.done("transfer")
        return seconds


def pushed_message(request_id: str, **fields: str) -> bytes:
    """The prefill's word to the decode: ``pdd-pushed:`` and JSON (request ids hold colons)."""
    body = {"request_id": request_id, **fields}
    return PUSHED_TAG + json.dumps(body, separators=(",", ":")).encode()


def _tell_failed(engine: Engine, registration: Registration, why: str) -> None:
    message = pushed_message(registration.request_id, error=why[:300])
    try:
        engine.cache.send_notif(registration.agent, message)
    except Exception:  # the decode's agent is unknown here: it times out and says so
        return


async def prefill(engine: Engine, pushes: Pushes, req: Completion) -> dict[str, Any]:
    tokens = len(req.prompt_tokens)
    blocks = await compute_prompt_kv(engine, req)
    pushes.finish(req.request_id, blocks, tokens)
    params = RemotePrefill(
        tuple(blocks),
        engine.engine_id,
        *side_channel(engine.config),
        engine.config.tp_size,
        request_id=req.request_id,
        tokens=tokens,
    ).to_params("0.33")
    return {"kv_transfer_params": {**params, "transfer_mode": TRANSFER_MODE}}


async def decode(engine: Engine, pushes: Pushes, req: Completion, params: Any) -> KvOutcome:
    remote = parse_push_prefill(params)
    mode = params.get("transfer_mode", TRANSFER_MODE)
    if mode != TRANSFER_MODE:
        raise KvParamsError(
            f"kv_transfer_params: transfer_mode {mode!r}, but this decode runs "
            "NixlPushConnector (prefill and decode must use the same connector)"
        )
    tokens = len(req.prompt_tokens)
    blocks = await off_loop(engine.cache.allocate, tokens)
    arrival: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    pushes.arrivals[remote.request_id] = arrival
    start = time.perf_counter()
    try:
        with engine.kv_steps(f"KV wait for a push from {remote.engine_id}") as steps:
            await off_loop(_register, engine, remote, blocks, tokens)
            steps.done("registered")
            pushed = await asyncio.wait_for(arrival, engine.kv_timeout_s)
            if pushed.get("error"):
                raise TransferError(f"the prefill could not push the KV: {pushed['error']}")
            steps.done("arrived")
        prefill = str(pushed.get("identity") or remote.host)
        address = str(pushed.get("address") or remote.host)
        seconds = time.perf_counter() - start
        problem = await off_loop(engine.cache.verify_prompt, blocks, req.digest, tokens)
    except TimeoutError:
        raise TransferError(
            f"no KV pushed from {remote.engine_id} within {engine.kv_timeout_s:g}s"
        ) from None
    finally:
        pushes.arrivals.pop(remote.request_id, None)
        engine.cache.release(blocks)
    outcome = KvOutcome(
        prefill, engine.identity, tokens * engine.cache.bytes_per_token,
        problem is None, seconds, address, engine.address,
    )  # fmt: skip
    engine.record_received(outcome)
    if problem is not None:
        raise TransferError(f"KV from {outcome.prefill} failed verification: {problem}")
    return outcome


def _register(engine: Engine, remote: RemotePrefill, blocks: list[int], tokens: int) -> None:
    """The prefill's side channel (is it the engine the answer names?) and its agent from
    the sidecar, then this decode's blocks to it."""
    url = f"http://{remote.host}:{remote.port}{HANDSHAKE_PATH}"
    serving = region_of(http_json("GET", url, None, min(5.0, engine.kv_timeout_s))).agent_name
    if serving != remote.engine_id:
        raise TransferError(f"{url} serves engine {serving}, not {remote.engine_id}")
    engine.load_peer(remote.engine_id, time.monotonic() + engine.kv_timeout_s)
    host, port = side_channel(engine.config)
    registration = Registration(
        remote.request_id, engine.engine_id, host, port, tuple(blocks), tokens
    )
    engine.cache.send_notif(remote.engine_id, registration.encode())
