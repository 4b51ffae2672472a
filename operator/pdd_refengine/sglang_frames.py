"""SGLang's ZMQ messages between a decode and a prefill rank with NIXL, frame for frame, and
how the prefill says a room is done, for the release the engine plays.

The decode learns the rank's ZMQ PULL socket from the bootstrap server (``sglang_exchange``)
and PUSHes two kinds of message to it, each led by the guard frame ``NixlMsgGuard``: once per
prefill rank its KV registration (room ``None``: its own socket, its NIXL agent's name and
metadata, where its KV pages are), then per request the room's pages. The frame layouts are
pinned to the fixture dumped from each release's source (``bootstrap_exchange.zmq`` in
tests/fixtures/engines/sglang-*.json).

- ``0.5.4`` (``sglang/srt/disaggregation/nixl/conn.py`` of 0.5.4): guard L31, checked L659-662;
  registration sent L817-843, read as ``KVArgsRegisterInfo`` L78-92 (room ``None`` L665); a
  room's pages sent L782-793, read as ``TransferInfo`` L49-59. The prefill WRITEs each chunk
  with the NIXL notification ``ROOM_kv_CHUNK_LAST`` and the aux data with ``ROOM_aux``
  (L579, L618); the decode is done once the last chunk and the aux have come (L625-642). No
  failure reaches the decode: its heartbeat sees only a prefill that is gone.
- ``0.5.23`` (the same file of 0.5.23): guard L78; the registration's 24 frames add state
  buffers, the page count, each KV buffer's memory kind and page size, layer ids, DCP size
  and rank, staging (sent L3428-3493, read L375-456); a room adds state indices,
  ``decode_prefix_len`` and ``is_dummy`` (L3495-3526, read L302-338). No NIXL notification:
  the prefill sends the decode's socket ``KV_STATUS ROOM STATUS PREFILL_RANK REASON``
  (common/conn.py L739-782, tag nixl/conn.py L515-516) with a ``KVPoll`` status (base/conn.py
  L123-128: Failed 0, Success 4) when the transfer ends (L1901-1902) or fails (L1949).

The reference engine has one KV buffer (its region: one pointer, a page is one block) and no
aux or state buffers (empty frames, aux index 0). Its 0.5.4 prefill reports a failure with
0.5.23's status message too, so that the decode need not wait out its timeout: the one thing
it adds to 0.5.4's exchange (a real 0.5.4 decode would not be listening).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pdd_refengine.sglang_exchange import Endpoint, ExchangeError, Generation

GUARD = b"NixlMsgGuard"
KV_ARGS_ROOM = b"None"
STATUS_TAG = b"KV_STATUS"
FAILED, SUCCESS = 0, 4  # KVPoll
PREFILL_RANK = 0  # the one rank's id, as _prefill_unique_rank computes it for rank 0

_V054_KV_ARGS = (
    "room",
    "endpoint",
    "dst_port",
    "agent_name",
    "agent_metadata",
    "dst_kv_ptrs",
    "dst_aux_ptrs",
    "gpu_id",
    "decode_tp_size",
    "decode_tp_rank",
    "dst_kv_item_len",
)
KV_ARGS_FRAMES: dict[Generation, tuple[str, ...]] = {
    "0.5.4": _V054_KV_ARGS,
    "0.5.23": (
        *_V054_KV_ARGS[:7],
        "dst_state_data_ptrs",
        *_V054_KV_ARGS[7:],
        "dst_state_item_lens",
        "dst_state_dim_per_tensor",
        "staging_base_ptr",
        "staging_total_size",
        "dst_num_slots",
        "dst_kv_mem_kinds",
        "dst_kv_item_lens",
        "dst_state_layer_ids",
        "dst_kv_layer_ids",
        "dst_dcp_size",
        "dst_dcp_rank",
        "dst_state_data_lens",
    ),
}
_V054_ROOM = (
    "room",
    "endpoint",
    "dst_port",
    "agent_name",
    "dst_kv_indices",
    "dst_aux_index",
    "required_dst_info_num",
)
ROOM_FRAMES: dict[Generation, tuple[str, ...]] = {
    "0.5.4": _V054_ROOM,
    "0.5.23": (*_V054_ROOM, "dst_state_indices", "decode_prefix_len", "is_dummy"),
}
STATUS_FRAMES = ("bootstrap_room", "status", "prefill_rank", "failure_reason")


@dataclass(frozen=True)
class DecodeKvArgs:
    """A decode's one-off registration with a prefill rank."""

    endpoint: Endpoint
    agent_name: str
    agent_metadata: bytes
    base_addr: int
    page_bytes: int
    device: int
    num_pages: int | None = None  # sent from 0.5.23 on
    mem: str | None = None  # sent from 0.5.23 on ("DRAM" / "VRAM")


@dataclass(frozen=True)
class RoomPages:
    """Where one room's KV is to land in a decode."""

    room: int
    endpoint: Endpoint
    agent_name: str
    pages: tuple[int, ...]


def kv_args_frames(generation: Generation, args: DecodeKvArgs) -> list[bytes]:
    values = {
        "room": KV_ARGS_ROOM,
        "endpoint": _text(args.endpoint.ip),
        "dst_port": _text(args.endpoint.port),
        "agent_name": _text(args.agent_name),
        "agent_metadata": args.agent_metadata,
        "dst_kv_ptrs": _u64s([args.base_addr]),
        "dst_aux_ptrs": b"",
        "dst_state_data_ptrs": b"",
        "gpu_id": _text(args.device),
        "decode_tp_size": b"1",
        "decode_tp_rank": b"0",
        "dst_kv_item_len": _text(args.page_bytes),
        "dst_state_item_lens": b"",
        "dst_state_dim_per_tensor": b"",
        "staging_base_ptr": b"",
        "staging_total_size": b"",
        "dst_num_slots": _text(args.num_pages),
        "dst_kv_mem_kinds": _text(args.mem),
        "dst_kv_item_lens": _u64s([args.page_bytes]),
        "dst_state_layer_ids": b"",
        "dst_kv_layer_ids": b"",
        "dst_dcp_size": b"1",
        "dst_dcp_rank": b"0",
        "dst_state_data_lens": b"",
    }
    return [GUARD, *(values[name] for name in KV_ARGS_FRAMES[generation])]


def is_kv_args(frames: list[bytes]) -> bool:
    return len(frames) > 1 and frames[1] == KV_ARGS_ROOM


def parse_kv_args(generation: Generation, frames: list[bytes]) -> DecodeKvArgs:
    fields = _fields(KV_ARGS_FRAMES[generation], frames)
    try:
        pointers = _u64s_of(fields["dst_kv_ptrs"])
        if len(pointers) != 1:
            raise ExchangeError(f"{len(pointers)} KV buffers: the reference engine has one")
        newer = generation == "0.5.23"
        return DecodeKvArgs(
            Endpoint(fields["endpoint"].decode(), int(fields["dst_port"])),
            fields["agent_name"].decode(),
            fields["agent_metadata"],
            pointers[0],
            int(fields["dst_kv_item_len"]),
            int(fields["gpu_id"]),
            int(fields["dst_num_slots"]) if newer else None,
            fields["dst_kv_mem_kinds"].decode() if newer else None,
        )
    except (UnicodeDecodeError, ValueError, struct.error) as exc:
        raise ExchangeError(f"a malformed KV registration: {exc}") from None


def room_frames(generation: Generation, room: RoomPages) -> list[bytes]:
    values = {
        "room": _text(room.room),
        "endpoint": _text(room.endpoint.ip),
        "dst_port": _text(room.endpoint.port),
        "agent_name": _text(room.agent_name),
        "dst_kv_indices": struct.pack(f"{len(room.pages)}i", *room.pages),  # int32, as numpy's
        "dst_aux_index": b"0",
        "required_dst_info_num": b"1",  # one decode rank per room
        "dst_state_indices": b"",
        "decode_prefix_len": b"0",  # nothing of the prompt already cached on the decode
        "is_dummy": b"0",
    }
    return [GUARD, *(values[name] for name in ROOM_FRAMES[generation])]


def parse_room(generation: Generation, frames: list[bytes]) -> RoomPages:
    fields = _fields(ROOM_FRAMES[generation], frames)
    try:
        indices = fields["dst_kv_indices"]
        return RoomPages(
            int(fields["room"]),
            Endpoint(fields["endpoint"].decode(), int(fields["dst_port"])),
            fields["agent_name"].decode(),
            struct.unpack(f"{len(indices) // 4}i", indices),
        )
    except (UnicodeDecodeError, ValueError, struct.error) as exc:
        raise ExchangeError(f"a malformed room message: {exc}") from None


def status_frames(room: int, failure: str | None) -> list[bytes]:
    """The prefill's word on a room: done (``failure`` None) or failed, with why."""
    status = SUCCESS if failure is None else FAILED
    values = {
        "bootstrap_room": _text(room),
        "status": _text(status),
        "prefill_rank": _text(PREFILL_RANK),
        "failure_reason": (failure or "").encode(),
    }
    return [STATUS_TAG, *(values[name] for name in STATUS_FRAMES)]


def parse_status(frames: list[bytes]) -> tuple[int, str | None] | None:
    """(room, None when done or the failure's reason); None for another message."""
    if not frames or frames[0] != STATUS_TAG or len(frames) < 4:
        return None
    fields = dict(zip(STATUS_FRAMES, frames[1:], strict=False))
    try:
        room, status = int(fields["bootstrap_room"]), int(fields["status"])
    except ValueError:
        raise ExchangeError(f"a malformed status message: {frames[1:3]!r}") from None
    if status == SUCCESS:
        return room, None
    reason = fields.get("failure_reason", b"").decode(errors="replace")
    return room, reason or f"KV status {status}"


def completion_notifs(generation: Generation, room: int) -> tuple[bytes, ...]:
    """The NIXL notifications that end a room: 0.5.4's for its one (last) KV chunk, then its
    aux data; none from 0.5.23 on (its status message does)."""
    if generation == "0.5.4":
        return f"{room}_kv_0_1".encode(), f"{room}_aux".encode()
    return ()


def parse_notif(message: bytes) -> tuple[int, str] | None:
    """0.5.4: (room, ``kv_last`` / ``kv`` / ``aux``); None for another notification."""
    parts = message.decode(errors="replace").split("_")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    if parts[1] == "kv" and len(parts) == 4:
        return int(parts[0]), "kv_last" if parts[3] == "1" else "kv"
    if parts[1] == "aux":
        return int(parts[0]), "aux"
    return None


def _fields(names: tuple[str, ...], frames: list[bytes]) -> dict[str, bytes]:
    if not frames or frames[0] != GUARD:
        raise ExchangeError("the first frame is not SGLang's NIXL guard (foreign traffic?)")
    if len(frames) != 1 + len(names):
        raise ExchangeError(f"{len(frames)} frames where this release sends {1 + len(names)}")
    return dict(zip(names, frames[1:], strict=True))


def _text(value: object) -> bytes:
    return str(value).encode("ascii")


def _u64s(values: list[int]) -> bytes:
    return struct.pack(f"{len(values)}Q", *values)


def _u64s_of(data: bytes) -> tuple[int, ...]:
    return struct.unpack(f"{len(data) // 8}Q", data)
