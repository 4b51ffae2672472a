"""SGLang's disaggregation protocol with NIXL, prefill pushes (WRITE), in the bootstrap
exchange of the SGLang release the image plays (0.5.4 or 0.5.23, from its tag).

smg sends one request to a prefill and the same to a decode, both with ``bootstrap_host``,
``bootstrap_port`` (the prefill's ``--disaggregation-bootstrap-port``) and ``bootstrap_room``.
As SGLang does:

- At start, each role binds its rank's ZMQ PULL socket (``sglang_ranks``); the prefill
  serves the bootstrap server and registers its rank there (``PUT /route``,
  ``sglang_bootstrap``).
- The decode asks the bootstrap server for the prefill's layout and rank (``GET /route``,
  ``sglang_exchange``), registers its KV with that rank once (ZMQ, room ``None``: its socket,
  its NIXL agent's name and metadata, where its pages are), then sends the room's pages
  (``sglang_frames``).
- The prefill loads the decode's agent from that registration's metadata, WRITEs the room's
  KV into those pages, and says it is done: 0.5.4 with NIXL notifications ``ROOM_kv_0_1`` and
  ``ROOM_aux``, 0.5.23 with a ``KV_STATUS`` message to the decode's socket.
- The decode checks every byte before it generates.

A prefill's failure reaches the decode at once: as a ``KV_STATUS`` failure with its reason
(0.5.23's message, sent in 0.5.4 mode too: the one thing added to 0.5.4's exchange), and a
prefill that is gone through the heartbeat SGLang's decode keeps on the bootstrap server's
``/health`` (polled more often here, so tests need not wait).

The NIXL agent metadata travels in SGLang's own exchange, as above, not through the pdd
sidecar (to which the engine still publishes its agent, as every engine pod does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from pdd_refengine.engine import (
    Engine,
    KvOutcome,
    KvSteps,
    compute_prompt_kv,
    off_loop,
)
from pdd_refengine.kvcache import RegionInfo, TransferError
from pdd_refengine.openai_api import BadRequest, Completion
from pdd_refengine.sglang_bootstrap import PrefillPeer, alive, find_rank, register_rank
from pdd_refengine.sglang_exchange import Endpoint, ExchangeError, PrefillRank
from pdd_refengine.sglang_frames import (
    DecodeKvArgs,
    RoomPages,
    completion_notifs,
    is_kv_args,
    kv_args_frames,
    parse_kv_args,
    parse_notif,
    parse_room,
    parse_status,
    room_frames,
    status_frames,
)
from pdd_refengine.sglang_ranks import RankSockets

log = logging.getLogger(__name__)

# SGLang's decode checks every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (at least 2 s) and
# gives a prefill up after SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE misses (default 2;
# nixl/conn.py of 0.5.4 L150-158): the same rule, checked more often so that tests need not wait.
HEARTBEAT_S = 0.5
HEARTBEAT_MISSES = 2
Bootstrap = tuple[str, int, int]  # bootstrap_host, bootstrap_port, bootstrap_room


@dataclass
class Room:
    """A prefill's room: the decode's pages, once its message came."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    pages: RoomPages | None = None
    created: float = field(default_factory=time.monotonic)


@dataclass
class Arrival:
    """A decode's wait for a room: ``None`` once the KV is all there, or why it failed."""

    outcome: asyncio.Future[str | None]
    notified: set[str] = field(default_factory=set)  # 0.5.4: the NIXL notifications seen


class Rooms:
    """SGLang mode's state: the rank's sockets; a prefill's rooms and the decodes registered
    with it; a decode's waits and the prefill ranks it registered with."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._loop = loop
        self.generation = engine.config.bootstrap_protocol
        self.sockets = RankSockets(rank_ip(engine), self._on_message)
        self.rooms: dict[int, Room] = {}
        self.decodes: dict[str, DecodeKvArgs] = {}  # by NIXL agent name
        self.arrivals: dict[int, Arrival] = {}
        self.registered_with: set[Endpoint] = set()

    # -- prefill

    def room(self, key: int) -> Room:
        self._expire_old()
        return self.rooms.setdefault(key, Room())

    def _expire_old(self) -> None:
        horizon = time.monotonic() - 4 * self._engine.kv_timeout_s
        for key in [k for k, r in self.rooms.items() if r.created < horizon]:
            del self.rooms[key]

    def target(self, room: Room) -> tuple[DecodeKvArgs, RoomPages]:
        assert room.pages is not None
        decode = self.decodes.get(room.pages.agent_name)
        if decode is None:  # SGLang's prefill asserts the same
            raise TransferError(f"decode agent {room.pages.agent_name} never registered its KV")
        return decode, room.pages

    async def report(self, key: int, failure: str | None) -> None:
        """Tell the room's decode how it ended, where its message said where it is."""
        room = self.rooms.get(key)
        if room is None or room.pages is None:
            return
        try:
            await self.sockets.send(room.pages.endpoint, status_frames(key, failure))
        except (TimeoutError, OSError) as exc:
            log.warning("room %d: the decode's socket took no status: %s", key, exc)

    # -- decode

    def awaits_peers(self) -> bool:
        """A decode's room awaits the prefill's KV and notifications."""
        return bool(self.arrivals)

    def expect(self, key: int) -> Arrival:
        arrival = Arrival(self._loop.create_future())
        self.arrivals[key] = arrival
        return arrival

    async def register_with(self, peer: PrefillPeer) -> None:
        """The decode's KV registration, once per prefill rank (as SGLang's, whose
        connection pool keeps it): its socket, agent, metadata and pages."""
        if peer.endpoint in self.registered_with:
            return
        info = self._engine.cache.info
        args = DecodeKvArgs(
            self.sockets.endpoint,
            info.agent_name,
            await off_loop(self._engine.cache.metadata),
            info.base_addr,
            info.block_bytes,
            info.device,
            info.num_blocks,
            info.mem,
        )
        await self.sockets.send(peer.endpoint, kv_args_frames(self.generation, args))
        self.registered_with.add(peer.endpoint)

    def forget(self, peer: Endpoint) -> None:
        """After a failure with a rank: register afresh next time (it may be a new process)."""
        self.registered_with.discard(peer)
        self.sockets.forget(peer)

    # -- what arrives

    def _on_message(self, frames: list[bytes]) -> None:
        """From the rank's socket, on the event loop."""
        status = parse_status(frames)
        if status is not None:
            self._settle(*status)
        elif is_kv_args(frames):
            args = parse_kv_args(self.generation, frames)
            self.decodes[args.agent_name] = args
        else:
            pages = parse_room(self.generation, frames)
            room = self.room(pages.room)
            room.pages = pages
            room.arrived.set()

    def on_notif(self, _agent: str, message: bytes) -> None:
        """From the notification thread: 0.5.4's ``ROOM_kv_CHUNK_LAST`` and ``ROOM_aux``."""
        notif = parse_notif(message)
        if notif is not None:
            self._loop.call_soon_threadsafe(self._notified, *notif)

    def _notified(self, key: int, kind: str) -> None:
        arrival = self.arrivals.get(key)
        if arrival is not None:
            arrival.notified.add(kind)
            if {"kv_last", "aux"} <= arrival.notified:
                self._settle(key, None)

    def _settle(self, key: int, failure: str | None) -> None:
        arrival = self.arrivals.get(key)
        if arrival is not None and not arrival.outcome.done():
            arrival.outcome.set_result(failure)


def rank_ip(engine: Engine) -> str:
    """Where the rank's socket listens, as peers reach it: the pod's IP (a wildcard means
    this host, which peers on it reach as loopback)."""
    return connectable(engine.address)


async def start_rank(engine: Engine, rooms: Rooms) -> None:
    """Bind the rank's socket; a prefill then registers it at its bootstrap server (which
    must be serving)."""
    endpoint = rooms.sockets.start()
    config = engine.config
    if config.role != "prefill":
        return
    rank = PrefillRank(endpoint, config.block_tokens, config.kv_cache_dtype, config.port)
    server = f"{connectable(config.host)}:{config.bootstrap_port}"
    await off_loop(register_rank, rooms.generation, server, rank)


def connectable(host: str) -> str:
    """A bind address as a client reaches it (0.5.23's prefill does the same)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


def bootstrap_of(req: Completion) -> Bootstrap | None:
    host, port, room = (
        req.body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    )
    if host is None and room is None:
        return None
    if host is None or port is None or room is None:
        raise BadRequest("bootstrap_host, bootstrap_port and bootstrap_room go together")
    try:
        return str(host), int(port), int(room)
    except (TypeError, ValueError):
        raise BadRequest("bootstrap_port and bootstrap_room are integers") from None


# -- the prefill's side of a request


async def prefill(engine: Engine, rooms: Rooms, req: Completion, key: int) -> KvOutcome:
    room = rooms.room(key)
    tokens = len(req.prompt_tokens)
    blocks = await compute_prompt_kv(engine, req)
    try:
        with engine.kv_steps(f"KV push for room {key}") as steps:
            await asyncio.wait_for(room.arrived.wait(), engine.kv_timeout_s)
            steps.done("decode registered")
            decode, pages = rooms.target(room)
            seconds = await off_loop(_push, engine, rooms, decode, pages, blocks, tokens, steps)
    except TimeoutError:
        raise TransferError(f"bootstrap room {key}: no decode registered in time") from None
    except Exception as exc:
        await rooms.report(key, str(exc))
        raise
    finally:
        engine.cache.release(blocks)
    if rooms.generation == "0.5.23":
        await rooms.report(key, None)
    kv_bytes = tokens * engine.cache.bytes_per_token
    engine.metrics.kv_bytes_sent.inc(kv_bytes)
    engine.metrics.kv_transfer_seconds.observe(seconds)
    return KvOutcome(engine.identity, decode.agent_name, kv_bytes, True, seconds, engine.address)


def _push(
    engine: Engine,
    rooms: Rooms,
    decode: DecodeKvArgs,
    pages: RoomPages,
    blocks: list[int],
    tokens: int,
    steps: KvSteps,
) -> float:
    deadline = time.monotonic() + engine.kv_timeout_s
    engine.cache.load_remote(decode.agent_name, decode.agent_metadata)
    steps.done("metadata")
    notifs = completion_notifs(rooms.generation, pages.room)
    seconds = engine.cache.transfer(
        "WRITE",
        decode_region(engine, decode),
        pages.pages,
        blocks,
        tokens,
        notifs[0] if notifs else None,
        max(0.1, deadline - time.monotonic()),
    )
    for notif in notifs[1:]:  # 0.5.4's aux: no aux buffer here, its notification alone
        engine.cache.send_notif(decode.agent_name, notif)
    return seconds


def decode_region(engine: Engine, decode: DecodeKvArgs) -> RegionInfo:
    """The decode's KV region, from its registration. 0.5.4's carries neither the page count
    nor the memory kind (its prefill assumes GPU memory on both sides and never checks a
    bound); the reference prefill, which prepares the peer's whole region once, takes them
    from its own region: both roles are rendered with the same model, page size and memory."""
    own = engine.cache.info
    if decode.page_bytes % own.block_tokens:
        raise TransferError(
            f"the decode's pages of {decode.page_bytes} B do not hold {own.block_tokens} tokens"
        )
    return RegionInfo(
        decode.agent_name,
        decode.base_addr,
        decode.page_bytes,
        decode.num_pages if decode.num_pages is not None else own.num_blocks,
        decode.page_bytes // own.block_tokens,
        own.block_tokens,
        decode.mem or own.mem,
        decode.device,
    )


# -- the decode's side of a request


async def decode(engine: Engine, rooms: Rooms, req: Completion, bootstrap: Bootstrap) -> KvOutcome:
    host, port, key = bootstrap
    server = f"{host}:{port}"
    tokens = len(req.prompt_tokens)
    blocks = await off_loop(engine.cache.allocate, tokens)
    arrival = rooms.expect(key)
    try:
        with engine.kv_steps(f"KV wait in room {key} of {server}") as steps:
            deadline = time.monotonic() + engine.kv_timeout_s
            peer = await off_loop(find_rank, rooms.generation, server, key, deadline)
            _check_layout(engine, peer, server)
            steps.done("bootstrap")
            start = time.perf_counter()
            await _send_room(engine, rooms, peer, key, blocks)
            steps.done("registered")
            await _await_arrival(engine, rooms, arrival, peer, server)
            steps.done("arrived")
        seconds = time.perf_counter() - start
        problem = await off_loop(engine.cache.verify_prompt, blocks, req.digest, tokens)
    finally:
        rooms.arrivals.pop(key, None)
        engine.cache.release(blocks)
    outcome = KvOutcome(
        peer.identity or host,
        engine.identity,
        tokens * engine.cache.bytes_per_token,
        problem is None,
        seconds,
        peer.endpoint.ip,
        engine.address,
    )
    engine.record_received(outcome)
    if problem is not None:
        raise TransferError(f"KV from {outcome.prefill} failed verification: {problem}")
    return outcome


def _check_layout(engine: Engine, peer: PrefillPeer, server: str) -> None:
    """0.5.23's decode refuses a prefill of another page size or KV cache dtype."""
    config, layout = engine.config, peer.layout
    if layout.page_size is not None and layout.page_size != config.block_tokens:
        raise TransferError(
            f"page size mismatch: the prefill at {server} has page_size={layout.page_size}, "
            f"this decode {config.block_tokens} (--page-size must match)"
        )
    if layout.kv_cache_dtype is not None and layout.kv_cache_dtype != config.kv_cache_dtype:
        raise TransferError(
            f"KV cache dtype mismatch: the prefill at {server} has {layout.kv_cache_dtype}, "
            f"this decode {config.kv_cache_dtype} (--kv-cache-dtype must match)"
        )


async def _send_room(
    engine: Engine, rooms: Rooms, peer: PrefillPeer, key: int, blocks: list[int]
) -> None:
    pages = RoomPages(key, rooms.sockets.endpoint, engine.engine_id, tuple(blocks))
    try:
        await rooms.register_with(peer)
        await rooms.sockets.send(peer.endpoint, room_frames(rooms.generation, pages))
    except (TimeoutError, OSError, ExchangeError) as exc:
        rooms.forget(peer.endpoint)
        raise TransferError(f"cannot send room {key} to {peer.endpoint}: {exc}") from None


async def _await_arrival(
    engine: Engine, rooms: Rooms, arrival: Arrival, peer: PrefillPeer, server: str
) -> None:
    """Until the prefill says the room is done, keeping SGLang's heartbeat on its bootstrap
    server so that a prefill that is gone ends the wait too."""
    deadline = time.monotonic() + engine.kv_timeout_s
    misses = 0
    while time.monotonic() < deadline and misses < HEARTBEAT_MISSES:
        done, _ = await asyncio.wait({arrival.outcome}, timeout=HEARTBEAT_S)
        if done:
            failure = arrival.outcome.result()
            if failure is not None:
                rooms.forget(peer.endpoint)
                raise TransferError(f"the prefill could not send the KV: {failure}")
            return
        misses = 0 if await off_loop(alive, server) else misses + 1
    rooms.forget(peer.endpoint)
    if misses:
        raise TransferError(f"the prefill's bootstrap server {server} stopped answering")
    raise TransferError(f"no KV arrived within {engine.kv_timeout_s:g}s (room of {server})")
