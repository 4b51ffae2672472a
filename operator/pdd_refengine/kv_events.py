"""vLLM's KV cache events: what its prefix cache stores and evicts, published over ZMQ for a
router that routes by cache contents (vllm-router's ``kv_aware``).

The reference engine has no real prefix cache (every request computes its whole prompt), so
``PrefixStore`` keeps the bookkeeping one would: the prompt's complete blocks, chained by
parent, least recently used evicted first. Each request that computes its prompt's KV
records the prompt there; what that newly stores or evicts goes out as one batch.

The wire format is vLLM's own (``vllm/distributed/kv_events.py`` of each release; written
here from its description, not copied):

- 0.33: a batch ``[ts, events, data_parallel_rank]`` (an array); each event a map tagged by
  ``"type"`` with the fields equal to their default left out (``omit_defaults``). The replay
  answers ``[identity, b"", topic, seq, payload]`` per batch.
- 0.11: the events are arrays too (``["BlockStored", hashes, parent, ...]``), without
  ``lora_name`` and the later fields; the replay answers ``[identity, b"", seq, payload]``.

Live messages are ``[topic, seq, payload]`` in both, ``seq`` counting from 0 as an 8-byte
big-endian integer; the replay ends with ``seq`` -1 and an empty payload.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from pdd_refengine.cli import EngineConfig, KvEventsConfig
from pdd_refengine.kv_params import Generation

log = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
FULL_ATTENTION = "full_attention"  # the one kind of KV cache group the double has
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# Where the cache has no size of its own: plenty for tests, bounded for a long run.
DEFAULT_CAPACITY_BLOCKS = 4096
_POLL_MS = 50  # how long the publisher thread waits for a replay request between batches


# -- vLLM 0.33's wire format (tagged maps) -------------------------------------------------


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


# -- vLLM 0.11's (positional arrays, fewer fields) ---------------------------------------------


class BlockStored011(msgspec.Struct, tag="BlockStored", array_like=True, omit_defaults=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved011(msgspec.Struct, tag="BlockRemoved", array_like=True, omit_defaults=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared011(
    msgspec.Struct, tag="AllBlocksCleared", array_like=True, omit_defaults=True
):
    pass


class KvEventBatch011(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored011 | BlockRemoved011 | AllBlocksCleared011]
    data_parallel_rank: int | None = None


def encode_batch(events: Sequence[KvEvent], generation: Generation) -> bytes:
    """One batch as that release's publisher encodes it (rank 0: the double has no DP)."""
    if generation == "0.33":
        return msgspec.msgpack.encode(KvEventBatch(time.time(), list(events), 0))
    return msgspec.msgpack.encode(KvEventBatch011(time.time(), [_as_011(e) for e in events], 0))


def _as_011(event: KvEvent) -> BlockStored011 | BlockRemoved011 | AllBlocksCleared011:
    if isinstance(event, BlockStored):
        return BlockStored011(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
        )
    if isinstance(event, BlockRemoved):
        return BlockRemoved011(event.block_hashes, event.medium)
    return AllBlocksCleared011()


# -- the prefix cache's bookkeeping ------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """The LoRA adapter a request runs with, as vLLM's events name it."""

    name: str
    lora_id: int  # vLLM's adapter_id: 1, 2, ... in --lora-modules order


@dataclass(frozen=True)
class Recorded:
    """What recording one prompt did: its prefix hit, and the events that follow."""

    hit_tokens: int
    events: tuple[KvEvent, ...]


_BlockKey = tuple[str, int | None, tuple[int, ...]]  # (adapter, parent hash, block's tokens)


class PrefixStore:
    """Complete blocks of the prompts computed, keyed by (adapter, parent, tokens) so a block
    is the same only after the same prefix. Touching a prompt refreshes its blocks last to
    first (vLLM frees a request's blocks in reverse, so the tail is evicted first): a parent
    is then always more recent than its children, and eviction takes leaves."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self.block_size = block_size
        self.capacity = max(1, capacity_blocks)
        self._hashes: dict[_BlockKey, int] = {}
        self._lru: OrderedDict[int, _BlockKey] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._lru)

    def record(self, tokens: Sequence[int], adapter: Adapter | None = None) -> Recorded:
        blocks = self._complete_blocks(tokens)
        name = adapter.name if adapter else ""
        known = self._known_prefix(blocks, name)
        self._touch(known)
        new_blocks = blocks[len(known) : self.capacity]  # a prompt larger than the cache: its head
        removed = self._make_room(len(new_blocks))
        events: list[KvEvent] = [BlockRemoved([h], MEDIUM_GPU, 0) for h in removed]
        if new_blocks:
            parent = known[-1] if known else None
            hashes = self._store(new_blocks, name, parent)
            self._touch(known + hashes)
            events.append(self._stored_event(new_blocks, hashes, parent, adapter))
        return Recorded(self._hit_tokens(len(known), len(tokens)), tuple(events))

    def clear(self) -> Recorded:
        self._hashes.clear()
        self._lru.clear()
        return Recorded(0, (AllBlocksCleared(),))

    def _complete_blocks(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """The prompt's full blocks; the tail that does not fill one is not cached (vLLM
        hashes only full blocks)."""
        size = self.block_size
        return [tuple(tokens[i : i + size]) for i in range(0, len(tokens) // size * size, size)]

    def _known_prefix(self, blocks: list[tuple[int, ...]], adapter: str) -> list[int]:
        hashes: list[int] = []
        for block in blocks:
            found = self._hashes.get((adapter, hashes[-1] if hashes else None, block))
            if found is None:
                break
            hashes.append(found)
        return hashes

    def _hit_tokens(self, known_blocks: int, prompt_tokens: int) -> int:
        """vLLM always computes a prompt's last token, so a prompt cached whole hits one
        block less (``KVCacheManager.get_computed_blocks``: at most ``len - 1`` tokens)."""
        return min(known_blocks, (prompt_tokens - 1) // self.block_size) * self.block_size

    def _touch(self, hashes: list[int]) -> None:
        for block_hash in reversed(hashes):
            self._lru.move_to_end(block_hash)

    def _make_room(self, needed: int) -> list[int]:
        removed = []
        while self._lru and len(self._lru) + needed > self.capacity:
            block_hash, key = self._lru.popitem(last=False)
            del self._hashes[key]
            removed.append(block_hash)
        return removed

    def _store(self, blocks: list[tuple[int, ...]], adapter: str, parent: int | None) -> list[int]:
        hashes = []
        for block in blocks:
            block_hash = block_hash_of(parent, adapter, block)
            self._hashes[(adapter, parent, block)] = block_hash
            self._lru[block_hash] = (adapter, parent, block)
            hashes.append(block_hash)
            parent = block_hash
        return hashes

    def _stored_event(
        self,
        blocks: list[tuple[int, ...]],
        hashes: list[int],
        parent: int | None,
        adapter: Adapter | None,
    ) -> BlockStored:
        # vLLM publishes one extra-keys entry per block: None, or the adapter's name
        # (``to_event_extra_keys``); a consumer hashes the name into the block.
        extra: list[list[Any] | None] = [[adapter.name] if adapter else None for _ in blocks]
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=[t for block in blocks for t in block],
            block_size=self.block_size,
            lora_id=adapter.lora_id if adapter else None,
            medium=MEDIUM_GPU,
            lora_name=adapter.name if adapter else None,
            extra_keys=extra,
            group_idx=0,
            kv_cache_spec_kind=FULL_ATTENTION,
        )


def block_hash_of(parent: int | None, adapter: str, block: Sequence[int]) -> int:
    """An unsigned 64-bit block hash over the parent's hash, the adapter and the tokens (as
    vLLM's events carry the low 64 bits of its block hash: ``VLLM_KV_EVENTS_USE_INT_BLOCK_
    HASHES``). Consumers treat it as an opaque key; only the tokens are matched."""
    digest = hashlib.sha256()
    digest.update(b"root" if parent is None else parent.to_bytes(8, "big"))
    digest.update(adapter.encode() + b"\0")
    for token in block:
        digest.update(int(token).to_bytes(4, "little"))
    return int.from_bytes(digest.digest()[-8:], "big")


# -- the publisher -----------------------------------------------------------------------------


class Publisher:
    """vLLM's ZmqEventPublisher: a PUB socket for live batches and, with a replay endpoint,
    a ROUTER answering from a ring of the last ``buffer_steps`` batches. All socket work runs
    on one thread (ZMQ sockets are not thread-safe); ``publish`` only queues."""

    def __init__(self, config: KvEventsConfig, host: str, generation: Generation) -> None:
        self.config = config
        self.generation = generation
        self._topic = config.topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self.endpoint = _bind_or_connect(self._pub, config.endpoint, host)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint = config.replay_endpoint
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
            self.replay_endpoint = _bind(self._replay, config.replay_endpoint, host)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=config.max_queue_size)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="pdd-kv-events", daemon=True)
        self._thread.start()

    def source(self) -> dict[str, Any]:
        """The resolved config, as vLLM's /kv_event_sources serves it for the rank."""
        return {
            **self.config.to_json(),
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
        }

    def publish(self, events: Sequence[KvEvent]) -> None:
        try:
            self._queue.put_nowait(encode_batch(events, self.generation))
        except queue.Full:  # as vLLM's bounded queue: the events are lost, the engine serves
            log.warning("KV event queue full (%d batches): batch dropped", self._queue.maxsize)

    def close(self) -> None:
        """Send what is queued, then close the sockets (vLLM's shutdown: at most ~1 s)."""
        self._running = False
        self._thread.join(timeout=2)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        seq = 0
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while self._running or not self._queue.empty():
            if self._replay is not None and poller.poll(0):
                self._answer_replay()
            try:
                payload = self._queue.get(timeout=_POLL_MS / 1000)
            except queue.Empty:
                continue
            seq_bytes = seq.to_bytes(8, "big", signed=True)
            self._pub.send_multipart((self._topic, seq_bytes, payload))
            self._buffer.append((seq, payload))
            seq += 1

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV event replay: ignoring a request of %d frames", len(frames))
            return
        identity, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        # 0.33 names the topic in each answer; 0.11 did not.
        topic = (self._topic,) if self.generation == "0.33" else ()
        for seq, payload in list(self._buffer):
            if seq >= start:
                seq_bytes = seq.to_bytes(8, "big", signed=True)
                self._replay.send_multipart((identity, b"", *topic, seq_bytes, payload))
        end = (b"",) if self.generation == "0.33" else ()
        self._replay.send_multipart((identity, b"", *end, END_SEQ, b""))


def _bind_or_connect(socket: zmq.Socket[bytes], endpoint: str, host: str) -> str:
    """As vLLM: bind a wildcard (``*``, ``::``) or ipc/inproc endpoint, connect to any other
    (a consumer then binds)."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        return _bind(socket, endpoint, host)
    socket.connect(endpoint)
    return endpoint


def _bind(socket: zmq.Socket[bytes], endpoint: str, host: str) -> str:
    """Bind; the endpoint reported stays as given (a router puts the worker URL's host in for
    ``*``), except ``tcp://*:0``, which vLLM reports with the port it got.

    A wildcard is bound on the engine's ``--host`` instead of every address: a pod has one
    IP (``--host`` 0.0.0.0 there binds them all, as vLLM), and the router rewrites ``*`` to
    the host of the worker URL anyway, so a test engine on its own loopback address keeps
    its events there too."""
    if not endpoint.startswith("tcp://*:"):
        socket.bind(endpoint)
        return endpoint
    port = endpoint.rsplit(":", 1)[1]
    address = f"[{host}]" if ":" in host else host
    if ":" in host:
        socket.setsockopt(zmq.IPV6, 1)
    socket.bind(f"tcp://{address}:{port}")
    if port != "0":
        return endpoint
    bound = socket.getsockopt_string(zmq.LAST_ENDPOINT)
    return f"tcp://{address}:{bound.rsplit(':', 1)[1]}"


# -- the engine's side -------------------------------------------------------------------------


class KvEvents:
    """One engine's prefix store and, when ``--kv-events-config`` asks, its publisher."""

    def __init__(self, config: EngineConfig, capacity_blocks: int) -> None:
        self.config = config
        self.store = PrefixStore(config.block_tokens, capacity_blocks)
        self.publisher = (
            Publisher(config.kv_events, config.host, config.protocol)
            if config.kv_events.publishes
            else None
        )
        self._adapters = {
            name: Adapter(name, i + 1) for i, (name, _path) in enumerate(config.adapters)
        }

    def sources(self) -> dict[str, Any]:
        """vLLM's /kv_event_sources: the publisher's config per DP rank; {} without one."""
        return {"0": self.publisher.source()} if self.publisher else {}

    def record(self, tokens: Sequence[int], adapter: str = "") -> int:
        """The prompt computed (with that LoRA adapter): its prefix hit in tokens."""
        recorded = self.store.record(tokens, self._adapters.get(adapter))
        self._publish(recorded)
        return recorded.hit_tokens

    def reset(self) -> None:
        """vLLM's prefix cache reset (dev mode's /reset_prefix_cache)."""
        self._publish(self.store.clear())

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def _publish(self, recorded: Recorded) -> None:
        if self.publisher is not None and recorded.events:
            self.publisher.publish(recorded.events)
