"""An engine added as one adapter, registered in the render context only: every child that
depends on the engine (container, Services, NetworkPolicy, sidecar env, router) follows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.factories import make_pdd
from helpers.netpol import Pod, ingress_allowed, pod_from_workload
from pdd_contract.ports import SGLANG_BOOTSTRAP_PORT, VLLM_SIDE_CHANNEL_BASE_PORT
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.registry import ENGINES
from pdd_operator.planning.kv_layout import engine_descriptor_bytes
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.router import router_discovery
from pdd_sidecar.cli import _parser, build_config
from pdd_sidecar.reachability import side_channel_for
from unit.engines.fake_engine import ADAPTER, KV_PORT, METADATA_PORT

CTX = RenderContext(engines={**ENGINES, ADAPTER.type: ADAPTER})
SIDECAR_PORT = CTX.settings.sidecar_port


def fake_pdd(spec_patch: dict[str, Any] | None = None) -> PDDeployment:
    """A PDDeployment of the fake engine. The CRD's enum has no `fake`, so the type is set
    past validation, as a new engine's enum value would let it through."""
    patch = {"kvTransfer": {"metadataExchange": {"mode": "sidecar"}}, **(spec_patch or {})}
    pdd = make_pdd(patch)
    engine = pdd.spec.engine.model_copy(update={"type": ADAPTER.type})
    return pdd.model_copy(update={"spec": pdd.spec.model_copy(update={"engine": engine})})


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def pod_container(objs: list[dict[str, Any]], role: str, name: str) -> dict[str, Any]:
    pod = find(objs, "StatefulSet", f"llama-{role}")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture(scope="module")
def children() -> list[dict[str, Any]]:
    return render_children(fake_pdd(), CTX)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_engine_container_is_the_adapters(children: list[dict[str, Any]], role: str) -> None:
    engine = pod_container(children, role, "engine")
    assert engine["command"][:2] == ["/bin/sh", "-c"]  # still sources the preflight env file
    assert engine["args"] == ["fake-engine", "serve", "--role", role, "--gpus", "2"]
    assert env_of(engine)["FAKE_ROLE"] == role
    assert [(p["name"], p["containerPort"]) for p in engine["ports"]] == [
        ("http", 8000),
        ("fake-kv", KV_PORT),
        ("fake-meta", METADATA_PORT),
    ]
    assert engine["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert engine["startupProbe"]["httpGet"]["path"] == "/ready"
    assert engine["startupProbe"]["failureThreshold"] == 30
    assert (
        engine["readinessProbe"]["timeoutSeconds"] == engine["startupProbe"]["timeoutSeconds"] == 7
    )


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_role_service_has_the_adapters_ports(children: list[dict[str, Any]], role: str) -> None:
    service = find(children, "Service", f"llama-{role}")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http", 8000),
        ("fake-kv", KV_PORT),
        ("fake-meta", METADATA_PORT),
        ("sidecar", SIDECAR_PORT),
    ]


def test_the_network_policy_opens_the_adapters_ports_to_the_deployment_only(
    children: list[dict[str, Any]],
) -> None:
    """...and to its router pods the HTTP port and the adapter's router ports."""
    policies = [o for o in children if o["kind"] == "NetworkPolicy"]
    prefill, decode = (
        pod_from_workload(find(children, "StatefulSet", f"llama-{role}"))
        for role in ("prefill", "decode")
    )
    router = pod_from_workload(find(children, "Deployment", "llama-router"))
    for port in (KV_PORT, METADATA_PORT, SIDECAR_PORT):
        assert ingress_allowed(policies, prefill, decode, port)
        assert ingress_allowed(policies, decode, prefill, port)
        assert ingress_allowed(policies, router, decode, port) is (port == KV_PORT), port
        assert not ingress_allowed(policies, Pod("debug", {}, "team-a"), decode, port)
    assert ingress_allowed(policies, router, decode, 8000)  # the HTTP port: the router's


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_sidecar_is_told_the_adapters_side_channel(
    children: list[dict[str, Any]], role: str
) -> None:
    env = env_of(pod_container(children, role, "nixl-sidecar"))
    assert env["PDD_SIDE_CHANNEL"] == "fake"
    assert env["PDD_SIDE_CHANNEL_PORTS"] == str(METADATA_PORT)
    # The contract does not know a `fake` channel, so its serving roles travel with it.
    assert env["PDD_SIDE_CHANNEL_ROLES"] == "decode"


def test_the_router_runs_the_adapters_command_with_the_users_args_after() -> None:
    pdd = fake_pdd({"router": {"args": ["--user-flag"]}})
    router = find(render_children(pdd, CTX), "Deployment", "llama-router")
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["fake-router"]
    revision = router_discovery(pdd).prefill_selector
    selector = ",".join(f"{k}={v}" for k, v in revision)
    assert container["args"] == ["--fake-pd", "--prefill", selector, "--user-flag"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ok"
    # spec.router.command replaces the adapter's router whole: command, flags and probes.
    own = fake_pdd({"router": {"command": ["my-router"], "args": ["--x"]}})
    container = find(render_children(own, CTX), "Deployment", "llama-router")["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert (container["command"], container["args"]) == (["my-router"], ["--x"])
    assert "readinessProbe" not in container


def test_the_pods_carry_the_adapters_annotations_for_its_router(
    children: list[dict[str, Any]],
) -> None:
    for role in ("prefill", "decode"):
        sts = find(children, "StatefulSet", f"llama-{role}")
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        assert annotations["fake.example/role-port"] == f"{role}:{KV_PORT}"


def test_no_other_engines_port_or_wiring_leaks_in(children: list[dict[str, Any]]) -> None:
    rendered = json.dumps(children)
    for port in (VLLM_SIDE_CHANNEL_BASE_PORT, SGLANG_BOOTSTRAP_PORT):
        assert f": {port}" not in rendered and f'"{port}"' not in rendered
    for engine_specific in ("VLLM_", "--kv-transfer-config", "--disaggregation"):
        assert engine_specific not in rendered
    assert "PDD_MODEL" not in env_of(pod_container(children, "prefill", "engine"))


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_preflight_measures_at_the_adapters_kv_descriptor_size(
    children: list[dict[str, Any]], role: str
) -> None:
    pod = find(children, "StatefulSet", f"llama-{role}")["spec"]["template"]["spec"]
    preflight = next(c for c in pod["initContainers"] if c["name"] == "preflight")
    # Llama-3.1-8B at TP 2 (4 KV heads per rank, head dim 128, bfloat16) in the adapter's
    # 32-token blocks with K and V in one descriptor.
    assert env_of(preflight)["PDD_KV_DESCRIPTOR_BYTES"] == str(32 * 4 * 128 * 2 * 2)
    assert engine_descriptor_bytes(fake_pdd().spec, ADAPTER) == 32 * 4 * 128 * 2 * 2


@pytest.mark.parametrize(("role", "targets"), [("prefill", {"decode"}), ("decode", set())])
def test_the_sidecar_checks_what_the_rendered_env_says(
    children: list[dict[str, Any]],
    role: str,
    targets: set[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The sidecar, started with the env rendered for the fake engine, checks its port on
    the roles serving it, without knowing the engine."""
    sidecar = pod_container(children, role, "nixl-sidecar")
    for name, value in env_of(sidecar).items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    token = tmp_path / "token"
    token.write_text("t0ken")
    argv = [*sidecar["command"][1:], "--token-file", str(token)]
    config = build_config(_parser().parse_args(argv))
    channel = side_channel_for(
        config.side_channel, role, config.side_channel_ports, config.side_channel_roles
    )
    assert channel is not None
    assert channel.ports == (METADATA_PORT,)
    assert channel.target_roles == targets
