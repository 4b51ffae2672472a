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
    RouterDefaults,
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

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel:
        # Served by decode only: neither vLLM's (both roles) nor SGLang's (prefill) shape.
        return SideChannel("fake", (METADATA_PORT,), ("decode",))

    def health_check(self, spec: PDDeploymentSpec) -> HealthCheck:
        return HealthCheck(path="/ready", startup_failure_threshold=30)

    def router_defaults(self, spec: PDDeploymentSpec) -> RouterDefaults:
        return RouterDefaults(image="example.com/fake-router:1", args=("--fake-pd",))


ADAPTER = FakeAdapter()
