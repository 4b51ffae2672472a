"""Render the router: the one entry point for clients, sending each request to prefill first
and then to decode."""

from __future__ import annotations

from typing import Any

from pdd_contract.env import PDD_DECODE_SERVICE, PDD_ENGINE_PORT, PDD_MODEL, PDD_PREFILL_SERVICE
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.roles import child_metadata


def render_router(pdd: PDDeployment, ctx: RenderContext) -> list[dict[str, Any]]:
    router = pdd.spec.router
    if not router.enabled or not _image(pdd, ctx):
        return []
    return [render_router_deployment(pdd, ctx), render_router_service(pdd)]


def render_router_deployment(pdd: PDDeployment, ctx: RenderContext) -> dict[str, Any]:
    spec = pdd.spec
    router = spec.router
    defaults = ctx.engine(spec).router_defaults(spec)
    args = [*defaults.args, *router.args]
    labels = names.common_labels(pdd.name, "router")
    env = [
        {"name": PDD_PREFILL_SERVICE, "value": _service_host(pdd, "prefill")},
        {"name": PDD_DECODE_SERVICE, "value": _service_host(pdd, "decode")},
        {"name": PDD_ENGINE_PORT, "value": str(spec.engine.port)},
        {"name": PDD_MODEL, "value": spec.model.servedName or spec.model.name},
        *[e.model_dump(exclude_none=True) for e in router.env],
    ]
    container: dict[str, Any] = {
        "name": "router",
        "image": _image(pdd, ctx),
        "env": env,
        "ports": [{"name": "http", "containerPort": router.port, "protocol": "TCP"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if args:
        container["args"] = args
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, "router"), "router"),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": names.selector_labels(pdd.name, "router")},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"enableServiceLinks": False, "containers": [container]},
            },
        },
    }


def render_router_service(pdd: PDDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, "router"), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(pdd.name, "router"),
            "ports": [{"name": "http", "port": pdd.spec.router.port, "targetPort": "http"}],
        },
    }


def _image(pdd: PDDeployment, ctx: RenderContext) -> str | None:
    """spec.router.image, else the image the engine's adapter pairs with (if any)."""
    spec = pdd.spec
    return spec.router.image or ctx.engine(spec).router_defaults(spec).image


def _service_host(pdd: PDDeployment, role: str) -> str:
    return f"{names.role_name(pdd.name, role)}.{pdd.namespace}.svc"
