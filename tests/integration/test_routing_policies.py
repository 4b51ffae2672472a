"""spec.router's routing policy, through the real routers: two prefills and a decode (the
reference engine, a test double of vLLM/SGLang, each with its pdd sidecar), and the router
started with the policy flags the operator renders (engines/base.py ``policy_args``).

Requests that share a long prefix should reach the prefill that already holds it under
cache_aware (the routers' default), and spread over both under round_robin. Each case prints
its prefix hit rate: the share of requests that reached the prefill the prefix's first request
went to. No Kubernetes; all on 127.93.0.0/24; every process stopped at teardown.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.refengine import Proc, Procs, free_port, http, rendered_engine_argv, running
from pdd_operator.api.v1alpha1 import RouterSpec
from pdd_operator.engines.base import policy_args

PREFILL_IPS = ("127.93.0.1", "127.93.0.4")
DECODE_IP, ROUTER_IP = "127.93.0.2", "127.93.0.3"
# Four long prefixes (about 500 bytes each), each asked with four different endings.
# They differ from their first word on: the routers' trees match prefixes character by
# character, and a shared opening would count as a partial hit.
WORDS = ("Alpha", "Bravo", "Charlie", "Delta")
PREFIXES = [
    f"{word} report. " + f"{word} section of a long shared context. " * 12 for word in WORDS
]
ENDINGS = ["Summarise it.", "List the names.", "Translate it.", "What comes next?"]


@dataclass(frozen=True)
class Fleet:
    engine: str
    router: str


def _engine(
    procs: Procs, engine: str, role: str, pod: str, ip: str, sidecar: str, boot: int
) -> tuple[Proc, str]:
    port = free_port(ip)
    argv = rendered_engine_argv(engine, role, ip, port, boot)
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": ip,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(ip)),
        "PDD_REFENGINE_KV_TIMEOUT_S": "10",
    }
    return procs.engine(pod, argv, sidecar, **env), f"http://{ip}:{port}"


def _start(procs: Procs, engine: str, policy: str) -> Fleet:
    """Two prefill pods and one decode pod, then the router with ``policy`` for both roles."""
    ports = [free_port(ip) for ip in PREFILL_IPS]
    decode_port = free_port(DECODE_IP)
    prefill_peers = ",".join(f"prefill={ip}:{p}" for ip, p in zip(PREFILL_IPS, ports, strict=True))
    sidecars = [
        procs.sidecar(
            "prefill", ip, port, f"decode={DECODE_IP}:{decode_port}", wait=False, pod=f"prefill-{i}"
        )
        for i, (ip, port) in enumerate(zip(PREFILL_IPS, ports, strict=True))
    ]
    sidecars.append(procs.sidecar("decode", DECODE_IP, decode_port, prefill_peers, wait=False))
    for proc, url in zip(procs.started[-3:], sidecars, strict=True):
        procs.wait_sidecar(proc, url)
    boots = [free_port(ip) for ip in PREFILL_IPS]
    engines = [
        _engine(procs, engine, "prefill", f"{engine}-prefill-{i}", ip, sidecars[i], boots[i])
        for i, ip in enumerate(PREFILL_IPS)
    ]
    engines.append(
        _engine(procs, engine, "decode", f"{engine}-decode-0", DECODE_IP, sidecars[2], 0)
    )
    for proc, url in engines:
        procs.wait_healthy(proc, url)
    prefills = [url for _, url in engines[:2]]
    flags = policy_args(RouterSpec(policy=policy))  # as the operator renders them
    router = procs.router(
        engine, ROUTER_IP, list(zip(prefills, boots, strict=True)), engines[2][1], flags
    )
    return Fleet(engine, router)


# vllm-router 0.1.17's cache_aware, measured here: once load sends a prefix's first request to
# the other prefill, its later requests still go to the first prefill (hit rate 0.75, three
# runs alike); smg 1.13.0 keeps each prefix where it went (1.00). Strict: it fails when a
# vllm-router release fixes it, and the pin's bump must then drop the mark.
VLLM_CACHE_AWARE_GAP = pytest.mark.xfail(
    strict=True, reason="vllm-router 0.1.17 cache_aware in PD mode: prefix hit rate 0.75"
)
CASES = [
    pytest.param("vllm-cache_aware", marks=VLLM_CACHE_AWARE_GAP),
    "vllm-round_robin",
    "sglang-cache_aware",
    "sglang-round_robin",
]


@pytest.fixture(params=CASES)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Fleet, str]]:
    engine, policy = request.param.split("-")
    with running(tmp_path) as procs:
        yield _start(procs, engine, policy), policy


def _prefill_of(router: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    status, raw = http("POST", f"{router}/v1/completions", body, timeout=60)
    assert status == 200, raw
    served = json.loads(raw)["pdd_refengine"]
    assert served["kv_verified"], served
    return str(served["prefill"])


def test_a_shared_prefix_reaches_its_prefill_under_cache_aware_and_spreads_otherwise(
    fleet: tuple[Fleet, str],
) -> None:
    """Each prefix's first request at once (users arrive together), then its other requests
    one by one: under cache_aware they go where its first went; under round_robin they
    alternate over the two prefills."""
    d, policy = fleet
    with ThreadPoolExecutor(len(PREFIXES)) as pool:
        firsts = list(pool.map(lambda p: _prefill_of(d.router, p + ENDINGS[0]), PREFIXES))
    used = Counter(firsts)
    hits = 0
    for prefix, first in zip(PREFIXES, firsts, strict=True):
        for ending in ENDINGS[1:]:
            prefill = _prefill_of(d.router, prefix + ending)
            used[prefill] += 1
            hits += prefill == first
    total = len(PREFIXES) * (len(ENDINGS) - 1)
    rate = hits / total
    print(
        f"{d.engine} {policy}: prefix hit rate {rate:.2f} ({hits}/{total}), prefills {dict(used)}"
    )
    if policy == "cache_aware":
        assert rate >= 0.9, (rate, used)
    else:
        assert len(used) == 2 and rate <= 0.75, (rate, used)
