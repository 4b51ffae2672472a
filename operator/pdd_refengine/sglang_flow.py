"""SGLang's disaggregation protocol with NIXL, prefill pushes (WRITE).

smg sends one request to a prefill and the same to a decode, both with ``bootstrap_host``,
``bootstrap_port`` (the prefill's ``--disaggregation-bootstrap-port``) and ``bootstrap_room``.
As in SGLang, the decode tells the prefill's bootstrap server where the room's KV is to land
(its agent name and destination blocks), the prefill WRITEs it there and notifies, and the
decode checks every byte before it generates.

Bootstrap server (prefill only), the reference engine's own paths:
``PUT /pdd/rooms/{room}`` a decode's registration, answered with the prefill's identity;
``GET /pdd/rooms/{room}`` the room's state (``waiting``, ``sent``, ``failed`` with an error),
which a decode polls so that a prefill's failure reaches it at once rather than at its timeout.
The decode's agent metadata comes from the prefill pod's sidecar, never from the room.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web

from pdd_refengine.engine import (
    Engine,
    KvOutcome,
    KvSteps,
    compute_prompt_kv,
    http_json,
    off_loop,
    region_of,
)
from pdd_refengine.kvcache import RegionInfo, TransferError
from pdd_refengine.openai_api import BadRequest, Completion

ROOM_TAG = b"pdd-room:"
ROOMS_PATH = "/pdd/rooms/{room}"


@dataclass
class Room:
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    region: RegionInfo | None = None
    blocks: tuple[int, ...] = ()
    tokens: int = 0
    state: str = "waiting"  # waiting | sent | failed
    error: str = ""
    created: float = field(default_factory=time.monotonic)


class Rooms:
    """The prefill's rooms, by ``bootstrap_room``; the decode's waits for notifications."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._loop = loop
        self.rooms: dict[str, Room] = {}
        self.arrivals: dict[str, asyncio.Future[str]] = {}

    def room(self, key: str) -> Room:
        self._expire_old()
        return self.rooms.setdefault(key, Room())

    def _expire_old(self) -> None:
        horizon = time.monotonic() - 4 * self._engine.kv_timeout_s
        for key in [k for k, r in self.rooms.items() if r.created < horizon]:
            del self.rooms[key]

    def on_notif(self, _agent: str, message: bytes) -> None:
        """From the notification thread: ``pdd-room:ROOM:ok`` or ``pdd-room:ROOM:failed:WHY``."""
        if message.startswith(ROOM_TAG):
            room, _, status = message[len(ROOM_TAG) :].decode().partition(":")
            self._loop.call_soon_threadsafe(self._settle, room, status)

    def _settle(self, room: str, status: str) -> None:
        future = self.arrivals.get(room)
        if future is not None and not future.done():
            future.set_result(status)


def bootstrap_of(req: Completion) -> tuple[str, int, str] | None:
    host, port, room = (
        req.body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    )
    if host is None and room is None:
        return None
    if host is None or port is None or room is None:
        raise BadRequest("bootstrap_host, bootstrap_port and bootstrap_room go together")
    return str(host), int(port), str(room)


async def prefill(engine: Engine, rooms: Rooms, req: Completion, room_key: str) -> KvOutcome:
    room = rooms.room(room_key)
    tokens = len(req.prompt_tokens)
    blocks = await compute_prompt_kv(engine, req)
    try:
        with engine.kv_steps(f"KV push for room {room_key}") as steps:
            await asyncio.wait_for(room.registered.wait(), engine.kv_timeout_s)
            steps.done("decode registered")
            assert room.region is not None
            seconds = await off_loop(_push, engine, room, room_key, blocks, tokens, steps)
    except TimeoutError:
        room.state, room.error = "failed", "no decode registered for this room in time"
        raise TransferError(f"bootstrap room {room_key}: {room.error}") from None
    except Exception as exc:
        room.state, room.error = "failed", str(exc)
        raise
    finally:
        engine.cache.release(blocks)
    room.state = "sent"
    kv_bytes = tokens * engine.cache.bytes_per_token
    engine.metrics.kv_bytes_sent.inc(kv_bytes)
    engine.metrics.kv_transfer_seconds.observe(seconds)
    return KvOutcome(
        engine.identity, room.region.agent_name, kv_bytes, True, seconds, engine.address
    )


def _push(
    engine: Engine, room: Room, key: str, blocks: list[int], tokens: int, steps: KvSteps
) -> float:
    assert room.region is not None
    deadline = time.monotonic() + engine.kv_timeout_s
    if room.tokens != tokens:
        raise TransferError(f"room {key}: the decode expects {room.tokens} tokens, not {tokens}")
    engine.load_peer(room.region.agent_name, deadline)
    steps.done("metadata")
    return engine.cache.transfer(
        "WRITE",
        room.region,
        room.blocks,
        blocks,
        tokens,
        ROOM_TAG + f"{key}:ok".encode(),
        max(0.1, deadline - time.monotonic()),
    )


async def decode(
    engine: Engine, rooms: Rooms, req: Completion, bootstrap: tuple[str, int, str]
) -> KvOutcome:
    host, port, key = bootstrap
    tokens = len(req.prompt_tokens)
    blocks = await off_loop(engine.cache.allocate, tokens)
    arrival: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    rooms.arrivals[key] = arrival
    start = time.perf_counter()
    try:
        url = f"http://{host}:{port}{ROOMS_PATH.format(room=key)}"
        registration = {**engine.region_json(), "blocks": blocks, "tokens": tokens}
        with engine.kv_steps(f"KV wait in room {key} of {host}:{port}") as steps:
            answer = await off_loop(http_json, "PUT", url, registration, 5.0)
            steps.done("registered")
            await _await_arrival(engine, arrival, url)
            steps.done("arrived")
        seconds = time.perf_counter() - start
        problem = await off_loop(engine.cache.verify_prompt, blocks, req.digest, tokens)
    finally:
        rooms.arrivals.pop(key, None)
        engine.cache.release(blocks)
    outcome = KvOutcome(
        str(answer.get("identity", host)),
        engine.identity,
        tokens * engine.cache.bytes_per_token,
        problem is None,
        seconds,
        str(answer.get("address", host)),
        engine.address,
    )
    engine.record_received(outcome)
    if problem is not None:
        raise TransferError(f"KV from {outcome.prefill} failed verification: {problem}")
    return outcome


async def _await_arrival(engine: Engine, arrival: asyncio.Future[str], url: str) -> None:
    """Until the prefill's notification, polling the room so a failed prefill ends it early."""
    deadline = time.monotonic() + engine.kv_timeout_s
    while time.monotonic() < deadline:
        done, _ = await asyncio.wait({arrival}, timeout=0.2)
        if done:
            status = arrival.result()
            if status != "ok":
                raise TransferError(f"the prefill could not send the KV: {status}")
            return
        state = await off_loop(http_json, "GET", url, None, 2.0)
        if isinstance(state, dict) and state.get("state") == "failed":
            raise TransferError(f"the prefill could not send the KV: {state.get('error')}")
    raise TransferError(f"no KV arrived within {engine.kv_timeout_s:g}s ({url})")


def bootstrap_app(engine: Engine, rooms: Rooms) -> web.Application:
    async def register(request: web.Request) -> web.Response:
        room = rooms.room(request.match_info["room"])
        try:
            body = await request.json()
            room.region = region_of(body)
            room.blocks = tuple(int(b) for b in body["blocks"])
            room.tokens = int(body["tokens"])
        except (ValueError, KeyError, TypeError, TransferError) as exc:
            return web.json_response({"error": f"bad room registration: {exc}"}, status=400)
        room.registered.set()
        return web.json_response(
            {"identity": engine.identity, "address": engine.address, "agent": engine.engine_id}
        )

    async def state(request: web.Request) -> web.Response:
        room = rooms.rooms.get(request.match_info["room"])
        if room is None:
            return web.json_response({"state": "unknown"})
        return web.json_response({"state": room.state, "error": room.error})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_put(ROOMS_PATH, register)
    app.router.add_get(ROOMS_PATH, state)
    app.router.add_get("/health", health)
    return app
