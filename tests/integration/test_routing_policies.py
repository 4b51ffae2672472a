"""spec.router's routing policy, through the real routers: two prefills and a decode (the
reference engine, a test double of vLLM/SGLang, each with its pdd sidecar), and the router
started with the policy flags the operator renders (engines/base.py ``policy_args``).

Requests that share a long prefix should reach the prefill that already holds it under
cache_aware (the routers' default) and vllm-router's kv_aware (fed by the KV events the
prefills publish, engines/vllm_kv_events.py), and spread over both under round_robin. Each
case prints its prefix hit rate: the share of requests that reached the prefill the prefix's
first request went to. No Kubernetes; all on 127.93.0.0/24; every process stopped at teardown.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.refengine import (
    Proc,
    Procs,
    free_port,
    http,
    rendered_engine_argv,
    rendered_engine_values,
    running,
)
from pdd_operator.api.v1alpha1 import RouterSpec
from pdd_operator.engines.base import policy_args
from pdd_operator.engines.registry import ENGINES

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
    policy: str
    routers: tuple[str, ...]  # replicas of one router, as spec.router.replicas renders them


def router_spec(policy: str) -> dict[str, str]:
    """``policy`` for both roles; kv_aware routes prefill alone (the CRD takes it as
    prefillPolicy only: decode pods publish no KV events)."""
    return {"prefillPolicy": policy} if policy == "kv_aware" else {"policy": policy}


def _engine(
    procs: Procs, engine: str, role: str, pod: str, ip: str, sidecar: str, boot: int, policy: str
) -> tuple[Proc, str]:
    port = free_port(ip)
    router = router_spec(policy)
    # Each pod's KV event ports are its own: on 127.93.0.x the prefills differ by address.
    argv = rendered_engine_argv(engine, role, ip, port, boot, router=router)
    env = {
        **rendered_engine_values(engine, role, router),  # VLLM_SERVER_DEV_MODE under kv_aware
        "VLLM_NIXL_SIDE_CHANNEL_HOST": ip,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(ip)),
        "PDD_REFENGINE_KV_TIMEOUT_S": "10",
        # The reference image of the release rendered (its tag picks what the engine serves:
        # vLLM 0.33.0's /kv_event_sources and render routes).
        "PDD_REFENGINE_IMAGE_TAG": f"{engine}-{newest_release(engine)}",
    }
    return procs.engine(pod, argv, sidecar, **env), f"http://{ip}:{port}"


def newest_release(engine: str) -> str:
    versions = ENGINES[engine].versions
    assert versions is not None
    return str(versions.newest)


def _start(procs: Procs, engine: str, policy: str, routers: int = 1) -> Fleet:
    """Two prefill pods and one decode pod, then ``routers`` replicas of the router with
    ``policy``."""
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
        _engine(
            procs, engine, "prefill", f"{engine}-prefill-{i}", ip, sidecars[i], boots[i], policy
        )
        for i, ip in enumerate(PREFILL_IPS)
    ]
    engines.append(
        _engine(procs, engine, "decode", f"{engine}-decode-0", DECODE_IP, sidecars[2], 0, policy)
    )
    for proc, url in engines:
        procs.wait_healthy(proc, url)
    prefills = [url for _, url in engines[:2]]
    flags = policy_args(RouterSpec(**router_spec(policy)))  # as the operator renders them
    workers = list(zip(prefills, boots, strict=True))
    urls = [procs.router(engine, ROUTER_IP, workers, engines[2][1], flags) for _ in range(routers)]
    if policy == "kv_aware":
        _let_the_routers_subscribe(urls)
    return Fleet(engine, policy, tuple(urls))


CASES = [
    "vllm-cache_aware",
    "vllm-kv_aware",
    "vllm-round_robin",
    "sglang-cache_aware",
    "sglang-round_robin",
]


@pytest.fixture(params=CASES)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    engine, policy = request.param.split("-")
    with running(tmp_path) as procs:
        yield _start(procs, engine, policy)


# Two router replicas: each cache_aware tree holds only what its own replica sent, while
# kv_aware reads where the KV is from the prefills themselves.
REPLICA_CASES = ["vllm-cache_aware", "vllm-kv_aware", "sglang-cache_aware"]


@pytest.fixture(params=REPLICA_CASES)
def two_routers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    engine, policy = request.param.split("-")
    with running(tmp_path) as procs:
        yield _start(procs, engine, policy, routers=2)


def _prefill_of(router: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    status, raw = http("POST", f"{router}/v1/completions", body, timeout=60)
    assert status == 200, raw
    served = json.loads(raw)["pdd_refengine"]
    assert served["kv_verified"], served
    return str(served["prefill"])


# vllm-router 0.1.17 subscribes to a prefill's KV events on the first request it routes after
# the pod joined, within its one-second refresh tick (src/routers/http/pd_kv_state.rs): a
# running deployment has long passed that; a fresh fleet gets one unrelated request first.
SUBSCRIBE_S = 3.0


def _let_the_routers_subscribe(routers: list[str]) -> None:
    for router in routers:
        _prefill_of(router, "An unrelated opening request.")
    time.sleep(SUBSCRIBE_S)


@dataclass(frozen=True)
class Hits:
    hits: int
    total: int
    used: Counter[str]  # requests per prefill

    @property
    def rate(self) -> float:
        return self.hits / self.total

    def __str__(self) -> str:
        counts = f"({self.hits}/{self.total}), prefills {dict(self.used)}"
        return f"prefix hit rate {self.rate:.2f} {counts}"


def _hit_rate(first_router: str, later_router: str) -> Hits:
    """Each prefix's first request at once through ``first_router`` (users arrive together),
    then its other requests one by one through ``later_router``: how many of those reached
    the prefill the prefix's first request went to."""
    with ThreadPoolExecutor(len(PREFIXES)) as pool:
        firsts = list(pool.map(lambda p: _prefill_of(first_router, p + ENDINGS[0]), PREFIXES))
    used = Counter(firsts)
    hits = 0
    for prefix, first in zip(PREFIXES, firsts, strict=True):
        for ending in ENDINGS[1:]:
            prefill = _prefill_of(later_router, prefix + ending)
            used[prefill] += 1
            hits += prefill == first
    return Hits(hits, len(PREFIXES) * (len(ENDINGS) - 1), used)


def test_a_shared_prefix_reaches_its_prefill_under_cache_aware_and_spreads_otherwise(
    fleet: Fleet,
) -> None:
    """Through one router: under cache_aware and kv_aware a prefix's later requests go where
    its first went; under round_robin they alternate over the two prefills."""
    (router,) = fleet.routers
    measured = _hit_rate(router, router)
    print(f"{fleet.engine} {fleet.policy}: {measured}")
    if fleet.policy in ("cache_aware", "kv_aware"):
        assert measured.rate >= 0.9, str(measured)
    else:
        assert len(measured.used) == 2 and measured.rate <= 0.75, str(measured)


def test_a_prefix_another_router_replica_sent_reaches_its_prefill_under_kv_aware(
    two_routers: Fleet,
) -> None:
    """Each prefix's first request through one router replica, its others through the
    second: kv_aware knows where the KV is from the prefills' events; a cache_aware replica
    knows only what it sent itself (its rate is printed, for docs/engines.md)."""
    first, later = two_routers.routers
    measured = _hit_rate(first, later)
    print(f"{two_routers.engine} {two_routers.policy}, two router replicas: {measured}")
    if two_routers.policy == "kv_aware":
        assert measured.rate >= 0.9, str(measured)
