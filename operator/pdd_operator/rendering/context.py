"""What rendering needs besides the spec: operator settings, the placement decision and the
engine adapters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pdd_contract.ports import SIDECAR_PORT
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter
from pdd_operator.engines.registry import ENGINES, adapter_for
from pdd_operator.planning.placement import Placement
from pdd_operator.planning.slices import Slice


@dataclass(frozen=True)
class OperatorSettings:
    sidecar_image: str = "ghcr.io/pdd-dev/pdd-sidecar:0.1.0"
    sidecar_port: int = SIDECAR_PORT
    field_manager: str = "pdd-operator"


@dataclass(frozen=True)
class RenderContext:
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    placement: Placement = field(default_factory=Placement)
    # StatefulSet partition per role during a coordinated rollout (absent: 0, roll freely).
    partitions: dict[str, int] = field(default_factory=dict)
    # The slices beyond the home domain (planning.slices); empty while the deployment fits
    # its home domain.
    slices: tuple[Slice, ...] = ()
    # The engine revision the home router pairs (planning.rollout.serving_revision); empty:
    # the spec's.
    router_revision: str = ""
    # spec.engine.type -> adapter; tests add engines here without touching the registry.
    engines: Mapping[str, EngineAdapter] = field(default_factory=lambda: ENGINES)

    def engine(self, spec: PDDeploymentSpec) -> EngineAdapter:
        return adapter_for(spec.engine.type, self.engines)
