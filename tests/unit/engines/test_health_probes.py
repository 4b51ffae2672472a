"""The engine container's readiness and startup probes: each engine's health endpoint, with a
timeout longer than a healthy engine takes to answer there (the adapter's HealthCheck).

What the endpoints take (docs/engines.md, "Probes"): vLLM's /health answers from a flag;
SGLang's /health (0.5.4 and 0.5.23) runs a one-token generation and sleeps 1 s before it first
looks for the answer, so a healthy SGLang answers after 1.0 s at the earliest; from 0.5.20 the
probes use its /ready, a flag.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.base import HealthCheck
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.ranks import leader_only_probe

PROBES = ("readinessProbe", "startupProbe")
# Where a probe sets no timeoutSeconds, the kubelet waits this long.
KUBELET_DEFAULT_TIMEOUT_S = 1
ENGINE_SPECS: dict[str, dict[str, Any]] = {
    "vllm": {"type": "vllm", "image": "vllm/vllm-openai:v0.33.0"},
    "sglang": {"type": "sglang", "image": "lmsysorg/sglang:v0.5.23"},
    "sglang-0.5.4": {"type": "sglang", "image": "lmsysorg/sglang:v0.5.4"},
    "custom": {"type": "custom", "image": "x/y:1", "command": ["my-engine"]},
}


def engine_container(engine: str, **patch: Any) -> dict[str, Any]:
    pdd = make_pdd({"engine": ENGINE_SPECS[engine], **patch})
    # The role's StatefulSet, or its first instance's where instances span nodes.
    prefill = ("llama-prefill", "llama-prefill-0")
    statefulset = next(
        o
        for o in render_children(pdd, RenderContext())
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] in prefill
    )
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "engine")


def waited_s(probe: dict[str, Any]) -> int:
    return int(probe.get("timeoutSeconds", KUBELET_DEFAULT_TIMEOUT_S))


def leaders_answer_s(probe: dict[str, Any]) -> int:
    """How long the rank-0 check's own request waits for the engine's answer."""
    script = probe["exec"]["command"][2]
    found = re.search(r"urllib\.request\.urlopen\(.*/(health|ready).*, timeout=(\d+)\)", script)
    assert found, probe
    return int(found[2])


@pytest.mark.parametrize(
    ("engine", "path", "earliest_healthy_answer_s"),
    [
        ("vllm", "/health", 0.0),  # api_server.py `health`: check_health, a flag
        ("sglang-0.5.4", "/health", 1.0),  # http_server.py `health_generate`: sleep(1) first
        ("sglang", "/ready", 0.0),  # 0.5.23 http_server.py `ready`: is_ready(), a flag
        ("custom", "/health", 0.0),
    ],
)
def test_the_probes_wait_longer_than_a_healthy_engine_takes_to_answer(
    engine: str, path: str, earliest_healthy_answer_s: float
) -> None:
    container = engine_container(engine)
    for kind in PROBES:
        probe = container[kind]
        assert probe["httpGet"] == {"path": path, "port": "http"}, kind
        assert waited_s(probe) > earliest_healthy_answer_s, (kind, probe)


@pytest.mark.parametrize(
    ("engine", "timeout_s"),
    [
        ("vllm", 1),  # the kubelet's default, as before, now said
        ("sglang", 5),  # smg's own --health-check-timeout-secs for the same endpoint
        ("sglang-0.5.4", 5),
        ("custom", 1),
    ],
)
def test_each_engine_renders_its_adapters_probe_timeout(engine: str, timeout_s: int) -> None:
    container = engine_container(engine)
    assert [container[kind]["timeoutSeconds"] for kind in PROBES] == [timeout_s, timeout_s]


@pytest.mark.parametrize(
    ("engine", "answer_s", "deadline_s"),
    [("vllm", 5, 10), ("sglang", 5, 10), ("sglang-0.5.4", 5, 10)],
)
def test_the_leaders_check_of_a_multi_node_instance_gives_the_engine_as_long(
    engine: str, answer_s: int, deadline_s: int
) -> None:
    nodes = {"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}
    container = engine_container(engine, prefill=nodes, decode=nodes)
    for kind in PROBES:
        probe = container[kind]
        assert (leaders_answer_s(probe), probe["timeoutSeconds"]) == (answer_s, deadline_s), kind


@pytest.mark.parametrize(
    ("adapter_timeout_s", "answer_s", "deadline_s"),
    [
        (1, 5, 10),  # never stricter than the check has been
        (5, 5, 10),
        (30, 30, 35),  # an engine that asks for longer gets it, python3's start on top
    ],
)
def test_the_leaders_check_follows_the_adapters_timeout(
    adapter_timeout_s: int, answer_s: int, deadline_s: int
) -> None:
    probe = leader_only_probe(HealthCheck(timeout_s=adapter_timeout_s), 8000, 3)
    assert (leaders_answer_s(probe), probe["timeoutSeconds"]) == (answer_s, deadline_s)
