"""The reference engine (a test double of vLLM/SGLang, no model) behind the real routers.

No Kubernetes: two "pods" on their own loopback addresses, each a pdd sidecar (static peers)
and a reference engine started as the operator renders the engine (through the image shims),
and the real router in static PD mode in front. Real KV bytes move prefill -> decode with
NIXL (UCX on loopback); the decode checks every byte. Every process is stopped at teardown.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from helpers.factories import make_pdd
from helpers.refengine import (
    Procs,
    free_port,
    http,
    metric,
    rendered_engine_argv,
    running,
)
from pdd_operator.engines.registry import ENGINES
from pdd_refengine.kv_params import RemotePrefill, protocol_generation

# 127.92: a block no other module uses (the docs tier takes 127.91), for parallel workers.
PREFILL_IP, DECODE_IP, ROUTER_IP = "127.92.0.1", "127.92.0.2", "127.92.0.3"
BYTES_PER_TOKEN = 256  # the reference engine's default layout (model not in its table)
PROMPT = "The quick brown fox jumps over the lazy dog, " * 5  # 225 bytes: 57 tokens


@dataclass
class Deployment:
    engine: str
    prefill: str
    decode: str
    router: str
    procs: Procs
    release: str = ""
    push: bool = False  # vLLM's push connector (both roles in the host's PID namespace)
    bootstrap: int = 0  # SGLang: the prefill's bootstrap port


def _tokens(prompt: str) -> int:
    return -(-len(prompt.encode()) // 4)


def _router_version(distribution: str) -> str:
    return f"{distribution} {importlib.metadata.version(distribution)}"


def _start_pair(
    procs: Procs,
    engine: str,
    release: str,
    host_pid: bool = False,
    adapters: tuple[dict[str, Any], ...] = (),
) -> tuple[str, str, int]:
    sc_p, sc_d = free_port(PREFILL_IP), free_port(DECODE_IP)
    # Both sidecars, then both engines, start at once and are waited for together.
    p_side = procs.sidecar("prefill", PREFILL_IP, sc_p, f"decode={DECODE_IP}:{sc_d}", wait=False)
    d_side = procs.sidecar("decode", DECODE_IP, sc_d, f"prefill={PREFILL_IP}:{sc_p}", wait=False)
    for proc, url in zip(procs.started[-2:], (p_side, d_side), strict=True):
        procs.wait_sidecar(proc, url)
    bootstrap = free_port(PREFILL_IP)
    started = []
    for role, ip, sidecar in (("prefill", PREFILL_IP, p_side), ("decode", DECODE_IP, d_side)):
        port = free_port(ip)
        argv = rendered_engine_argv(engine, role, ip, port, bootstrap, release, host_pid, adapters)
        env = {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": ip,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(ip)),
            "PDD_REFENGINE_KV_TIMEOUT_S": "10",
            # The reference image of that release (its tag picks the KV protocol it speaks).
            "PDD_REFENGINE_IMAGE_TAG": f"{engine}-{release}",
        }
        proc = procs.engine(f"{engine}-{role}-0", argv, sidecar, **env)
        started.append((proc, f"http://{ip}:{port}"))
    for proc, url in started:
        procs.wait_healthy(proc, url)
    return started[0][1], started[1][1], bootstrap


def _start_router(procs: Procs, engine: str, prefill: str, decode: str, bootstrap: int) -> str:
    print(f"router: {_router_version('vllm-router' if engine == 'vllm' else 'smg')}")
    return procs.router(engine, ROUTER_IP, [(prefill, bootstrap)], decode)


# Each engine at both ends of its supported range: the wiring the operator renders for that
# release, and (vLLM) the kv_transfer_params generation the release speaks (pdd_refengine
# kv_params: 0.33's per-group block ids and remote_request_id), through the real router;
# `-hostpid`: both roles in the host's PID namespace, where vLLM gets the push connector.
RELEASES = ["vllm-0.33.0", "vllm-0.33.0-hostpid", "vllm-0.11.0", "sglang-0.5.23", "sglang-0.5.4"]


@pytest.fixture(params=RELEASES)
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    engine, release, *variant = request.param.split("-")
    with running(tmp_path) as procs:
        prefill, decode, bootstrap = _start_pair(procs, engine, release, variant == ["hostpid"])
        router = _start_router(procs, engine, prefill, decode, bootstrap)
        push = variant == ["hostpid"] and engine == "vllm"
        yield Deployment(engine, prefill, decode, router, procs, release, push, bootstrap)


def _complete(url: str, body: dict[str, object]) -> dict[str, object]:
    status, raw = http("POST", f"{url}/v1/completions", body, timeout=60)
    assert status == 200, raw
    return json.loads(raw)  # type: ignore[no-any-return]


def _stream(url: str, body: dict[str, object]) -> list[dict[str, object]]:
    status, raw = http("POST", f"{url}/v1/completions", {**body, "stream": True}, timeout=60)
    assert status == 200, raw
    events = [
        line[len("data: ") :] for line in raw.decode().splitlines() if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]", raw
    return [json.loads(e) for e in events[:-1]]


def test_completions_move_verified_kv_through_the_router(deployment: Deployment) -> None:
    d = deployment
    expected_bytes = _tokens(PROMPT) * BYTES_PER_TOKEN
    answer = _complete(d.router, {"model": "tiny", "prompt": PROMPT, "max_tokens": 7})
    choice = answer["choices"][0]  # type: ignore[index]
    assert len(choice["text"].split()) == 7, answer
    ext = answer.get("pdd_refengine")
    print(f"{d.engine}: pdd_refengine = {ext}")
    assert ext is not None and ext.pop("kv_seconds") > 0, ext
    addresses = (ext.pop("prefill_address"), ext.pop("decode_address"))
    assert addresses == (urlparse(d.prefill).hostname, urlparse(d.decode).hostname), ext
    assert ext == {
        "prefill": f"{d.engine}-prefill-0",
        "decode": f"{d.engine}-decode-0",
        "kv_bytes": expected_bytes,
        "kv_verified": True,
    }
    assert metric(d.decode, "pdd_refengine_kv_bytes_verified_total") == expected_bytes

    chunks = _stream(d.router, {"model": "tiny", "prompt": PROMPT + "!", "max_tokens": 5})
    texts = [c["choices"][0]["text"] for c in chunks if c.get("choices")]  # type: ignore[index]
    assert len("".join(texts).split()) == 5, chunks
    assert metric(d.decode, "pdd_refengine_kv_bytes_verified_total") == (
        expected_bytes + _tokens(PROMPT + "!") * BYTES_PER_TOKEN
    )
    assert metric(d.decode, "pdd_refengine_kv_verify_failures_total") == 0
    # The latencies the dashboards chart, in the engine's own names: two first tokens, and
    # 6 + 4 steps after them (the reference engine takes no step time here).
    prefix = "vllm" if d.engine == "vllm" else "sglang"
    assert metric(d.decode, f"{prefix}:time_to_first_token_seconds_count") == 2
    assert metric(d.decode, f"{prefix}:inter_token_latency_seconds_count") == 6 + 4


def test_same_prompt_same_tokens_and_other_prompts_differ(deployment: Deployment) -> None:
    d = deployment
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8}
    first = _complete(d.router, body)["choices"][0]["text"]  # type: ignore[index]
    again = _complete(d.router, body)["choices"][0]["text"]  # type: ignore[index]
    other = _complete(d.router, {**body, "prompt": "another prompt"})["choices"][0]["text"]  # type: ignore[index]
    assert first == again and first != other


def test_corrupted_kv_is_refused_by_the_decode_quickly(deployment: Deployment) -> None:
    """The prefill flips one byte of the KV it sends (the reference engine's fault field)."""
    d = deployment
    start = time.monotonic()
    if d.engine == "vllm":  # by hand: the prefill's answer goes to the decode unchanged
        status, raw = http(
            "POST",
            f"{d.prefill}/v1/completions",
            {
                "prompt": PROMPT,
                "max_tokens": 1,
                "pdd_refengine_fault": "corrupt_kv",
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            },
        )
        assert status == 200, raw
        params = json.loads(raw)["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_block_ids"]
        body = {"prompt": PROMPT, "max_tokens": 4, "kv_transfer_params": params}
        status, raw = http("POST", f"{d.decode}/v1/completions", body)
        assert status == 502 and b"failed verification" in raw, raw
    else:  # through smg, which retries the pair: every attempt fails the check
        body = {
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 3,
            "pdd_refengine_fault": "corrupt_kv",
        }
        status, raw = http("POST", f"{d.router}/v1/completions", body, timeout=30)
        assert status >= 500, raw
    assert time.monotonic() - start < 15
    assert (metric(d.decode, "pdd_refengine_kv_verify_failures_total") or 0) >= 1
    assert metric(d.decode, "pdd_refengine_kv_bytes_verified_total") == 0


def test_an_unreachable_prefill_is_an_error_not_a_hang(deployment: Deployment) -> None:
    d = deployment
    dead_port = free_port(PREFILL_IP)
    start = time.monotonic()
    if d.engine == "vllm":
        # A prefill's answer in the release's own shape, naming a side channel nothing serves.
        gone = RemotePrefill((0,), "gone", PREFILL_IP, dead_port, 1, request_id="req-gone")
        params = gone.to_params(protocol_generation(f"vllm-{d.release}"))
        if d.push:
            params["transfer_mode"] = "push"
        body: dict[str, object] = {"prompt": "hi", "max_tokens": 2, "kv_transfer_params": params}
    else:
        body = {
            "prompt": "hi",
            "max_tokens": 2,
            "bootstrap_host": PREFILL_IP,
            "bootstrap_port": dead_port,
            "bootstrap_room": 12345,
        }
    status, raw = http("POST", f"{d.decode}/v1/completions", body, timeout=30)
    assert status == 502, raw
    assert b"cannot reach" in raw
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("deployment", ["sglang-0.5.23", "sglang-0.5.4"], indirect=True)
def test_a_prefill_that_cannot_send_fails_the_decode_at_once(deployment: Deployment) -> None:
    """The prefill's failure (here: the decode's pages cannot hold its prompt) comes back
    to the decode as SGLang's status message, with the reason, not at its timeout."""
    d = deployment
    room = {"bootstrap_host": PREFILL_IP, "bootstrap_port": d.bootstrap, "bootstrap_room": 4242}
    legs = [
        (d.prefill, {"prompt": PROMPT, "max_tokens": 1, **room}),
        (d.decode, {"prompt": "hi", "max_tokens": 2, **room}),
    ]
    start = time.monotonic()
    with ThreadPoolExecutor(len(legs)) as pool:
        calls = [pool.submit(http, "POST", f"{url}/v1/completions", body) for url, body in legs]
        (prefill_status, prefill_raw), (decode_status, decode_raw) = [c.result() for c in calls]
    assert prefill_status == 502 and b"blocks" in prefill_raw, prefill_raw
    assert decode_status == 502 and b"the prefill could not send the KV" in decode_raw, decode_raw
    assert b"blocks" in decode_raw  # the prefill's reason, as it sent it
    assert time.monotonic() - start < 5


# spec.model.adapters as the engines get them: a Hub adapter and one on a volume.
ADAPTERS = (
    {"name": "sql", "source": {"huggingFace": {"repo": "test-org/tiny-sql-lora"}}},
    {"name": "ner", "source": {"pvc": {"claimName": "adapters"}}},
)


@pytest.fixture(params=["vllm-0.33.0", "sglang-0.5.23"])
def lora_deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    engine, release = request.param.split("-")
    with running(tmp_path) as procs:
        prefill, decode, bootstrap = _start_pair(procs, engine, release, adapters=ADAPTERS)
        router = _start_router(procs, engine, prefill, decode, bootstrap)
        yield Deployment(engine, prefill, decode, router, procs, release, bootstrap=bootstrap)


def _lora_requests(url: str, adapter: str) -> float:
    text = http("GET", f"{url}/metrics")[1].decode()
    series = f'pdd_refengine_lora_requests_total{{adapter="{adapter}"}}'
    values = [line.rpartition(" ")[2] for line in text.splitlines() if line.startswith(series)]
    return float(values[0]) if values else 0.0


def test_a_request_for_an_adapter_reaches_engines_that_loaded_it_through_the_router(
    lora_deployment: Deployment,
) -> None:
    """The request fields the operator reports for an adapter (status.adapters: vLLM its
    name as the `model`, SGLang the served model and `lora_path`) go through the real router
    to a prefill and a decode that both loaded it from the flags the operator renders; an
    adapter no engine loaded is refused as the engine refuses it, and the served name still
    gets the base model."""
    d = lora_deployment
    model = {"name": "m", "servedName": "tiny", "adapters": list(ADAPTERS)}
    spec = make_pdd({"engine": {"type": d.engine}, "model": model}).spec
    fields = ENGINES[d.engine].adapter_request_fields(spec, spec.model.adapters[0])
    answer = _complete(d.router, {**fields, "prompt": PROMPT, "max_tokens": 3})
    assert answer["pdd_refengine"]["kv_verified"], answer  # type: ignore[index]
    assert (_lora_requests(d.prefill, "sql"), _lora_requests(d.decode, "sql")) == (1, 1)

    _complete(d.router, {"model": "tiny", "prompt": PROMPT, "max_tokens": 3})
    assert (_lora_requests(d.prefill, "sql"), _lora_requests(d.decode, "sql")) == (1, 1)

    unknown = {"model": "nope"} if d.engine == "vllm" else {"model": "tiny", "lora_path": "nope"}
    body = {**unknown, "prompt": PROMPT, "max_tokens": 3}
    status, raw = http("POST", f"{d.router}/v1/completions", body, timeout=60)
    print(f"{d.engine}: a request for adapter {unknown} through the router: {status} {raw[:160]!r}")
    assert status == (404 if d.engine == "vllm" else 400), raw

    models = json.loads(http("GET", f"{d.decode}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["tiny", "sql", "ner"]
