"""The prefill's bootstrap server (``--disaggregation-bootstrap-port``), answering as SGLang's
``CommonKVBootstrapServer`` of the release the engine plays, and the two sides' calls to it:
the prefill registering its rank, the decode finding the rank to send a room to. The fields
are ``sglang_exchange``'s.

Beside SGLang's fields, every answer carries the prefill's pod name in the header
``X-Pdd-Refengine-Identity``, for the reference engine's own ``pdd_refengine`` response field
(which names the prefill that sent the KV); a real decode reads no header.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pdd_refengine.engine import PeerHTTPError, http_call
from pdd_refengine.kvcache import TransferError
from pdd_refengine.sglang_exchange import (
    SERVER_INFO_QUERY,
    Endpoint,
    ExchangeError,
    Generation,
    PrefillLayout,
    PrefillRank,
    RankKey,
    asks_layout,
    expected_ranks,
    parse_layout,
    parse_rank_info,
    queried_rank,
    rank_info,
    rank_registration,
    registered_rank,
    route_query,
    server_info,
)

IDENTITY_HEADER = "X-Pdd-Refengine-Identity"
ROOM_DP_RANKS_KEPT = 4096  # 0.5.23 expires them by age; a bound does as well here


class BootstrapServer:
    """One prefill's table of ranks, as the release's server keeps it."""

    def __init__(self, generation: Generation, identity: str) -> None:
        self.generation = generation
        self.identity = identity
        self.ranks: dict[RankKey, Endpoint] = {}
        self.first: dict[str, Any] | None = None  # the layout comes from the first rank
        self.room_dp_ranks: OrderedDict[int, int] = OrderedDict()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/route", self._route)
        if self.generation == "0.5.23":
            app.router.add_post("/register_dp_rank", self._register_dp_rank)
            app.router.add_post("/query_dp_ranks", self._query_dp_ranks)
        app.router.add_get("/health", self._health)
        app.on_response_prepare.append(self._identify)
        return app

    async def _identify(self, _request: web.Request, response: web.StreamResponse) -> None:
        response.headers[IDENTITY_HEADER] = self.identity

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return await self._register(request)
        if request.method == "GET":
            return self._lookup(request)
        return web.Response(text="Method not allowed", status=405)

    async def _register(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            key, endpoint = registered_rank(self.generation, body)
        except (ValueError, ExchangeError) as exc:
            return web.Response(text=str(exc), status=400)
        self.first = self.first or body
        self.ranks[key] = endpoint
        return web.Response(text="OK")

    def _lookup(self, request: web.Request) -> web.Response:
        try:
            key = queried_rank(self.generation, request.query)
        except ExchangeError as exc:
            return web.Response(text=str(exc), status=400)
        # 0.5.4 answers a layout of nulls before any rank registered, which its decode then
        # fails on; a 503, as 0.5.23 answers until every rank registered, says so plainly.
        if self.first is None or len(self.ranks) < expected_ranks(self.generation, self.first):
            registered = len(self.ranks)
            text = f"Prefill server not fully registered yet ({registered} workers registered)."
            return web.Response(text=text, status=503)
        if asks_layout(self.generation, key):
            return web.json_response(server_info(self.generation, self.first))
        if key not in self.ranks:
            return web.Response(text=f"Bootstrap info not found for {key}", status=404)
        return web.json_response(rank_info(self.ranks[key]))

    async def _register_dp_rank(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            self.room_dp_ranks[int(body["bootstrap_room"])] = int(body["dp_rank"])
        except (ValueError, KeyError, TypeError) as exc:
            return web.Response(text=f"bad dp rank registration: {exc}", status=400)
        while len(self.room_dp_ranks) > ROOM_DP_RANKS_KEPT:
            self.room_dp_ranks.popitem(last=False)
        return web.Response(text="OK")

    async def _query_dp_ranks(self, request: web.Request) -> web.Response:
        try:
            rooms = [int(room) for room in (await request.json())["bootstrap_rooms"]]
        except (ValueError, KeyError, TypeError) as exc:
            return web.Response(text=f"bad dp rank query: {exc}", status=400)
        known = {str(r): self.room_dp_ranks[r] for r in rooms if r in self.room_dp_ranks}
        return web.json_response(known)


# -- the calls to it (blocking: run them off the event loop)


def register_rank(generation: Generation, server: str, rank: PrefillRank) -> None:
    """The prefill rank's ``PUT /route`` at its own bootstrap server (``server``:
    ``host:port``)."""
    http_call("PUT", f"http://{server}/route", rank_registration(generation, rank), 5.0)


@dataclass(frozen=True)
class PrefillPeer:
    """The prefill rank a decode sends a room to, and who it is."""

    endpoint: Endpoint
    layout: PrefillLayout
    identity: str


def find_rank(generation: Generation, server: str, room: int, deadline: float) -> PrefillPeer:
    """As SGLang's decode does: the prefill's layout, then its rank for this room (the DP
    group by ``room % dp_size``, as with SGLang's default ``follow_bootstrap_room``)."""
    layout = parse_layout(generation, _route(generation, server, SERVER_INFO_QUERY, deadline)[0])
    if (layout.tp, layout.cp, layout.pp) != (1, 1, 1):
        raise TransferError(
            f"the prefill at {server} has TP {layout.tp}, CP {layout.cp}, PP {layout.pp}: the "
            "reference engine's decode pairs with a prefill of one rank"
        )
    key = RankKey(dp=room % max(layout.dp, 1))
    answer, identity = _route(generation, server, key, deadline)
    return PrefillPeer(parse_rank_info(answer), layout, identity)


def _route(generation: Generation, server: str, key: RankKey, deadline: float) -> tuple[Any, str]:
    """``GET /route`` for ``key``, again while the server says its ranks are not all there."""
    query = "&".join(f"{name}={value}" for name, value in route_query(generation, key).items())
    url = f"http://{server}/route?{query}"
    while True:
        try:
            answer, headers = http_call("GET", url, None, min(5.0, deadline - time.monotonic()))
            return _json(url, answer), str(headers.get(IDENTITY_HEADER, ""))
        except PeerHTTPError as err:
            if err.status != 503 or time.monotonic() + 0.1 > deadline:
                raise
            time.sleep(0.1)


def _json(url: str, answer: bytes) -> Any:
    try:
        return json.loads(answer)
    except ValueError as exc:
        raise TransferError(f"{url} answered no JSON: {exc}") from None


def alive(server: str) -> bool:
    """SGLang's decode heartbeat: the bootstrap server's ``/health`` answers."""
    try:
        http_call("GET", f"http://{server}/health", None, 1.0)
    except TransferError:
        return False
    return True
