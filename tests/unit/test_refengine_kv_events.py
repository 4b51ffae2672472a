"""The reference engine's KV events, as vLLM 0.33 publishes them for vllm-router's kv_aware:
a real SUB socket on loopback receives the batches and decodes them in the shape vLLM's
``distributed/kv_events.py`` defines; the replay answers as vLLM's ROUTER does; and the HTTP
routes a router discovers and tokenizes with."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pdd_refengine.cli import IMAGE_TAG_ENV, EngineConfig, UsageError, parse_args
from pdd_refengine.kv_events import KvEvents, PrefixStore, block_hash_of
from pdd_refengine.metrics import engine_metrics
from pdd_refengine.pattern import tokenize
from pdd_refengine.server import DEV_MODE_ENV, App

HOST = "127.0.0.1"
BLOCK = 4
TOPIC = "kv"
# Three complete blocks of 4 tokens (48 bytes of text), then a tail of two tokens.
PREFIX = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
MORE = "x" * 34  # after PREFIX: two more complete blocks and a tail of one token
EVENTS = {
    "enable_kv_cache_events": True,
    "endpoint": "tcp://*:0",
    "replay_endpoint": "tcp://*:0",
    "topic": TOPIC,
}
STORED_KEYS = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
]


def _config(
    events: dict[str, Any] | None = EVENTS, release: str = "vllm-0.33.0", *extra: str
) -> EngineConfig:
    argv = ["vllm", "serve", "org/model", "--host", HOST, "--block-size", str(BLOCK), *extra]
    if events is not None:
        argv += ["--kv-events-config", json.dumps(events)]
    return parse_args(argv, {IMAGE_TAG_ENV: release})


def _decode(payload: bytes) -> list[Any]:
    """A batch decoded generically: the test sees the maps and arrays as sent."""
    batch = msgspec.msgpack.decode(payload)
    assert isinstance(batch, list)
    return batch


# -- --kv-events-config


def test_the_config_is_parsed_with_vllm_0_33s_defaults() -> None:
    events = _config({"enable_kv_cache_events": True}).kv_events
    assert events.to_json() == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",  # 0.33: the default once events are enabled
        "endpoint": "tcp://*:5557",
        "replay_endpoint": None,
        "buffer_steps": 10_000,
        "hwm": 100_000,
        "max_queue_size": 100_000,
        "topic": "",
    }
    assert not _config(None).kv_events.publishes
    assert not _config({"enable_kv_cache_events": False}).kv_events.publishes


def test_vllm_0_11_publishes_only_when_told_zmq() -> None:
    assert not _config({"enable_kv_cache_events": True}, "vllm-0.11.0").kv_events.publishes
    told = {"enable_kv_cache_events": True, "publisher": "zmq"}
    assert _config(told, "vllm-0.11.0").kv_events.publishes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "--kv-events-config is not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"enable_kv_cache_events": true, "colour": 1}', "unknown field"),
        ('{"publisher": "kafka"}', "publisher must be"),
        ('{"buffer_steps": "many"}', "buffer_steps has the wrong type"),
    ],
)
def test_a_malformed_config_is_refused(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(["vllm", "serve", "m", "--kv-events-config", text], {})


# -- the prefix store


def test_only_complete_blocks_are_stored_and_a_prefix_is_stored_once() -> None:
    store = PrefixStore(BLOCK, 100)
    first = store.record(list(range(10)))  # two blocks and a tail of two
    (stored,) = first.events
    assert stored.token_ids == list(range(8)) and stored.parent_block_hash is None
    assert first.hit_tokens == 0
    again = store.record(list(range(12)))
    (more,) = again.events
    assert more.parent_block_hash == stored.block_hashes[-1]
    assert more.token_ids == [8, 9, 10, 11] and again.hit_tokens == 8
    whole = store.record(list(range(12)))
    assert whole.events == () and whole.hit_tokens == 8  # vLLM computes the last token


def test_a_block_is_the_same_only_after_the_same_prefix() -> None:
    assert block_hash_of(None, "", [1, 2]) != block_hash_of(7, "", [1, 2])
    assert block_hash_of(None, "", [1, 2]) != block_hash_of(None, "adapter", [1, 2])
    assert 0 <= block_hash_of(None, "", [1, 2]) < 2**64


def test_the_least_recently_used_leaves_are_evicted_with_a_removal_each() -> None:
    store = PrefixStore(BLOCK, 3)
    a = store.record([1] * 8).events[0]  # blocks a0, a1
    store.record([1] * 4 + [2] * 4)  # a0 again (a hit), then b1: a1 is now the oldest
    evicting = store.record([3] * 4)
    removed, stored = evicting.events
    assert msgspec.to_builtins(removed) == {
        "type": "BlockRemoved",
        "block_hashes": [a.block_hashes[1]],
        "medium": "GPU",
        "group_idx": 0,
    }
    assert stored.parent_block_hash is None and len(store) == 3


# -- the publisher, over a real socket


@pytest.fixture
def events() -> Iterator[KvEvents]:
    kv = KvEvents(_config(), capacity_blocks=64)
    try:
        yield kv
    finally:
        kv.close()


def _subscriber(context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    """A SUB that has finished its handshake with the PUB (so it misses nothing)."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.connect(endpoint)
    assert monitor.poll(5000), "no handshake with the publisher"
    sub.disable_monitor()
    monitor.close()
    time.sleep(0.2)  # the subscription itself reaches the PUB just after the handshake
    return sub


def _receive(sub: zmq.Socket[bytes]) -> list[bytes]:
    assert sub.poll(5000), "no batch published"
    return sub.recv_multipart()


def test_a_prefill_publishes_its_new_blocks_as_vllm_0_33_does(events: KvEvents) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = _subscriber(context, events.sources()["0"]["endpoint"])
    try:
        events.record(tokenize(PREFIX + "one"))
        events.record(tokenize(PREFIX + MORE))  # two more blocks on the same prefix
        first, second = _receive(sub), _receive(sub)
    finally:
        sub.close(linger=0)
        context.term()
    assert [len(first), first[0], first[1]] == [3, b"kv", (0).to_bytes(8, "big")]
    assert [len(second), second[0], second[1]] == [3, b"kv", (1).to_bytes(8, "big")]
    ts, (stored,), rank = _decode(first[2])
    assert isinstance(ts, float) and rank == 0
    assert list(stored) == STORED_KEYS
    assert stored["type"] == "BlockStored" and stored["parent_block_hash"] is None
    assert stored["token_ids"] == tokenize(PREFIX)[: 3 * BLOCK]
    assert len(stored["block_hashes"]) == 3 and stored["block_size"] == BLOCK
    assert (stored["lora_id"], stored["lora_name"], stored["medium"]) == (None, None, "GPU")
    assert stored["extra_keys"] == [None] * 3
    assert (stored["group_idx"], stored["kv_cache_spec_kind"]) == (0, "full_attention")
    _, (more,), _ = _decode(second[2])
    assert more["parent_block_hash"] == stored["block_hashes"][-1]
    assert more["token_ids"] == tokenize(PREFIX + MORE)[3 * BLOCK : 5 * BLOCK]


def _replay(endpoint: str, start: int) -> list[list[bytes]]:
    """vllm-router's replay request: a DEALER asking from ``start``, reading to the end."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    answers = []
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        while not answers or answers[-1][-2] != (-1).to_bytes(8, "big", signed=True):
            assert dealer.poll(5000), f"replay stopped after {len(answers)} answers"
            answers.append(dealer.recv_multipart())
    finally:
        dealer.close(linger=0)
        context.term()
    return answers


def test_the_replay_answers_the_buffered_batches_then_the_end_marker(events: KvEvents) -> None:
    for word in ("first", "second", "third"):
        events.record(tokenize(word * 8))
    time.sleep(0.3)  # the publisher thread has sent (and buffered) all three
    answers = _replay(events.sources()["0"]["replay_endpoint"], 1)
    assert [a[:3] for a in answers[:2]] == [
        [b"", b"kv", (1).to_bytes(8, "big")],
        [b"", b"kv", (2).to_bytes(8, "big")],
    ]
    assert _decode(answers[0][3])[1][0]["token_ids"] == tokenize("second" * 8)
    assert answers[2] == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]


def test_a_wildcard_endpoint_is_bound_on_the_engines_host_and_reported_as_given() -> None:
    kv = KvEvents(_config({**EVENTS, "endpoint": "tcp://*:0", "replay_endpoint": None}), 8)
    try:
        source = kv.sources()["0"]
        assert source["endpoint"].startswith(f"tcp://{HOST}:")
        assert source["replay_endpoint"] is None
    finally:
        kv.close()


def test_without_a_publisher_there_is_no_source() -> None:
    kv = KvEvents(_config(None), 8)
    assert kv.sources() == {} and kv.record(tokenize(PREFIX)) == 0


def test_vllm_0_11_sends_its_events_as_arrays() -> None:
    told = {**EVENTS, "publisher": "zmq"}
    kv = KvEvents(_config(told, "vllm-0.11.0"), 64)
    try:
        kv.record(tokenize(PREFIX))
        time.sleep(0.3)
        answers = _replay(kv.sources()["0"]["replay_endpoint"], 0)
    finally:
        kv.close()
    assert len(answers[0]) == 3  # 0.11's replay names no topic
    (stored,) = _decode(answers[0][2])[1]
    assert stored[:2] == ["BlockStored", stored[1]] and len(stored) == 7
    assert answers[-1] == [b"", (-1).to_bytes(8, "big", signed=True), b""]


# -- the HTTP routes


def _fake_engine(config: EngineConfig) -> Any:
    published = threading.Event()
    published.set()
    cache = SimpleNamespace(info=SimpleNamespace(num_blocks=64), usage=lambda: 0.0)
    return SimpleNamespace(
        config=config,
        cache=cache,
        metrics=engine_metrics(config.engine, config.served_name),
        identity="prefill-0",
        address=HOST,
        published=published,
        draining=False,
        stop=threading.Event(),
    )


async def _client(config: EngineConfig) -> TestClient[web.Request, web.Application]:
    app = App(_fake_engine(config), asyncio.get_running_loop())
    client = TestClient(TestServer(app.build(), host=HOST))
    await client.start_server()
    return client


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TestClient[Any, Any]]:
    monkeypatch.setenv(DEV_MODE_ENV, "1")
    client = await _client(_config(None, "vllm-0.33.0", "--served-model-name", "tiny"))
    try:
        yield client
    finally:
        await client.close()  # no publisher to close: events are not enabled here


async def test_the_routes_a_router_discovers_a_worker_with(served: TestClient[Any, Any]) -> None:
    info = await (await served.get("/server_info", params={"config_format": "json"})).json()
    assert info["vllm_config"]["model_config"]["model"] == "org/model"
    assert info["vllm_config"]["cache_config"]["block_size"] == BLOCK
    assert (await served.get("/get_server_info")).status == 404  # no such route in vLLM
    sources = await served.get("/kv_event_sources")
    assert (sources.status, await sources.json()) == (200, {})


async def test_render_and_tokenize_give_the_ids_the_prefill_caches(
    served: TestClient[Any, Any],
) -> None:
    rendered = await served.post(
        "/v1/completions/render", json={"model": "tiny", "prompt": [PREFIX, "ab"]}
    )
    answer = await rendered.json()
    assert [r["token_ids"] for r in answer] == [tokenize(PREFIX), tokenize("ab")]
    messages = [{"role": "user", "content": PREFIX}]
    chat = await (
        await served.post(
            "/v1/chat/completions/render", json={"model": "tiny", "messages": messages}
        )
    ).json()
    assert chat["token_ids"] == tokenize(f"user: {PREFIX}") and chat["features"] is None
    counted = await (await served.post("/tokenize", json={"prompt": PREFIX})).json()
    assert counted["tokens"] == tokenize(PREFIX) and counted["count"] == len(counted["tokens"])
    unknown = await served.post("/tokenize", json={"model": "other", "prompt": "x"})
    assert unknown.status == 404


async def test_the_prefix_cache_metrics_count_the_hits(served: TestClient[Any, Any]) -> None:
    for _ in range(2):
        body = {"model": "tiny", "prompt": PREFIX, "max_tokens": 1}
        assert (await served.post("/v1/completions", json=body)).status == 200
    text = await (await served.get("/metrics")).text()
    tokens = len(tokenize(PREFIX))
    assert f'vllm:prefix_cache_queries_total{{model_name="tiny"}} {2 * tokens}.0' in text
    assert (
        f'vllm:prefix_cache_hits_total{{model_name="tiny"}} {(tokens - 1) // BLOCK * BLOCK}.0'
        in text
    )


async def test_vllm_0_11_and_a_server_outside_dev_mode_lack_those_routes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DEV_MODE_ENV, raising=False)
    client = await _client(_config(None, "vllm-0.11.0"))
    try:
        for path in ("/kv_event_sources", "/server_info"):
            assert (await client.get(path)).status == 404
        render = await client.post("/v1/completions/render", json={"prompt": "x"})
        assert render.status in (404, 405)
        assert (await client.post("/tokenize", json={"prompt": "x"})).status == 200
    finally:
        await client.close()


async def test_sglang_keeps_its_server_info() -> None:
    argv = ["sglang", "serve", "--model-path", "m", "--disaggregation-mode", "prefill"]
    client = await _client(parse_args(argv, {}))
    try:
        for path in ("/server_info", "/get_server_info"):
            assert (await (await client.get(path)).json())["page_size"] == 1
        assert (await client.get("/kv_event_sources")).status == 404
        assert "vllm" not in await (await client.get("/metrics")).text()
    finally:
        await client.close()
