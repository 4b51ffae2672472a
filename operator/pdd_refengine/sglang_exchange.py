"""SGLang's bootstrap server exchange (HTTP), key for key, for the release the engine plays.

A prefill rank registers where its ZMQ socket is (``PUT /route``); a decode asks the server
for the prefill's parallel layout (``GET /route`` with every rank ``-1``) and then for the
rank it pairs with (``GET /route`` naming it), and gets ``rank_ip`` / ``rank_port`` back. Its
ZMQ frames are ``sglang_frames``. The keys here are pinned to the fixture dumped from each
release's source (``bootstrap_exchange`` in tests/fixtures/engines/sglang-*.json,
hack/sglang_exchange_dump.py).

Two generations, selected by the SGLang release the image plays (``protocol_generation``):

- ``0.5.4`` (``sglang/srt/disaggregation/common/conn.py`` of 0.5.4): routes ``/route`` (PUT,
  GET) and ``/health`` (L480-482). A rank PUTs ``role: Prefill``, the attention TP and DP
  sizes and ranks, ``pp_size``/``pp_rank``, ``system_dp_size``/``system_dp_rank``,
  ``rank_ip``, ``rank_port`` (L116-128; read L499-510). A decode's query is
  ``engine_rank``, ``target_dp_group``, ``target_pp_rank`` (L392, L411; read L545-549); all
  ``-1`` answers ``prefill_attn_tp_size``, ``prefill_dp_size``, ``prefill_pp_size``
  (L551-562, read L416-418).
- ``0.5.23`` (the same file of 0.5.23): also ``POST /register_dp_rank`` and ``POST
  /query_dp_ranks`` (L3069-3073, L3261-3282; a decode uses them only where the prefill has
  several DP ranks and does not place rooms by ``bootstrap_room % dp_size``, decode.py
  L879-897). A rank PUTs no ``role`` but the attention CP size and rank, ``page_size``,
  ``kv_cache_dtype``, ``kv_layout``, ``dsv41_spec_layout``, ``load_balance_method``, the DSA
  and KV-sharding switches, ``prefill_http_port`` and ``decode_allocation_policy``
  (L1584-1612; read L3089-3160). The query is ``prefill_dp_rank``, ``prefill_cp_rank``,
  ``target_tp_rank``, ``target_pp_rank`` (L2700, L1301-1305; read L3189-3199); all ``-1``
  answers every field of ``PrefillServerInfo`` (L119-148), ``kv_layout`` and
  ``dsv41_spec_layout`` left out when None (L3213-3237), and either query is 503 until every
  rank has registered (L3055-3067). The decode refuses a prefill of another page size or KV
  cache dtype (L1320-1335).

Both answer a rank with ``rank_ip`` and ``rank_port`` (0.5.4 L534-537; 0.5.23
``PrefillRankInfo`` L166-173, L3259) and ``/health`` with ``OK``.

The reference engine is one process holding the whole KV region, so its prefill registers
one rank (every size 1, every rank 0), as an SGLang prefill of one GPU does, and its decode
pairs only with such a prefill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

Generation = Literal["0.5.4", "0.5.23"]
# The first SGLang release that speaks the 0.5.23 exchange is not pinned here: the fields
# grew over the releases between, and the reference engine plays the two supported ends.
_RELEASE_TAG = re.compile(r"^sglang-(\d+)\.(\d+)\.(\d+)")


def protocol_generation(image_tag: str) -> Generation:
    """The generation an image tag such as ``sglang-0.5.23`` names; any other tag: 0.5.4."""
    match = _RELEASE_TAG.match(image_tag)
    if match and tuple(int(part) for part in match.groups()) >= (0, 5, 23):
        return "0.5.23"
    return "0.5.4"


class ExchangeError(ValueError):
    """A body or query the bootstrap exchange of that release does not accept."""


@dataclass(frozen=True)
class RankKey:
    """Which prefill rank: data-parallel group, context-parallel rank (0.5.23), attention
    tensor-parallel rank, pipeline stage."""

    dp: int = 0
    cp: int = 0
    tp: int = 0
    pp: int = 0


SERVER_INFO_QUERY = RankKey(-1, -1, -1, -1)  # "tell me your layout", not a rank


def asks_layout(generation: Generation, key: RankKey) -> bool:
    """Whether a query is the all ``-1`` one (0.5.4 has no CP rank to ask with)."""
    cp = key.cp if generation == "0.5.23" else -1
    return (key.dp, cp, key.tp, key.pp) == (-1, -1, -1, -1)


@dataclass(frozen=True)
class Endpoint:
    """A rank's ZMQ PULL socket."""

    ip: str
    port: int


@dataclass(frozen=True)
class PrefillRank:
    """What the reference engine's prefill registers: its one rank's socket, and (0.5.23)
    its page size, KV cache dtype and HTTP port."""

    endpoint: Endpoint
    page_size: int
    kv_cache_dtype: str
    http_port: int


@dataclass(frozen=True)
class PrefillLayout:
    """The parallel layout a decode reads from the all ``-1`` answer."""

    tp: int
    cp: int
    dp: int
    pp: int
    page_size: int | None = None  # 0.5.23
    kv_cache_dtype: str | None = None  # 0.5.23


def rank_registration(generation: Generation, rank: PrefillRank) -> dict[str, Any]:
    """The ``PUT /route`` body of a prefill of one rank."""
    body: dict[str, Any] = {
        "attn_tp_size": 1,
        "attn_tp_rank": 0,
        "attn_dp_size": 1,
        "attn_dp_rank": 0,
        "pp_size": 1,
        "pp_rank": 0,
        "system_dp_size": 1,
        "system_dp_rank": 0,
        "rank_ip": rank.endpoint.ip,
        "rank_port": rank.endpoint.port,
    }
    if generation == "0.5.4":
        return {"role": "Prefill", **body}
    return {
        **body,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "page_size": rank.page_size,
        "kv_cache_dtype": rank.kv_cache_dtype,
        "kv_layout": None,
        "dsv41_spec_layout": None,
        "load_balance_method": "follow_bootstrap_room",
        "enable_dsa_cache_layer_split": False,
        "enable_kv_cache_sharding": False,
        "prefill_http_port": rank.http_port,
        "decode_allocation_policy": "early",
    }


def registered_rank(generation: Generation, body: Any) -> tuple[RankKey, Endpoint]:
    """Where a registration puts the rank, read as that release's server reads it (every
    key it requires, the layout's too): a DP group is the attention DP rank unless the
    system runs several DP processes."""
    try:
        if generation == "0.5.4" and body["role"] != "Prefill":
            raise ExchangeError(f"role {body['role']!r}: only prefill ranks register")
        server_info(generation, body)
        attn_dp, system_dp = int(body["attn_dp_rank"]), int(body["system_dp_rank"])
        dp = system_dp if int(body["system_dp_size"]) > 1 else attn_dp
        cp = int(body["attn_cp_rank"]) if generation == "0.5.23" else 0
        key = RankKey(dp, cp, int(body["attn_tp_rank"]), int(body["pp_rank"]))
        return key, Endpoint(str(body["rank_ip"]), int(body["rank_port"]))
    except KeyError as missing:
        raise ExchangeError(f"the rank registration lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ExchangeError(f"the rank registration is malformed: {exc}") from None


def server_info(generation: Generation, first: dict[str, Any]) -> dict[str, Any]:
    """The all ``-1`` answer, from the first rank's registration (as the server keeps the
    layout of the first)."""
    attn_dp, system_dp = int(first["attn_dp_size"]), int(first["system_dp_size"])
    dp = attn_dp if system_dp == 1 else system_dp
    if generation == "0.5.4":
        return {
            "prefill_attn_tp_size": first["attn_tp_size"],
            "prefill_dp_size": dp,
            "prefill_pp_size": first["pp_size"],
        }
    info = {
        "attn_tp_size": first["attn_tp_size"],
        "attn_cp_size": first["attn_cp_size"],
        "dp_size": dp,
        "pp_size": first["pp_size"],
        "page_size": first["page_size"],
        "kv_cache_dtype": first["kv_cache_dtype"],
        "kv_layout": first.get("kv_layout"),
        "dsv41_spec_layout": first.get("dsv41_spec_layout"),
        "follow_bootstrap_room": first.get("load_balance_method", "follow_bootstrap_room")
        == "follow_bootstrap_room",
        "enable_dsa_cache_layer_split": bool(first.get("enable_dsa_cache_layer_split")),
        "enable_kv_cache_sharding": bool(first.get("enable_kv_cache_sharding")),
        "prefill_http_port": first.get("prefill_http_port"),
        "decode_allocation_policy": first.get("decode_allocation_policy", "early"),
        # What a decode works out for itself once it has the layout: never sent filled in.
        "target_tp_rank": None,
        "target_tp_ranks": None,
        "target_cp_ranks": None,
        "target_pp_ranks": None,
        "required_dst_info_num": None,
        "required_prefill_response_num": None,
    }
    return {k: v for k, v in info.items() if v is not None or k not in OMITTED_WHEN_NONE}


OMITTED_WHEN_NONE = ("kv_layout", "dsv41_spec_layout")


def expected_ranks(generation: Generation, first: dict[str, Any]) -> int:
    """How many ranks register before 0.5.23's server answers (0.5.4's does not wait)."""
    if generation == "0.5.4":
        return 0
    info = server_info(generation, first)
    return int(info["dp_size"] * info["attn_cp_size"] * info["attn_tp_size"] * info["pp_size"])


def parse_layout(generation: Generation, data: Any) -> PrefillLayout:
    """The decode's reading of the all ``-1`` answer."""
    try:
        if generation == "0.5.4":
            return PrefillLayout(
                int(data["prefill_attn_tp_size"]),
                1,
                int(data["prefill_dp_size"]),
                int(data["prefill_pp_size"]),
            )
        return PrefillLayout(
            int(data["attn_tp_size"]),
            int(data["attn_cp_size"]),
            int(data["dp_size"]),
            int(data["pp_size"]),
            None if data["page_size"] is None else int(data["page_size"]),
            None if data["kv_cache_dtype"] is None else str(data["kv_cache_dtype"]),
        )
    except KeyError as missing:
        raise ExchangeError(f"the prefill's layout lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ExchangeError(f"the prefill's layout is malformed: {exc}") from None


def route_query(generation: Generation, key: RankKey) -> dict[str, int]:
    """The ``GET /route`` query naming ``key`` (``SERVER_INFO_QUERY``: the layout)."""
    if generation == "0.5.4":
        return {"engine_rank": key.tp, "target_dp_group": key.dp, "target_pp_rank": key.pp}
    return {
        "prefill_dp_rank": key.dp,
        "prefill_cp_rank": key.cp,
        "target_tp_rank": key.tp,
        "target_pp_rank": key.pp,
    }


def queried_rank(generation: Generation, query: Any) -> RankKey:
    """The rank a ``GET /route`` query names, read as that release's server reads it."""
    names = list(route_query(generation, RankKey()))
    values = [query.get(name) for name in names]
    if not all(values):  # the server refuses empty values as well as missing ones
        raise ExchangeError("Missing inputs for bootstrap server.")
    try:
        by_name = dict(zip(names, map(int, values), strict=True))
    except ValueError as exc:
        raise ExchangeError(f"the rank query is malformed: {exc}") from None
    if generation == "0.5.4":
        dp, tp, pp = by_name["target_dp_group"], by_name["engine_rank"], by_name["target_pp_rank"]
        return RankKey(dp, 0, tp, pp)
    return RankKey(
        by_name["prefill_dp_rank"],
        by_name["prefill_cp_rank"],
        by_name["target_tp_rank"],
        by_name["target_pp_rank"],
    )


def rank_info(endpoint: Endpoint) -> dict[str, Any]:
    return {"rank_ip": endpoint.ip, "rank_port": endpoint.port}


def parse_rank_info(data: Any) -> Endpoint:
    try:
        return Endpoint(str(data["rank_ip"]), int(data["rank_port"]))
    except KeyError as missing:
        raise ExchangeError(f"the rank's answer lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ExchangeError(f"the rank's answer is malformed: {exc}") from None
