"""spec.router.prefillPolicy kv_aware for vLLM: the prefill engines publish the KV events
vllm-router 0.1.17 routes by (``--kv-events-config`` and the dev-mode server info it reads),
on ports opened to the router, where the release and the layout let the router read them;
elsewhere nothing is rendered and KVAwareRouting says why. The request-path tier
(tests/integration/test_routing_policies.py) runs the router against them."""

from __future__ import annotations

import json
from typing import Any

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.registry import ENGINES
from pdd_operator.engines.vllm_kv_events import DEV_MODE_ENV, KV_EVENTS_CONFIG
from pdd_operator.status.spec_conditions.kv_aware_routing import (
    condition as kv_aware_routing_condition,
)

VLLM = ENGINES["vllm"]
KV_AWARE = {"router": {"prefillPolicy": "kv_aware"}}


def spec(release: str = "0.33.0", **patch: Any) -> PDDeploymentSpec:
    return make_pdd({"engine": {"version": release}, **KV_AWARE, **patch}).spec


def events_config(s: PDDeploymentSpec, role: str) -> dict[str, Any] | None:
    args = list(VLLM.launch(s, role).args)
    if KV_EVENTS_CONFIG not in args:
        return None
    return dict(json.loads(args[args.index(KV_EVENTS_CONFIG) + 1]))


def env_names(s: PDDeploymentSpec, role: str) -> set[str]:
    return {e["name"] for e in VLLM.launch(s, role).env}


def test_prefill_engines_publish_to_a_wildcard_endpoint_with_replay() -> None:
    config = events_config(spec(), "prefill")
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # vLLM binds only a wildcard endpoint; the router puts the pod's IP in its place.
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5577",
        "topic": "kv",
    }
    assert DEV_MODE_ENV in env_names(spec(), "prefill")


def test_decode_engines_publish_nothing() -> None:
    assert events_config(spec(), "decode") is None
    assert DEV_MODE_ENV not in env_names(spec(), "decode")


def test_other_policies_render_no_events() -> None:
    plain = make_pdd({"engine": {"version": "0.33.0"}}).spec
    assert events_config(plain, "prefill") is None
    assert VLLM.router_ports(plain) == ()
    assert kv_aware_routing_condition([], plain, 1, "now") == []


def test_the_router_reaches_each_data_parallel_engines_publisher_and_replay() -> None:
    dp2 = spec(prefill={"gpusPerInstance": 2, "parallelism": {"tensor": 1, "data": 2}})
    ports = {p.name: p.port for p in VLLM.router_ports(dp2)}
    assert ports == {"kv-events": 5557, "kv-events-1": 5558, "kv-replay": 5577, "kv-replay-1": 5578}
    assert set(ports.items()) <= {(p.name, p.port) for p in VLLM.ports(dp2)}


def test_a_release_without_kv_event_sources_renders_none_and_says_so() -> None:
    old = spec("0.11.0")
    assert events_config(old, "prefill") is None
    assert VLLM.router_ports(old) == ()
    (condition,) = kv_aware_routing_condition([], old, 1, "now")
    assert (condition.status, condition.reason) == ("False", "KVEventsNotPublished")
    assert "vLLM 0.11.0 serves no /kv_event_sources" in condition.message
    assert "least loaded" in condition.message


def test_multi_node_prefill_renders_none_and_says_so() -> None:
    wide = spec(prefill={"gpusPerInstance": 8, "nodesPerInstance": 2})
    assert events_config(wide, "prefill") is None
    (condition,) = kv_aware_routing_condition([], wide, 1, "now")
    assert condition.status == "False"
    assert "choose cache_aware for multi-node prefill" in condition.message


def test_the_condition_says_where_the_events_are_published() -> None:
    (condition,) = kv_aware_routing_condition([], spec(), 4, "now")
    assert (condition.status, condition.reason) == ("True", "KVEventsPublished")
    assert "port 5557 (replay 5577)" in condition.message
    assert condition.observedGeneration == 4
