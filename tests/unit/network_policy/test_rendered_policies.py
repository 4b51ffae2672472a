"""The rendered NetworkPolicies, evaluated (helpers/netpol.py) against the ports the engines
really use, between pods carrying the labels render_children really puts on them.

What P and D use between them (docs/engines.md, "What each engine gets"):
- vLLM's NIXL side channel: VLLM_NIXL_SIDE_CHANNEL_PORT + the data-parallel index, one ZMQ
  listener per DP engine;
- SGLang's bootstrap server (HTTP, on prefill) and each rank's ZMQ PULL socket, bound to a
  free port the kernel picks (peers learn it from the bootstrap server);
- UCX's TCP transport and NIXL's wire-up: ephemeral ports (Linux's default
  ip_local_port_range is 32768-60999);
- the pdd sidecars, which talk to each other on the sidecar port.

What the router uses besides the HTTP port: smg 1.13.0 connects to each prefill's SGLang
bootstrap port when it registers the pod (engines/sglang.py, `router_ports`); vllm-router
pairs vLLM pods over HTTP alone, and under kv_aware subscribes to each prefill engine's KV
events (engines/vllm_kv_events.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from helpers.factories import make_pdd
from helpers.netpol import External, Pod, Source, ingress_allowed, pod_from_workload
from pdd_contract.ports import SGLANG_BOOTSTRAP_PORT, vllm_side_channel_ports
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.vllm_kv_events import EVENTS_PORT, REPLAY_PORT
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.sidecar import sidecar_enabled

CTX = RenderContext()
# Ports a kernel hands out for port 0: the default ephemeral range, its edges, and (for a
# widened ip_local_port_range) the edges of the unprivileged range.
EPHEMERAL = (32768, 40000, 49152, 55555, 60999)
SGLANG_RANDOM = (1024, 31000, 32768, 45000, 60999, 65535)


@dataclass(frozen=True)
class Rendered:
    pdd: PDDeployment
    children: list[dict[str, Any]]
    # Ports the engine picks at run time, which no adapter can name: the test's knowledge.
    runtime_ports: tuple[int, ...] = ()
    # Ports of the prefill pods that the router connects to besides HTTP: the test's knowledge.
    router_connects: tuple[int, ...] = ()

    def workload(self, kind: str, role: str) -> dict[str, Any]:
        name = names.role_name(self.pdd.name, role)
        return next(o for o in self.children if o["kind"] == kind and o["metadata"]["name"] == name)

    def pod(self, role: str, ordinal: int = 0) -> Pod:
        kind = "Deployment" if role == "router" else "StatefulSet"
        workload = self.workload(kind, role)
        return pod_from_workload(workload, f"{workload['metadata']['name']}-{ordinal}")

    @property
    def policies(self) -> list[dict[str, Any]]:
        return [o for o in self.children if o["kind"] == "NetworkPolicy"]

    @property
    def http_port(self) -> int:
        return self.pdd.spec.engine.port

    @property
    def peer_ports(self) -> set[int]:
        """Every port a P or D pod of this deployment may connect to on another one, besides
        HTTP: the engine adapter's ports and side channel, the sidecar's port from the
        operator's settings, UCX's ephemeral ports and the engine's run-time ports."""
        spec = self.pdd.spec
        adapter = CTX.engine(spec)
        ports = {p.port for p in adapter.ports(spec)} | {*EPHEMERAL, *self.runtime_ports}
        channel = adapter.side_channel(spec)
        if channel is not None:
            ports |= set(channel.ports)
        if sidecar_enabled(spec):
            ports.add(CTX.settings.sidecar_port)
        return ports


def render(
    spec_patch: dict[str, Any] | None = None,
    name: str = "llama",
    runtime_ports: tuple[int, ...] = (),
    router_connects: tuple[int, ...] = (),
) -> Rendered:
    pdd = make_pdd(spec_patch, name=name)
    return Rendered(pdd, render_children(pdd, CTX), runtime_ports, router_connects)


def vllm(dp_size: int = 4, mode: str = "sidecar") -> Rendered:
    """vLLM with ``dp_size`` data-parallel engines per pod, set through the engine's own
    arguments: one side-channel listener per DP index."""
    exchange: dict[str, Any] = {"mode": mode}
    if mode == "etcd":
        exchange["etcdEndpoints"] = ["http://etcd.infra:2379"]
    spec = {
        "engine": {"args": ["--data-parallel-size", str(dp_size)]},
        "kvTransfer": {"metadataExchange": exchange},
    }
    pdd = make_pdd(spec)
    return render(spec, runtime_ports=vllm_side_channel_ports(dp_size, side_channel_base(pdd)))


def side_channel_base(pdd: PDDeployment) -> int:
    channel = CTX.engine(pdd.spec).side_channel(pdd.spec)
    assert channel is not None
    return channel.ports[0]


def sglang(mode: str = "sidecar") -> Rendered:
    spec = {"engine": {"type": "sglang"}, "kvTransfer": {"metadataExchange": {"mode": mode}}}
    # smg registers each prefill pod with a connection to its bootstrap port (the default).
    return render(spec, runtime_ports=SGLANG_RANDOM, router_connects=(SGLANG_BOOTSTRAP_PORT,))


def vllm_kv_aware() -> Rendered:
    """vllm-router's kv_aware subscribes to each prefill engine's KV event publisher and its
    replay socket (engines/vllm_kv_events.py)."""
    spec = {"engine": {"version": "0.33.0"}, "router": {"prefillPolicy": "kv_aware"}}
    return render(spec, router_connects=(EVENTS_PORT, REPLAY_PORT))


def custom() -> Rendered:
    return render({"engine": {"type": "custom", "command": ["my-engine"]}})


DEPLOYMENTS: dict[str, Callable[[], Rendered]] = {
    "vllm": vllm,
    "vllm-engine-mode": lambda: vllm(mode="engine"),
    "vllm-etcd-mode": lambda: vllm(mode="etcd"),
    "vllm-kv-aware": vllm_kv_aware,
    "sglang": sglang,
    "sglang-engine-mode": lambda: sglang(mode="engine"),
    "custom": custom,
}


@pytest.fixture(params=sorted(DEPLOYMENTS))
def deployment(request: pytest.FixtureRequest) -> Rendered:
    return DEPLOYMENTS[request.param]()


@pytest.fixture
def neighbour() -> Rendered:
    """Another PDDeployment in the same namespace: vLLM with the default ports."""
    return render(name="mistral")


def allowed(policies: list[dict[str, Any]], source: Source, target: Pod, port: int) -> bool:
    return ingress_allowed(policies, source, target, port)


def test_every_deployment_renders_both_policies_ingress_only(deployment: Rendered) -> None:
    """Egress stays open (DNS, model downloads, the API server, etcd); in every metadata
    exchange mode, sidecar or not, the engines' pods are guarded."""
    rendered = sorted(p["metadata"]["name"] for p in deployment.policies)
    assert rendered == ["llama-kv-transfer", "llama-router"]
    for policy in deployment.policies:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert "egress" not in policy["spec"]


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_vllm_side_channel_of_every_dp_rank_is_open_between_prefill_and_decode(
    dp_size: int,
) -> None:
    r = vllm(dp_size)
    side_channel = vllm_side_channel_ports(dp_size, side_channel_base(r.pdd))
    assert side_channel == tuple(range(5600, 5600 + dp_size))
    for source, target in pairs(r):
        for port in side_channel:
            assert allowed(r.policies, source, target, port), (source.name, target.name, port)
    # ...and closed to the router.
    for port in side_channel:
        assert not allowed(r.policies, r.pod("router"), r.pod("prefill"), port)


def test_sglang_bootstrap_and_random_zmq_ports_are_open_between_prefill_and_decode() -> None:
    r = sglang()
    bootstrap = r.pdd.spec.kvTransfer.bootstrapPort
    assert bootstrap == 8998
    assert allowed(r.policies, r.pod("decode"), r.pod("prefill"), bootstrap)
    for port in SGLANG_RANDOM:
        # decode sends its NIXL metadata to the prefill rank's ZMQ port and back.
        assert allowed(r.policies, r.pod("decode"), r.pod("prefill"), port), port
        assert allowed(r.policies, r.pod("prefill"), r.pod("decode"), port), port


def pairs(r: Rendered) -> list[tuple[Pod, Pod]]:
    """Every direction between the deployment's engine pods, two pods of each role."""
    pods = [r.pod(role, ordinal) for role in ("prefill", "decode") for ordinal in (0, 1)]
    return [(a, b) for a in pods for b in pods if a != b]


def test_prefill_and_decode_reach_each_other_on_every_port_they_use(deployment: Rendered) -> None:
    ports = deployment.peer_ports | {deployment.http_port}
    assert len(ports) >= 7  # the engine's, the sidecar's (where it runs) and UCX's ports
    for source, target in pairs(deployment):
        for port in sorted(ports):
            assert allowed(deployment.policies, source, target, port), (
                source.name,
                target.name,
                port,
            )


def test_only_tcp_is_opened_between_prefill_and_decode(deployment: Rendered) -> None:
    for source, target in pairs(deployment):
        assert not ingress_allowed(deployment.policies, source, target, 5600, protocol="UDP")


def test_the_router_reaches_the_http_port_and_the_ports_it_connects_to_only(
    deployment: Rendered,
) -> None:
    """The HTTP port and, for SGLang, the prefill's bootstrap port (smg connects to it when it
    registers the pod); the sidecar port, side channels, SGLang's ZMQ ports and UCX's stay
    closed to it."""
    router, prefill = deployment.pod("router"), deployment.pod("prefill")
    for port in (deployment.http_port, *deployment.router_connects):
        assert allowed(deployment.policies, router, prefill, port), port
    for role in ("prefill", "decode"):
        target = deployment.pod(role)
        assert allowed(deployment.policies, router, target, deployment.http_port)
        closed = (deployment.peer_ports | {8099, 5600, 8998}) - set(deployment.router_connects)
        for port in sorted(closed):
            assert not allowed(deployment.policies, router, target, port), (role, port)


ENGINES: dict[str, dict[str, Any]] = {
    "vllm": {"type": "vllm"},
    "sglang": {"type": "sglang"},
    "custom": {"type": "custom", "command": ["my-engine"]},
}


@pytest.mark.parametrize(
    ("engine", "kv_transfer", "port", "open_to_the_router"),
    [
        ("sglang", {}, 8998, True),  # smg's connection at registration
        ("sglang", {"bootstrapPort": 9100}, 9100, True),  # the spec's port, not 8998
        ("sglang", {"bootstrapPort": 9100}, 8998, False),
        ("sglang", {"metadataExchange": {"mode": "engine"}}, 8998, True),
        ("vllm", {}, 8998, False),  # vllm-router speaks HTTP only
        ("vllm", {"bootstrapPort": 9100}, 9100, False),
        ("vllm", {}, 5600, False),  # the side channel carries memory keys
        ("custom", {}, 8998, False),
    ],
)
def test_the_router_reaches_the_prefills_bootstrap_port_for_sglang_only(
    engine: str, kv_transfer: dict[str, Any], port: int, open_to_the_router: bool
) -> None:
    r = render({"engine": ENGINES[engine], "kvTransfer": kv_transfer})
    assert allowed(r.policies, r.pod("router"), r.pod("prefill"), port) is open_to_the_router
    # Whatever the router gets, other pods of the namespace do not.
    assert not allowed(r.policies, Pod("debug", {}, "team-a"), r.pod("prefill"), port)


def test_without_a_rendered_router_the_bootstrap_port_stays_closed_to_outsiders() -> None:
    """The user's own router has labels the operator cannot know: it gets the HTTP port, and
    the bootstrap port only through a policy of the user's own."""
    r = render({"engine": {"type": "sglang"}, "router": {"enabled": False}})
    users_router = Pod("gateway-0", {"app": "gateway"}, "ingress")
    assert allowed(r.policies, users_router, r.pod("prefill"), r.http_port)
    assert not allowed(r.policies, users_router, r.pod("prefill"), SGLANG_BOOTSTRAP_PORT)


def test_the_router_takes_clients_on_its_http_port_from_anywhere(
    deployment: Rendered, neighbour: Rendered
) -> None:
    router, port = deployment.pod("router"), deployment.pdd.spec.router.port
    policies = [*deployment.policies, *neighbour.policies]
    clients: list[Source] = [
        External("203.0.113.7"),
        Pod("debug", {}, "team-a"),
        Pod("app", {"app": "chat"}, "other-team"),
        neighbour.pod("router"),
        deployment.pod("decode"),
    ]
    for client in clients:
        assert allowed(policies, client, router, port), client
        for other in (9000, 29000, 8099, 5600):  # nothing else on the router
            assert not allowed(policies, client, router, other), (client, other)


def test_a_pod_of_another_deployment_reaches_no_port(
    deployment: Rendered, neighbour: Rendered
) -> None:
    """Same namespace, same engine, every label but the deployment's: it is still shut out,
    the HTTP port included (only its own router may send requests)."""
    policies = [*deployment.policies, *neighbour.policies]
    ports = sorted(deployment.peer_ports | {deployment.http_port})
    for role in ("prefill", "decode", "router"):
        source = neighbour.pod(role)
        for target in (deployment.pod("prefill"), deployment.pod("decode")):
            for port in ports:
                assert not allowed(policies, source, target, port), (role, target.name, port)
    # And the other way round: its policy shuts this deployment out as well.
    for target in (neighbour.pod("prefill"), neighbour.pod("decode")):
        for port in ports:
            assert not allowed(policies, deployment.pod("decode"), target, port)


def test_unlabelled_pods_outsiders_and_look_alikes_elsewhere_reach_no_engine_port(
    deployment: Rendered,
) -> None:
    prefill = deployment.pod("prefill")
    look_alike = Pod("llama-decode-0", deployment.pod("decode").labels, "team-b")
    sources: list[Source] = [Pod("debug", {}, "team-a"), External("203.0.113.7"), look_alike]
    for source in sources:
        for port in sorted(deployment.peer_ports | {deployment.http_port}):
            assert not allowed(deployment.policies, source, prefill, port), (source, port)


def test_without_a_rendered_router_the_http_port_is_the_front_door() -> None:
    """spec.router.enabled false: the user's router sits outside the deployment with labels
    the operator cannot know, so the engines' HTTP port takes any source; nothing else does."""
    r = render({"router": {"enabled": False}})
    assert [p["metadata"]["name"] for p in r.policies] == ["llama-kv-transfer"]
    users_router = Pod("gateway-0", {"app": "gateway"}, "ingress")
    for source in (users_router, External("203.0.113.7")):
        assert allowed(r.policies, source, r.pod("decode"), r.http_port)
        for port in sorted(r.peer_ports):
            assert not allowed(r.policies, source, r.pod("decode"), port), port
    for source, target in pairs(r):
        assert allowed(r.policies, source, target, 5600)
