"""The reference engine's SGLang bootstrap exchange, per release: every field it sends or
expects pinned to the one the release's own source defines (``bootstrap_exchange`` in
tests/fixtures/engines/sglang-*.json, dumped by hack/sglang_exchange_dump.py), and its
bootstrap server answering as SGLang's does (served on loopback; no NIXL)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from helpers.engine_parsers import parser_dump
from pdd_operator.engines.version import Version
from pdd_refengine.cli import parse_args
from pdd_refengine.engine import PeerHTTPError
from pdd_refengine.kvcache import RegionInfo, TransferError
from pdd_refengine.sglang_bootstrap import IDENTITY_HEADER, BootstrapServer, find_rank
from pdd_refengine.sglang_exchange import (
    OMITTED_WHEN_NONE,
    SERVER_INFO_QUERY,
    Endpoint,
    ExchangeError,
    Generation,
    PrefillRank,
    RankKey,
    parse_layout,
    parse_rank_info,
    protocol_generation,
    queried_rank,
    rank_info,
    rank_registration,
    registered_rank,
    route_query,
    server_info,
)
from pdd_refengine.sglang_flow import decode_region
from pdd_refengine.sglang_frames import (
    FAILED,
    GUARD,
    KV_ARGS_FRAMES,
    KV_ARGS_ROOM,
    ROOM_FRAMES,
    STATUS_FRAMES,
    STATUS_TAG,
    SUCCESS,
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

# The SGLang release each generation is pinned to.
RELEASES: dict[str, Version] = {"0.5.4": Version(0, 5, 4), "0.5.23": Version(0, 5, 23)}
GENERATIONS = sorted(RELEASES)
RANK = PrefillRank(Endpoint("10.0.0.7", 41234), 16, "bfloat16", 30000)
DECODE = DecodeKvArgs(
    Endpoint("10.0.0.9", 45678), "decode-0-1a2b3c4d", b"\x00agent\xffmetadata", 0x7F00_0000_1000,
    4096, 3, 512, "VRAM",
)  # fmt: skip
PAGES = RoomPages(12345, DECODE.endpoint, DECODE.agent_name, (7, 3, 9))


def upstream(generation: str) -> dict[str, Any]:
    exchange: dict[str, Any] = parser_dump("sglang", RELEASES[generation])["bootstrap_exchange"]
    return exchange


def _gen(generation: str) -> Generation:
    assert generation in ("0.5.4", "0.5.23")
    return generation  # type: ignore[return-value]


# -- the HTTP fields, against the release's source


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_prefill_registers_its_rank_with_every_key_that_releases_ranks_send(
    generation: str,
) -> None:
    sent = upstream(generation)["rank_registration"]
    body = rank_registration(_gen(generation), RANK)
    assert sorted(body) == sent["keys"]
    assert {k: body[k] for k in sent["constants"]} == sent["constants"]  # 0.5.4: role Prefill


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_server_requires_the_keys_that_releases_server_requires_and_no_more(
    generation: str,
) -> None:
    exchange = upstream(generation)
    body = rank_registration(_gen(generation), RANK)
    for key in exchange["route_put_requires"]:
        with pytest.raises(ExchangeError, match=key):
            registered_rank(_gen(generation), {k: v for k, v in body.items() if k != key})
    only_required = {k: body[k] for k in exchange["route_put_requires"]}
    assert registered_rank(_gen(generation), only_required) == (RankKey(), RANK.endpoint)
    assert set(body) - set(exchange["route_put_requires"]) <= set(exchange["route_put_accepts"])


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_route_query_has_that_releases_keys_in_its_order(generation: str) -> None:
    exchange = upstream(generation)
    query = route_query(_gen(generation), RankKey(0, 0, 1, 0))
    assert list(query) == exchange["route_query"] == exchange["decode_route_query"]
    assert queried_rank(_gen(generation), {k: str(v) for k, v in query.items()}).tp == 1
    for key in query:
        without = {k: str(v) for k, v in query.items() if k != key}
        with pytest.raises(ExchangeError, match="Missing inputs"):
            queried_rank(_gen(generation), without)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_layout_answer_has_that_releases_keys_and_the_decode_reads_only_those(
    generation: str,
) -> None:
    info = upstream(generation)["server_info"]
    answer = server_info(_gen(generation), rank_registration(_gen(generation), RANK))
    assert sorted(answer) == sorted(set(info["keys"]) - set(info["omitted_when_none"]))
    assert sorted(OMITTED_WHEN_NONE) == (info["omitted_when_none"] or sorted(OMITTED_WHEN_NONE))
    layout = parse_layout(_gen(generation), {k: answer[k] for k in info["keys"] if k in answer})
    assert (layout.tp, layout.cp, layout.dp, layout.pp) == (1, 1, 1, 1)
    if generation == "0.5.23":  # what its decode checks against its own
        assert (layout.page_size, layout.kv_cache_dtype) == (16, "bfloat16")


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_rank_is_answered_with_that_releases_keys(generation: str) -> None:
    assert sorted(rank_info(RANK.endpoint)) == upstream(generation)["rank_info"]
    assert parse_rank_info(rank_info(RANK.endpoint)) == RANK.endpoint


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_server_has_that_releases_routes(generation: str) -> None:
    app = BootstrapServer(_gen(generation), "prefill-0").app()
    served = [
        [route.method, route.resource.canonical]
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    ]
    assert served == upstream(generation)["routes"]


# -- the ZMQ frames and the completion, against the release's source


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_kv_registration_has_that_releases_frames(generation: str) -> None:
    zmq = upstream(generation)["zmq"]
    assert (GUARD.decode(), KV_ARGS_ROOM.decode()) == (zmq["guard"], zmq["kv_args_room"])
    assert list(KV_ARGS_FRAMES[_gen(generation)]) == zmq["kv_args"]
    frames = kv_args_frames(_gen(generation), DECODE)
    assert len(frames) == zmq["sent_frames"]["kv_args"] and is_kv_args(frames)
    parsed = parse_kv_args(_gen(generation), frames)
    if generation == "0.5.4":  # it sends neither the page count nor the memory kind
        assert (parsed.num_pages, parsed.mem) == (None, None)
        parsed = DecodeKvArgs(**{**parsed.__dict__, "num_pages": 512, "mem": "VRAM"})
    assert parsed == DECODE


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_rooms_pages_have_that_releases_frames(generation: str) -> None:
    zmq = upstream(generation)["zmq"]
    assert list(ROOM_FRAMES[_gen(generation)]) == zmq["room"]
    frames = room_frames(_gen(generation), PAGES)
    assert len(frames) == zmq["sent_frames"]["room"] and not is_kv_args(frames)
    assert parse_room(_gen(generation), frames) == PAGES


def test_a_0_5_23_prefill_refuses_a_0_5_4_registration_and_the_other_way_round() -> None:
    with pytest.raises(ExchangeError, match="12 frames where this release sends 25"):
        parse_kv_args("0.5.23", kv_args_frames("0.5.4", DECODE))
    with pytest.raises(ExchangeError, match="11 frames where this release sends 8"):
        parse_room("0.5.4", room_frames("0.5.23", PAGES))
    with pytest.raises(ExchangeError, match="guard"):
        parse_room("0.5.4", [b"other", *room_frames("0.5.4", PAGES)[1:]])


def test_the_status_message_is_0_5_23s_and_0_5_4_has_none() -> None:
    assert upstream("0.5.4")["zmq"]["status"] is None  # the reference engine's one addition
    status = upstream("0.5.23")["zmq"]["status"]
    assert (STATUS_TAG.decode(), list(STATUS_FRAMES)) == (status["tag"], status["frames"])
    assert status["carries_reason"] is True
    for generation in GENERATIONS:
        assert (
            upstream(generation)["kv_poll"]["Failed"],
            upstream(generation)["kv_poll"]["Success"],
        ) == (FAILED, SUCCESS)
    assert parse_status(status_frames(12345, None)) == (12345, None)
    assert parse_status(status_frames(7, "NIXL WRITE failed")) == (7, "NIXL WRITE failed")
    assert status_frames(7, None)[2] == str(SUCCESS).encode()
    assert parse_status(room_frames("0.5.23", PAGES)) is None


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_completion_notifications_are_those_that_releases_decode_reads(
    generation: str,
) -> None:
    upstream_notifs = upstream(generation)["nixl_notifications"]
    notifs = completion_notifs(_gen(generation), 12345)
    if upstream_notifs is None:
        assert notifs == ()
        return
    kinds = {n.decode().split(upstream_notifs["separator"])[1] for n in notifs}
    assert kinds == set(upstream_notifs["kinds"])
    assert [parse_notif(n) for n in notifs] == [(12345, "kv_last"), (12345, "aux")]
    assert parse_notif(b"pdd-free:1,2") is None and parse_notif(b"12_kv_0_0") == (12, "kv")


@pytest.mark.parametrize(
    ("tag", "generation"),
    [
        ("sglang-0.5.23", "0.5.23"),
        ("sglang-0.6.1", "0.5.23"),
        ("sglang-0.5.4", "0.5.4"),
        ("sglang-0.5.10", "0.5.4"),
        ("0.1.0", "0.5.4"),
        ("vllm-0.33.0", "0.5.4"),
    ],
)
def test_the_image_tag_names_the_exchange(tag: str, generation: str) -> None:
    assert protocol_generation(tag) == generation
    argv = ["sglang", "--model-path", "m", "--disaggregation-mode", "decode"]
    env = {"PDD_REFENGINE_IMAGE_TAG": tag}
    assert parse_args(argv, env).bootstrap_protocol == generation


# -- the prefill's region as the decode's registration describes it


def _engine(mem: str = "DRAM") -> Any:
    info = RegionInfo("prefill-agent", 0x1000, 4096, 64, 256, 16, mem, 0)
    return SimpleNamespace(cache=SimpleNamespace(info=info))


def test_a_0_5_23_registration_gives_the_decodes_page_count_and_memory() -> None:
    region = decode_region(_engine(), DECODE)
    assert region == RegionInfo(DECODE.agent_name, DECODE.base_addr, 4096, 512, 256, 16, "VRAM", 3)


def test_a_0_5_4_registration_leaves_page_count_and_memory_to_the_prefills_own() -> None:
    old = DecodeKvArgs(**{**DECODE.__dict__, "num_pages": None, "mem": None})
    region = decode_region(_engine("DRAM"), old)
    assert (region.num_blocks, region.mem) == (64, "DRAM")


def test_pages_that_do_not_hold_whole_tokens_are_refused() -> None:
    with pytest.raises(TransferError, match="do not hold 16 tokens"):
        decode_region(_engine(), DecodeKvArgs(**{**DECODE.__dict__, "page_bytes": 4001}))


# -- the bootstrap server, served, and the decode's calls to it


async def _served(generation: str) -> TestClient[web.Request, web.Application]:
    client = TestClient(TestServer(BootstrapServer(_gen(generation), "prefill-0").app()))
    await client.start_server()
    return client


@pytest.mark.parametrize("generation", GENERATIONS)
async def test_the_server_answers_a_registered_rank_as_sglangs_does(generation: str) -> None:
    client = await _served(generation)
    try:
        before = await client.get("/route", params=route_query(_gen(generation), SERVER_INFO_QUERY))
        assert before.status == 503
        put = await client.put("/route", json=rank_registration(_gen(generation), RANK))
        assert (put.status, await put.text()) == (200, "OK")
        layout = await client.get("/route", params=route_query(_gen(generation), SERVER_INFO_QUERY))
        expected = server_info(_gen(generation), rank_registration(_gen(generation), RANK))
        assert await layout.json() == expected
        rank = await client.get("/route", params=route_query(_gen(generation), RankKey()))
        assert await rank.json() == {"rank_ip": "10.0.0.7", "rank_port": 41234}
        assert rank.headers[IDENTITY_HEADER] == "prefill-0"
        other = await client.get("/route", params=route_query(_gen(generation), RankKey(tp=1)))
        assert other.status == 404
        missing = await client.get("/route", params={"target_pp_rank": "0"})
        assert (missing.status, await missing.text()) == (
            400,
            "Missing inputs for bootstrap server.",
        )
        assert (await client.delete("/route")).status == 405
        health = await client.get("/health")
        assert (health.status, await health.text()) == (200, "OK")
    finally:
        await client.close()


@pytest.mark.parametrize("generation", GENERATIONS)
async def test_a_malformed_registration_is_refused(generation: str) -> None:
    client = await _served(generation)
    try:
        body = {**rank_registration(_gen(generation), RANK), "rank_port": "x"}
        assert (await client.put("/route", json=body)).status == 400
        assert (await client.put("/route", data=b"not json")).status == 400
    finally:
        await client.close()


async def test_0_5_23_waits_for_every_rank_of_the_layout() -> None:
    client = await _served("0.5.23")
    try:
        two = {**rank_registration("0.5.23", RANK), "attn_tp_size": 2}
        await client.put("/route", json=two)
        params = route_query("0.5.23", SERVER_INFO_QUERY)
        assert (await client.get("/route", params=params)).status == 503
        await client.put("/route", json={**two, "attn_tp_rank": 1, "rank_port": 41235})
        assert (await (await client.get("/route", params=params)).json())["attn_tp_size"] == 2
        rank1 = await client.get("/route", params=route_query("0.5.23", RankKey(tp=1)))
        assert (await rank1.json())["rank_port"] == 41235
    finally:
        await client.close()


async def test_0_5_23_keeps_a_rooms_dp_rank_and_0_5_4_has_no_such_route() -> None:
    client = await _served("0.5.23")
    try:
        await client.post("/register_dp_rank", json={"bootstrap_room": 77, "dp_rank": 1})
        answer = await client.post("/query_dp_ranks", json={"bootstrap_rooms": [77, 78]})
        assert await answer.json() == {"77": 1}
    finally:
        await client.close()
    old = await _served("0.5.4")
    try:
        assert (await old.post("/register_dp_rank", json={})).status == 404
    finally:
        await old.close()


@pytest.mark.parametrize("generation", GENERATIONS)
async def test_the_decode_finds_the_prefills_rank_and_who_it_is(generation: str) -> None:
    client = await _served(generation)
    try:
        await client.put("/route", json=rank_registration(_gen(generation), RANK))
        server = f"{client.host}:{client.port}"
        deadline = time.monotonic() + 5
        peer = await asyncio.to_thread(find_rank, _gen(generation), server, 12345, deadline)
        assert (peer.endpoint, peer.identity) == (RANK.endpoint, "prefill-0")
    finally:
        await client.close()


async def test_the_decode_pairs_only_with_a_prefill_of_one_rank() -> None:
    client = await _served("0.5.23")
    try:
        wide = {**rank_registration("0.5.23", RANK), "attn_tp_size": 2}
        await client.put("/route", json=wide)
        await client.put("/route", json={**wide, "attn_tp_rank": 1})
        server, deadline = f"{client.host}:{client.port}", time.monotonic() + 5
        with pytest.raises(TransferError, match="TP 2"):
            await asyncio.to_thread(find_rank, "0.5.23", server, 1, deadline)
    finally:
        await client.close()


async def test_the_decode_waits_for_a_prefill_still_registering_until_its_deadline() -> None:
    client = await _served("0.5.23")
    try:
        server, start = f"{client.host}:{client.port}", time.monotonic()
        with pytest.raises(PeerHTTPError, match="503"):
            await asyncio.to_thread(find_rank, "0.5.23", server, 1, start + 0.5)
        assert 0.4 < time.monotonic() - start < 3
    finally:
        await client.close()


# -- the rank's ZMQ sockets, on loopback


async def test_a_rank_socket_receives_what_a_peer_pushes_frame_for_frame() -> None:
    received: asyncio.Queue[list[bytes]] = asyncio.Queue()
    prefill, decode = RankSockets("127.0.0.1", received.put_nowait), RankSockets("127.0.0.1", print)
    try:
        endpoint = prefill.start()
        decode.start()
        assert endpoint.port > 0 and decode.endpoint.port not in (0, endpoint.port)
        for frames in (kv_args_frames("0.5.23", DECODE), room_frames("0.5.23", PAGES)):
            await decode.send(endpoint, frames)
            assert await asyncio.wait_for(received.get(), 5) == frames
        decode.forget(endpoint)  # a new PUSH socket next time, which still arrives
        await decode.send(endpoint, status_frames(1, None))
        assert parse_status(await asyncio.wait_for(received.get(), 5)) == (1, None)
    finally:
        await decode.close()
        await prefill.close()
