"""The engine registry against the API: one adapter per `spec.engine.type` value, and the
facts the CRD and the sidecar hold about an engine agree with its adapter."""

from __future__ import annotations

from typing import get_args

import pytest

from helpers.factories import make_pdd
from pdd_operator.api.v1alpha1 import EngineSpec, PDDeployment, PDDeploymentSpec
from pdd_operator.engines.registry import ENGINES, adapter_for, spec_rules
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_sidecar.reachability import side_channel_for

ENGINE_TYPES = get_args(EngineSpec.model_fields["type"].annotation)


def pdd_of(engine: str) -> PDDeployment:
    # Ports off their defaults, so a port taken from anywhere but the spec shows.
    kv = {"sideChannelPort": 6100, "bootstrapPort": 9100, "metadataExchange": {"mode": "sidecar"}}
    return make_pdd({"engine": {"type": engine}, "kvTransfer": kv})


def spec_of(engine: str) -> PDDeploymentSpec:
    return pdd_of(engine).spec


WITH_SIDE_CHANNEL = [e for e in ENGINE_TYPES if ENGINES[e].side_channel(spec_of(e)) is not None]


def test_every_engine_type_has_one_adapter_and_every_adapter_a_type() -> None:
    assert sorted(ENGINES) == sorted(ENGINE_TYPES)
    assert all(adapter.type == key for key, adapter in ENGINES.items())


def test_an_unknown_engine_type_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'trtllm' .*custom, sglang, vllm"):
        adapter_for("trtllm")


@pytest.mark.parametrize("engine", ENGINE_TYPES)
def test_the_side_channel_is_among_the_ports_the_engine_opens(engine: str) -> None:
    spec = spec_of(engine)
    channel = ENGINES[engine].side_channel(spec)
    opened = {port.port for port in ENGINES[engine].ports(spec)}
    assert channel is None or set(channel.ports) <= opened


@pytest.mark.parametrize("engine", ENGINE_TYPES)
def test_the_crd_refuses_engine_exchange_exactly_where_there_is_no_side_channel(
    engine: str,
) -> None:
    """A new engine without a side channel of its own must refuse it in its own rules."""
    rules = [r for r, _ in spec_rules() if "metadataExchange.mode != 'engine'" in r]
    refused = any(f"self.engine.type != '{engine}'" in rule for rule in rules)
    assert refused == (ENGINES[engine].side_channel(spec_of(engine)) is None)


@pytest.mark.parametrize("engine", WITH_SIDE_CHANNEL)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_sidecar_reads_the_built_in_channels_as_their_adapters_declare(
    engine: str, role: str
) -> None:
    """For the built-in engines the serving roles are not rendered (their pods stay as they
    were): the contract's table must say what the adapter says."""
    channel = ENGINES[engine].side_channel(spec_of(engine))
    assert channel is not None
    sts = next(
        o
        for o in render_children(pdd_of(engine), RenderContext())
        if o["metadata"]["name"] == f"llama-{role}" and o["kind"] == "StatefulSet"
    )
    sidecar = next(
        c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "nixl-sidecar"
    )
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert "PDD_SIDE_CHANNEL_ROLES" not in env
    ports = tuple(int(p) for p in env["PDD_SIDE_CHANNEL_PORTS"].split(","))
    seen = side_channel_for(env["PDD_SIDE_CHANNEL"], role, ports)
    assert seen is not None
    assert seen.ports == channel.ports
    assert seen.target_roles == set(channel.served_by) - {role}


@pytest.mark.parametrize("engine", ENGINE_TYPES)
def test_each_engines_own_rules_apply_to_its_deployments_only(engine: str) -> None:
    """An adapter's CEL rules let every other engine's deployment through, so one engine's
    rules never refuse another's spec: each is a disjunction with the engine's guard as one
    of its top-level terms (`self.engine.type != ... || ...`, or after a field's own
    condition)."""
    guard = f"self.engine.type != '{engine}'"
    for rule, message in ENGINES[engine].spec_rules():
        terms = [term.strip() for term in rule.split(" || ")]
        assert guard in terms, message


def test_the_crd_carries_the_apis_rules_and_every_engines() -> None:
    rules = spec_rules()
    for adapter in ENGINES.values():
        assert set(adapter.spec_rules()) <= set(rules), adapter.type
    assert len(rules) == len(set(rules))  # no rule twice
