"""vLLM's ``kv_transfer_params`` as its NixlConnector reads and writes them.

The router asks a prefill for a remote decode with ``{"do_remote_decode": true,
"do_remote_prefill": false}`` (and ``max_tokens: 1``). The prefill answers with what a decode
needs to pull the KV: the blocks it holds, its engine id and its side channel's host and port,
and its tensor-parallel size (``NixlConnectorScheduler.request_finished``). The router hands
that to a decode unchanged, which then READs the blocks and tells the prefill to free them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class KvParamsError(ValueError):
    """The request's kv_transfer_params cannot be acted on (answered as HTTP 400)."""


@dataclass(frozen=True)
class RemotePrefill:
    """What a decode needs to pull a prefill's KV."""

    block_ids: tuple[int, ...]
    engine_id: str
    host: str
    port: int
    tp_size: int

    def to_params(self) -> dict[str, Any]:
        """The prefill's answer, key for key as vLLM's NixlConnector builds it."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(self.block_ids),
            "remote_engine_id": self.engine_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": self.tp_size,
        }


def wants_remote_decode(params: Any) -> bool:
    """True when a router asks this engine to prefill for a decode elsewhere."""
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def wants_remote_prefill(params: Any) -> bool:
    """True when this engine is to decode with KV a prefill elsewhere computed."""
    return isinstance(params, dict) and bool(params.get("do_remote_prefill"))


def parse_remote_prefill(params: Any) -> RemotePrefill:
    """A decode request's params, checked: every field a prefill answer carries."""
    if not isinstance(params, dict):
        raise KvParamsError("kv_transfer_params must be a JSON object")
    try:
        block_ids = tuple(int(b) for b in params["remote_block_ids"])
        engine_id = str(params["remote_engine_id"])
        host = str(params["remote_host"])
        port = int(params["remote_port"])
        tp_size = int(params.get("tp_size", 1))
    except KeyError as missing:
        raise KvParamsError(f"kv_transfer_params lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise KvParamsError(f"kv_transfer_params: {exc}") from None
    if not block_ids:
        raise KvParamsError("kv_transfer_params: remote_block_ids is empty")
    if not engine_id or not host or not 0 < port < 65536:
        raise KvParamsError("kv_transfer_params: remote_engine_id, remote_host, remote_port")
    return RemotePrefill(block_ids, engine_id, host, port, tp_size)
