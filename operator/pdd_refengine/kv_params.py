"""vLLM's ``kv_transfer_params`` as its NixlConnector reads and writes them.

The router asks a prefill for a remote decode with ``{"do_remote_decode": true,
"do_remote_prefill": false}`` (and ``max_tokens: 1``). The prefill answers with what a decode
needs to pull the KV: the blocks it holds, its engine id and its side channel's host and port,
and its tensor-parallel size (``NixlConnectorScheduler.request_finished``). The router hands
that to a decode unchanged, which then READs the blocks and tells the prefill to free them.

Two generations of the answer, selected by the vLLM release the engine plays
(``protocol_generation``):

- ``0.11`` (v0.11.0 ``nixl_connector.py``, ``request_finished``): ``remote_block_ids`` a flat
  list, the engine id, side channel host and port, ``tp_size``.
- ``0.33`` (0.33.0 ``nixl/pull_scheduler.py`` L278-293): ``remote_block_ids`` one list per KV
  cache group, and beside it ``remote_request_id`` (which a 0.33 decode requires, L74-77: the
  prefill's own id of the request, which its notifications name), ``dcp_size``, ``pp_size``,
  ``remote_num_tokens``, ``remote_blocks_expiry_time``, ``remote_registration_generation`` and
  ``transfer_mode`` (``pull``; vllm-router 0.1.17 sends both legs at once only for ``push``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

Generation = Literal["0.11", "0.33"]
# The first vLLM release whose NixlConnector answers in the 0.33 shape (per-group block ids
# and remote_request_id) is not pinned here: the reference engine plays the two supported
# ends, and a tag naming anything from 0.33 on gets the newer shape.
_RELEASE_TAG = re.compile(r"^vllm-(\d+)\.(\d+)")


def protocol_generation(image_tag: str) -> Generation:
    """The generation an image tag such as ``vllm-0.33.0`` names; any other tag: 0.11."""
    match = _RELEASE_TAG.match(image_tag)
    if match and (int(match[1]), int(match[2])) >= (0, 33):
        return "0.33"
    return "0.11"


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
    request_id: str = ""  # 0.33: the prefill's own id of the request
    tokens: int = 0  # 0.33: how many prompt tokens the blocks hold

    def to_params(self, generation: Generation = "0.11") -> dict[str, Any]:
        """The prefill's answer, key for key as that generation's NixlConnector builds it."""
        params: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(self.block_ids),
            "remote_engine_id": self.engine_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": self.tp_size,
        }
        if generation == "0.33":
            params.update(
                remote_block_ids=[list(self.block_ids)],  # one KV cache group here
                remote_request_id=self.request_id,
                dcp_size=1,
                pp_size=1,
                remote_num_tokens=self.tokens,
                remote_blocks_expiry_time=None,
                remote_registration_generation=0,
                transfer_mode="pull",
            )
        return params


def wants_remote_decode(params: Any) -> bool:
    """True when a router asks this engine to prefill for a decode elsewhere."""
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def wants_remote_prefill(params: Any) -> bool:
    """True when this engine is to decode with KV a prefill elsewhere computed."""
    return isinstance(params, dict) and bool(params.get("do_remote_prefill"))


def parse_remote_prefill(params: Any, generation: Generation = "0.11") -> RemotePrefill:
    """A decode request's params, checked: every field that generation's decode reads."""
    if not isinstance(params, dict):
        raise KvParamsError("kv_transfer_params must be a JSON object")
    try:
        block_ids = _block_ids(params["remote_block_ids"], generation)
        engine_id = str(params["remote_engine_id"])
        host = str(params["remote_host"])
        port = int(params["remote_port"])
        tp_size = int(params.get("tp_size", 1))
        request_id = str(params["remote_request_id"]) if generation == "0.33" else ""
        tokens = int(params.get("remote_num_tokens") or 0)
    except KeyError as missing:
        raise KvParamsError(f"kv_transfer_params lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise KvParamsError(f"kv_transfer_params: {exc}") from None
    if not block_ids:
        raise KvParamsError("kv_transfer_params: remote_block_ids is empty")
    if not engine_id or not host or not 0 < port < 65536:
        raise KvParamsError("kv_transfer_params: remote_engine_id, remote_host, remote_port")
    if generation == "0.33" and not request_id:
        raise KvParamsError("kv_transfer_params: remote_request_id is empty")
    return RemotePrefill(block_ids, engine_id, host, port, tp_size, request_id, tokens)


def parse_push_prefill(params: Any) -> RemotePrefill:
    """A push decode's params: which prefill engine holds the request (``remote_engine_id``,
    its side channel) and its id there (``remote_request_id``). No block ids: the prefill
    WRITEs into the decode's own blocks. vllm-router 0.1.17 sends exactly these once it knows
    a prefill pushes, on the decode leg it starts beside the prefill's (measured against the
    router: tests/integration/test_refengine_routers.py)."""
    if not isinstance(params, dict):
        raise KvParamsError("kv_transfer_params must be a JSON object")
    try:
        engine_id = str(params["remote_engine_id"])
        host = str(params["remote_host"])
        port = int(params["remote_port"])
        request_id = str(params["remote_request_id"])
        tp_size = int(params.get("tp_size") or 1)
    except KeyError as missing:
        raise KvParamsError(f"kv_transfer_params lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise KvParamsError(f"kv_transfer_params: {exc}") from None
    if not engine_id or not host or not 0 < port < 65536 or not request_id:
        raise KvParamsError(
            "kv_transfer_params: remote_engine_id, remote_host, remote_port, remote_request_id"
        )
    return RemotePrefill((), engine_id, host, port, tp_size, request_id)


def _block_ids(value: Any, generation: Generation) -> tuple[int, ...]:
    """0.11: a flat list; 0.33: one list per KV cache group (the reference engine has one)."""
    if generation == "0.11":
        return tuple(int(b) for b in value)
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], list):
        raise KvParamsError(
            "kv_transfer_params: remote_block_ids must be one list per KV cache group (vLLM "
            f"0.33), got {str(value)[:80]}"
        )
    return tuple(int(b) for b in value[0])
