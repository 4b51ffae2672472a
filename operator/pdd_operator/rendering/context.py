"""What rendering needs besides the spec: operator settings and the placement decision."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdd_operator.planning.placement import Placement


@dataclass(frozen=True)
class OperatorSettings:
    sidecar_image: str = "ghcr.io/pdd-dev/pdd-sidecar:0.1.0"
    sidecar_port: int = 8099
    field_manager: str = "pdd-operator"


@dataclass(frozen=True)
class RenderContext:
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    placement: Placement = field(default_factory=Placement)
    # StatefulSet partition per role during a coordinated rollout (absent: 0, roll freely).
    partitions: dict[str, int] = field(default_factory=dict)
