"""What an engine adapter answers: how the engine is launched, what it listens on, how its
readiness shows, which router flags it wants and how it lays out its KV cache.

An adapter is pure: a function of the PDDeploymentSpec (and the role), rendering nothing of
its own beyond the engine's command line and environment. Rendering puts its answers into the
container, the Services, the NetworkPolicy and the sidecar's environment, so an engine's port
is declared once and opened everywhere it must be.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pdd_operator.api.v1alpha1 import PDDeploymentSpec, RoleSpec

EnvEntry = dict[str, Any]  # one container env entry, as the Pod API spells it


@dataclass(frozen=True)
class EngineLaunch:
    """The engine's own command line and environment for one role, before the user's
    ``args``, ``command`` and ``env`` from the spec are added."""

    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: tuple[EnvEntry, ...] = ()


@dataclass(frozen=True)
class EnginePort:
    """A TCP port the engine listens on besides its HTTP port. Each one becomes a container
    port, a port of the role's headless Service, and a NetworkPolicy port open to the
    deployment's own pods only (they carry NIXL metadata, which holds memory keys)."""

    name: str
    port: int


@dataclass(frozen=True)
class SideChannel:
    """The engine's own NIXL metadata channel, which the sidecar checks peers can reach.

    ``name`` is what the sidecar reports the channel as (env PDD_SIDE_CHANNEL); ``served_by``
    are the roles whose pods listen on ``ports``, so a pod checks the peers of those roles
    other than its own.
    """

    name: str
    ports: tuple[int, ...]
    served_by: tuple[str, ...]


@dataclass(frozen=True)
class HealthCheck:
    """The engine's HTTP health endpoint, for the readiness and startup probes."""

    path: str = "/health"
    period_s: int = 10
    failure_threshold: int = 3
    # Loading a large model takes minutes: the startup probe waits this many periods.
    startup_failure_threshold: int = 180


@dataclass(frozen=True)
class RouterDefaults:
    """What the engine asks of the router: an image to use when ``spec.router.image`` is
    unset, and arguments that go before ``spec.router.args``."""

    image: str | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class KvLayout:
    """How the engine lays out its paged KV cache for NIXL (planning.kv_layout's inputs)."""

    # Tokens per KV block when spec.engine.kvBlockSize is unset: the engine's own default.
    default_block_tokens: int
    # True: one descriptor holds a block's K and V together; False: K and V move as two.
    packed: bool


class EngineAdapter(ABC):
    """One engine. A subclass sets ``type`` (its value of ``spec.engine.type``) and
    ``kv_layout``, implements ``launch``, and overrides the rest where the engine has them."""

    type: ClassVar[str]
    kv_layout: ClassVar[KvLayout]

    @abstractmethod
    def launch(self, spec: PDDeploymentSpec, role: str) -> EngineLaunch:
        """Command, arguments and environment that tell the engine its role and KV wiring."""

    def ports(self, spec: PDDeploymentSpec) -> tuple[EnginePort, ...]:
        """Ports besides HTTP that peers of the same deployment connect to."""
        del spec
        return ()

    def side_channel(self, spec: PDDeploymentSpec) -> SideChannel | None:
        """The engine's own metadata channel, or None where it has none."""
        del spec
        return None

    def health_check(self, spec: PDDeploymentSpec) -> HealthCheck:
        del spec
        return HealthCheck()

    def router_defaults(self, spec: PDDeploymentSpec) -> RouterDefaults:
        del spec
        return RouterDefaults()


def role_spec(spec: PDDeploymentSpec, role: str) -> RoleSpec:
    return spec.prefill if role == "prefill" else spec.decode


def env_value(name: str, value: str) -> EnvEntry:
    return {"name": name, "value": value}


def env_pod_ip(name: str) -> EnvEntry:
    """``name`` set to the pod's IP by the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
