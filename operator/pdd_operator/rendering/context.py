"""What rendering needs besides the spec: operator settings, the placement decision and the
engine adapters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pdd_contract.ports import SIDECAR_PORT
from pdd_operator.api.v1alpha1 import DEFAULT_ROUTER_IMAGE, PDDeploymentSpec
from pdd_operator.engines.base import EngineAdapter
from pdd_operator.engines.registry import ENGINES, adapter_for
from pdd_operator.planning.placement import Placement
from pdd_operator.planning.slices import Slice


@dataclass(frozen=True)
class OperatorSettings:
    sidecar_image: str = "ghcr.io/pdd-dev/pdd-sidecar:0.1.0"
    # What a router runs whose spec.router.image is the CRD's default: the same image, or a
    # private registry's copy of it (the chart's imageRegistry), so that one value moves every
    # image of ours to a mirror without editing each PDDeployment.
    router_image: str = DEFAULT_ROUTER_IMAGE
    # Secrets of each PDDeployment's namespace that every pod the operator renders pulls its
    # images with (the chart's imagePullSecrets), before those the podTemplate names.
    image_pull_secrets: tuple[str, ...] = ()

    def router_image_for(self, image: str) -> str:
        """The image a router runs for spec.router.image `image`: the operator's router image
        in place of the CRD's default, any other image as given."""
        return self.router_image if image == DEFAULT_ROUTER_IMAGE else image

    def pull_secrets(self) -> dict[str, list[dict[str, str]]]:
        """The pod spec's imagePullSecrets ({} without any): a podTemplate's own add to them."""
        if not self.image_pull_secrets:
            return {}
        return {"imagePullSecrets": [{"name": name} for name in self.image_pull_secrets]}

    sidecar_port: int = SIDECAR_PORT
    field_manager: str = "pdd-operator"
    # Namespaces whose pods may scrape the engines' and routers' /metrics through the
    # rendered NetworkPolicies (where Prometheus runs); none: no scraper is admitted.
    metrics_scraper_namespaces: tuple[str, ...] = ()
    # Of those namespaces, only the pods with these labels (none: every pod there): the
    # engine's HTTP port serves its whole API, not only /metrics.
    metrics_scraper_pod_labels: tuple[tuple[str, str], ...] = ()


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
