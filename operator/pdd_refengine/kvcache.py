"""The engine's KV cache: one region of fixed-size blocks, registered with a NIXL agent.

A block holds ``block_tokens`` tokens' KV (``layout.bytes_per_token`` each), as a vLLM block or
an SGLang page does; a request takes whole blocks, and only the bytes of its tokens move (the
last block is cut short). The region is host memory, or GPU memory with
``PDD_REFENGINE_KV_MEMORY=vram`` (CUDA device 0 of CUDA_VISIBLE_DEVICES; then a host mirror
holds what is written or read, since the pattern is computed on the CPU).

Every call into the agent holds one lock: the NIXL Python API makes no promise about several
threads using one agent, and the calls are short except transfers, which the reference engine
may run one at a time.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdd_probe.probe import LINK_CONCURRENCY
from pdd_probe.worker import (
    Buffer,
    allocate,
    make_agent,
    post_and_wait,
    prepare_on_own_workers,
    register,
)
from pdd_refengine import pattern
from pdd_refengine.layout import KvLayout, blocks_for

log = logging.getLogger(__name__)

NotifHandler = Callable[[str, bytes], None]  # (sending agent, message)


class CacheFull(RuntimeError):
    """Not enough free blocks for the request (answered as HTTP 503)."""


class TransferError(RuntimeError):
    """NIXL could not move the KV (answered as HTTP 502)."""


@dataclass(frozen=True)
class RegionInfo:
    """What a peer needs to address this engine's blocks (the side-channel handshake)."""

    agent_name: str
    base_addr: int
    block_bytes: int
    num_blocks: int
    bytes_per_token: int
    block_tokens: int
    mem: str
    device: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RegionInfo:
        return cls(
            agent_name=str(data["agent_name"]),
            base_addr=int(data["base_addr"]),
            block_bytes=int(data["block_bytes"]),
            num_blocks=int(data["num_blocks"]),
            bytes_per_token=int(data["bytes_per_token"]),
            block_tokens=int(data["block_tokens"]),
            mem=str(data["mem"]),
            device=int(data["device"]),
        )


def block_descriptors(info: RegionInfo) -> np.ndarray:
    """(addr, length, device) of every block of the region: prepared once per agent, as vLLM
    prepares its block descriptors, so a request only names block indices."""
    return np.array(
        [(info.base_addr + b * info.block_bytes, info.block_bytes, info.device)
         for b in range(info.num_blocks)],
        dtype=np.uint64,
    )  # fmt: skip


def block_indices(info: RegionInfo, block_ids: Sequence[int], tokens: int) -> np.ndarray:
    """The request's blocks as indices into ``block_descriptors(info)``, checked: as many as
    ``tokens`` need, all inside the region. Whole blocks move (as in vLLM); the last one's
    bytes past the prompt are never compared."""
    if len(block_ids) != blocks_for(tokens, info.block_tokens):
        raise TransferError(
            f"{tokens} tokens need {blocks_for(tokens, info.block_tokens)} "
            f"blocks of {info.block_tokens}, got {len(block_ids)}"
        )
    for block in block_ids:
        if not 0 <= block < info.num_blocks:
            raise TransferError(f"block {block} is outside the region ({info.num_blocks} blocks)")
    return np.array(block_ids, dtype=np.int32)


class KvCache:
    def __init__(
        self, agent_name: str, layout: KvLayout, block_tokens: int, region_bytes: int, mem: str
    ) -> None:
        self.bytes_per_token = layout.bytes_per_token
        self.block_tokens = block_tokens
        self.block_bytes = layout.bytes_per_token * block_tokens
        num_blocks = region_bytes // self.block_bytes
        if num_blocks < 1:
            raise ValueError(
                f"a KV region of {region_bytes} B holds no block of {self.block_bytes} B: raise "
                "PDD_REFENGINE_KV_REGION_BYTES"
            )
        # Memory first: GPU memory needs a CUDA context before UCX looks for cuda transports.
        self._buffer: Buffer = allocate(mem, num_blocks * self.block_bytes, 0)
        self._host = (
            self._buffer.host_copy()
            if self._buffer.mem == "DRAM"
            else np.zeros(self._buffer.nbytes, dtype=np.uint8)
        )
        self._lock = threading.RLock()
        # GPU memory: several requests in flight, each on a UCX worker of its own (one request
        # leaves an NVLink far from full); host memory over TCP gains nothing from it.
        self.streams = LINK_CONCURRENCY if self._buffer.mem == "VRAM" else 1
        # Host memory is the CPU tests' lane (TCP on loopback): there the engine's own polling
        # progresses NIXL (every transfer's wait, the notification loop: NotifLoop) instead
        # of NIXL's progress thread, which spins half a core per idle engine (make_agent).
        # GPU memory runs as the engines do, with the thread (bench/request_kv_two_gpu.py).
        self._agent = make_agent(
            agent_name, workers=self.streams, progress_thread=self._buffer.mem == "VRAM"
        )
        register(self._agent, self._buffer)
        self.info = RegionInfo(
            agent_name,
            self._buffer.addr,
            self.block_bytes,
            num_blocks,
            self.bytes_per_token,
            block_tokens,
            self._buffer.mem,
            self._buffer.device,
        )
        self._free = list(range(num_blocks))
        self._blocks_lock = threading.Lock()
        self._remote_sha: dict[str, str] = {}
        self._local_side = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", block_descriptors(self.info), self.info.mem
        )
        self._remote_sides: dict[str, Any] = {}  # peer agent -> its prepared blocks

    # -- blocks

    def metadata(self) -> bytes:
        with self._lock:
            return bytes(self._agent.get_agent_metadata())

    def usage(self) -> float:
        with self._blocks_lock:
            return 1.0 - len(self._free) / self.info.num_blocks

    def allocate(self, tokens: int) -> list[int]:
        count = blocks_for(tokens, self.block_tokens)
        with self._blocks_lock:
            if count > len(self._free):
                raise CacheFull(
                    f"{tokens} tokens need {count} KV blocks, {len(self._free)} of "
                    f"{self.info.num_blocks} are free"
                )
            taken, self._free = self._free[:count], self._free[count:]
        return taken

    def release(self, block_ids: Sequence[int]) -> None:
        with self._blocks_lock:
            held = set(self._free)
            self._free.extend(b for b in block_ids if b not in held)

    # -- contents

    def write_prompt(self, block_ids: Sequence[int], digest: bytes, tokens: int) -> None:
        """The 'prefill': every token's KV pattern into its block."""
        for k, block in enumerate(block_ids):
            first = k * self.block_tokens
            held = min(self.block_tokens, tokens - first)
            start = block * self.block_bytes
            pattern.fill(
                self._host[start : start + held * self.bytes_per_token],
                digest,
                first,
                self.bytes_per_token,
            )
        if self._buffer.mem != "DRAM":
            self._buffer.write(self._host)

    def corrupt_one_byte(self, block: int) -> None:
        """Fault injection for tests of the receiver's check: flip the block's first byte."""
        start = block * self.block_bytes
        self._host[start] ^= 0xFF
        if self._buffer.mem != "DRAM":
            self._buffer.write(self._host)

    def verify_prompt(self, block_ids: Sequence[int], digest: bytes, tokens: int) -> str | None:
        """None when every byte of every token is the pattern, else what differs."""
        region = self._host if self._buffer.mem == "DRAM" else self._buffer.host_copy()
        for k, block in enumerate(block_ids):
            first = k * self.block_tokens
            held = min(self.block_tokens, tokens - first)
            start = block * self.block_bytes
            bad = pattern.first_mismatch(
                region[start : start + held * self.bytes_per_token],
                digest,
                first,
                self.bytes_per_token,
            )
            if bad is not None:
                return f"KV byte {bad} of block {block} (tokens from {first}) differs"
        return None

    # -- NIXL

    def load_remote(self, name: str, metadata: bytes) -> None:
        """Load peer agent ``name``'s metadata, again only when it changed (a peer that
        re-published: its old memory keys are dropped first)."""
        sha = hashlib.sha256(metadata).hexdigest()
        with self._lock:
            if self._remote_sha.get(name) == sha:
                return
            if name in self._remote_sha:
                self.forget_remote(name)
            try:
                loaded = _text(self._agent.add_remote_agent(metadata))
            except Exception as exc:  # NIXL's own exception types: the peer is unreachable
                raise TransferError(f"NIXL could not load peer agent {name}: {exc}") from exc
            if loaded != name:
                self._agent.remove_remote_agent(loaded)
                raise TransferError(f"the metadata published as {name} is agent {loaded}'s")
            self._remote_sha[name] = sha

    def forget_remote(self, name: str) -> None:
        with self._lock:
            side = self._remote_sides.pop(name, None)
            if side is not None:
                self._agent.release_dlist_handle(side)
            if self._remote_sha.pop(name, None) is not None:
                self._agent.remove_remote_agent(name)

    def _remote_side(self, remote: RegionInfo) -> Any:
        side = self._remote_sides.get(remote.agent_name)
        if side is None:
            descs = block_descriptors(remote)
            side = self._agent.prep_xfer_dlist(remote.agent_name, descs, remote.mem)
            self._remote_sides[remote.agent_name] = side
        return side

    def transfer(
        self,
        operation: str,
        remote: RegionInfo,
        remote_blocks: Sequence[int],
        local_blocks: Sequence[int],
        tokens: int,
        notif: bytes | None,
        timeout_s: float,
    ) -> float:
        """READ the remote blocks into local ones, or WRITE local ones into the remote; NIXL
        delivers ``notif`` to the peer once done (None: the protocol tells the peer its own
        way). Returns the seconds the transfer took."""
        if remote.bytes_per_token != self.bytes_per_token:
            raise TransferError(
                f"KV layouts differ: the peer has {remote.bytes_per_token} B/token, this engine "
                f"{self.bytes_per_token} (same model and PDD_REFENGINE_KV_LAYOUT on both roles?)"
            )
        local = block_indices(self.info, local_blocks, tokens)
        remote_ids = block_indices(remote, remote_blocks, tokens)
        with self._lock:
            start = time.perf_counter()
            try:
                self._move(operation, local, remote, remote_ids, timeout_s)
                # After every part landed: the peer may reuse the blocks once it reads this.
                if notif is not None:
                    self._agent.send_notif(remote.agent_name, notif)
            except (RuntimeError, TimeoutError) as exc:
                raise TransferError(f"NIXL {operation} from {remote.agent_name}: {exc}") from exc
            except Exception as exc:  # NIXL raises its own exception types
                raise TransferError(f"NIXL {operation} with {remote.agent_name}: {exc}") from exc
            return time.perf_counter() - start

    def _move(
        self,
        operation: str,
        local: np.ndarray,
        remote: RegionInfo,
        remote_ids: np.ndarray,
        timeout_s: float,
    ) -> None:
        """The blocks split into up to ``self.streams`` requests in flight at once."""
        remote_side = self._remote_side(remote)
        parts = np.array_split(np.arange(len(local)), min(self.streams, len(local)))

        def prepare(k: int) -> Any:
            return self._agent.make_prepped_xfer(
                operation, self._local_side, local[parts[k]], remote_side, remote_ids[parts[k]]
            )

        handles = prepare_on_own_workers(self._agent, prepare, len(parts))
        try:
            post_and_wait(self._agent, handles, time.perf_counter() + timeout_s)
        finally:
            for handle in handles:
                self._agent.release_xfer_handle(handle)

    def send_notif(self, remote_name: str, message: bytes) -> None:
        with self._lock:
            self._agent.send_notif(remote_name, message)

    def poll_notifs(self) -> list[tuple[str, bytes]]:
        with self._lock:
            notifs = self._agent.get_new_notifs()
        return [(_text(agent), bytes(m)) for agent, messages in notifs.items() for m in messages]


def _text(name: str | bytes) -> str:
    """NIXL returns agent names as bytes or str depending on its version."""
    return name.decode() if isinstance(name, bytes) else str(name)


# Without NIXL's progress thread (host memory), this loop's polls also progress the agent, and
# the passive side of a transfer needs that to move its bytes: it polls every 5 ms while the
# engine serves a request or holds KV a peer has yet to take, and for a second after. Idle, a
# 5 ms poll cost about 4 % of a core per engine (the CPU tests run a dozen at once), so it
# polls every 100 ms then, still delivering whatever arrives.
BUSY_POLL_S = 0.005
IDLE_POLL_S = 0.1
STAY_BUSY_S = 1.0


class NotifLoop:
    """Delivers the peers' notifications to ``handle`` until ``stop`` (a daemon thread),
    polling fast while ``busy()`` says the engine awaits a peer, and after ``wake()``."""

    def __init__(
        self,
        cache: KvCache,
        handle: NotifHandler,
        stop: threading.Event,
        busy: Callable[[], bool],
    ) -> None:
        self._cache, self._handle, self._stop, self._busy = cache, handle, stop, busy
        self._woken = threading.Event()
        self._busy_until = 0.0

    def start(self) -> NotifLoop:
        threading.Thread(target=self._run, name="pdd-refengine-notifs", daemon=True).start()
        return self

    def wake(self) -> None:
        """Poll fast from now: a request arrived (its peers' notifications and reads follow)."""
        self._busy_until = time.monotonic() + STAY_BUSY_S
        self._woken.set()

    def _interval(self) -> float:
        now = time.monotonic()
        if self._busy():
            self._busy_until = now + STAY_BUSY_S
        return BUSY_POLL_S if now < self._busy_until else IDLE_POLL_S

    def _run(self) -> None:
        while not self._stop.is_set():
            self._woken.wait(self._interval())
            self._woken.clear()
            try:
                for agent, message in self._cache.poll_notifs():
                    self._handle(agent, message)
            except Exception:  # keep delivering: one bad notification must not stop the rest
                log.exception("handling a NIXL notification failed")
