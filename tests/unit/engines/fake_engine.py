"""A test-only engine, written the way docs/engines.md says to write one: every value differs
from the built-in engines', so a rendered object that did not ask the adapter shows."""

from __future__ import annotations

from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import (
    EngineAdapter,
    EngineLaunch,
    EnginePort,
    HealthCheck,
    KvLayout,
    RouterDiscovery,
    RouterLaunch,
    SideChannel,
    env_value,
    role_spec,
)

KV_PORT = 7100
METADATA_PORT = 7200


class FakeAdapter(EngineAdapter):
    type = "fake"
    kv_layout = KvLayout(default_block_tokens=32, packed=True)

    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        args = ("--role", role, "--gpus", str(role_spec(spec, role).gpusPerInstance))
        return EngineLaunch(("fake-engine", "serve"), args, (env_value("FAKE_ROLE", role),))

    def ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        return (EnginePort("fake-kv", KV_PORT), EnginePort("fake-meta", METADATA_PORT))

    def router_ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        # Its router also connects to the KV port (SGLang's opens the bootstrap port).
        return (EnginePort("fake-kv", KV_PORT),)

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel:
        # Served by decode only: neither vLLM's (both roles) nor SGLang's (prefill) shape.
        return SideChannel("fake", (METADATA_PORT,), ("decode",))

    def health_check(self, spec: PDDeploymentSpec) -> HealthCheck:
        return HealthCheck(path="/ready", timeout_s=7, startup_failure_threshold=30)

    def router(self, spec: PDDeploymentSpec, discovery: RouterDiscovery) -> RouterLaunch:
        selector = ",".join(f"{k}={v}" for k, v in discovery.prefill_selector)
        return RouterLaunch(
            ("fake-router",), ("--fake-pd", "--prefill", selector), readiness_path="/ok"
        )

    def pod_annotations(self, spec: PDDeploymentSpec, role: str) -> dict[str, str]:
        return {"fake.example/role-port": f"{role}:{KV_PORT}"}


ADAPTER = FakeAdapter()
