"""Render the router: the one entry point for clients, sending each request to prefill first
and then to decode.

The engine's adapter names the router (vllm-router, smg) and its flags; this module gives it
what every router gets: the pod discovery it needs (the deployment's namespace, role labels
plus the engine revision, the engine's HTTP port), a ServiceAccount whose Role may only list
and watch pods in that namespace, probes, a metrics port, resources and the user's podTemplate.
"""

from __future__ import annotations

from typing import Any

from pdd_contract.env import PDD_DECODE_SERVICE, PDD_ENGINE_PORT, PDD_MODEL, PDD_PREFILL_SERVICE
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import RouterDiscovery, RouterLaunch
from pdd_operator.planning.autoscaling import DISCOVERY_GRACE_S
from pdd_operator.planning.slices import slices_possible
from pdd_operator.rendering.access import render_account
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.kinds import ACCESS_KINDS, SERVICE, ChildPart, Kind, Stage
from pdd_operator.rendering.merge import merge_template
from pdd_operator.rendering.pod_security import non_root_security_context, pod_security_context
from pdd_operator.rendering.ranks import is_multinode
from pdd_operator.rendering.roles import child_metadata, engine_revision

HTTP_PORT_NAME = "http"
METRICS_PORT_NAME = "metrics"
# What the routers do with pods: kube-rs lists them, then watches (the fixtures README saw
# nothing else). Nothing in the verbs lets a router read another object or change one.
DISCOVERY_VERBS = ("list", "watch")


def render_router(pdd: PDDeployment, ctx: RenderContext) -> list[dict[str, Any]]:
    if not pdd.spec.router.enabled:
        return []
    return [
        *render_router_access(pdd),
        render_router_deployment(pdd, ctx),
        render_router_service(pdd, ctx),
    ]


def router_discovery(
    pdd: PDDeployment, slice_index: int = 0, revision: str = ""
) -> RouterDiscovery:
    """The pods the router pairs: this deployment's prefill and decode pods of one revision.

    During a coordinated rollout (RenderContext.partitions) old and new pods run side by
    side, and a router must never pair a prefill of one revision with a decode of the other,
    so a router selects exactly one revision: `revision`, or the spec's (the one the
    StatefulSets' templates carry). The home router keeps the old revision until the new
    one has a Ready pod in every role (planning.rollout.serving_revision); then its pod
    template changes and the Deployment rolls, with maxUnavailable 0, so the old router
    pods serve until a new one is Ready. The rollout keeps the last old pod of each role
    until those old router pods are gone, so they always have a pair to send to. The
    partitions stay out of the router's render: otherwise every rollout step would restart
    the router.

    A deployment that may grow by slices (planning.slices) runs a router per slice, and each
    pairs only its slice's pods, so a prefill never hands KV blocks to another domain: the
    home slice's router selects the home `app.kubernetes.io/instance` (its pods' template is
    unchanged), slice k's router the `pdd.dev/slice` label its pods carry. Static per spec:
    opening a slice never restarts the home router.
    """
    paired = {
        names.LABEL_REVISION: revision or engine_revision(pdd.spec),
        **_slice_labels(pdd, slice_index),
    }
    prefill = {**names.selector_labels(pdd.name, "prefill"), **paired, **_leaders(pdd, "prefill")}
    decode = {**names.selector_labels(pdd.name, "decode"), **paired, **_leaders(pdd, "decode")}
    return RouterDiscovery(
        namespace=pdd.namespace,
        prefill_selector=tuple(sorted(prefill.items())),
        decode_selector=tuple(sorted(decode.items())),
        engine_port=pdd.spec.engine.port,
    )


def _slice_labels(pdd: PDDeployment, slice_index: int) -> dict[str, str]:
    if slice_index > 0:
        return {names.LABEL_SLICE: str(slice_index)}
    if slices_possible(pdd.spec):
        return {names.LABEL_APP_INSTANCE: names.slice_instance(pdd.name, 0)}
    return {}


def _leaders(pdd: PDDeployment, role: str) -> dict[str, str]:
    """Where instances span nodes, only their leaders (rank 0) serve requests."""
    return {names.LABEL_POD_INDEX: "0"} if is_multinode(pdd, role) else {}


def engine_router(
    pdd: PDDeployment, ctx: RenderContext, slice_index: int = 0
) -> RouterLaunch | None:
    """The engine's own router, unless spec.router.command runs one of the user's."""
    spec = pdd.spec
    if spec.router.command is not None:
        return None
    discovery = router_discovery(pdd, slice_index, paired_revision(pdd, ctx, slice_index))
    return ctx.engine(spec).router(spec, discovery)


def paired_revision(pdd: PDDeployment, ctx: RenderContext, slice_index: int) -> str:
    """The engine revision a router pairs: the home router's may lag the spec's during a
    rollout (RenderContext.router_revision); slices beyond it roll on their own and their
    routers follow the spec."""
    if slice_index == 0 and ctx.router_revision:
        return ctx.router_revision
    return engine_revision(pdd.spec)


# An autoscaled deployment's router is Ready without workers (below). A new router pod (a
# rollout, a restart) is then Ready before its discovery has found any: smg was seen taking
# requests 1 s before it had registered a worker, and answering 404 to them. Ready only after
# DISCOVERY_GRACE_S, while the old router pods serve (maxUnavailable 0).


def _readiness_probe(pdd: PDDeployment, launch: RouterLaunch) -> dict[str, Any]:
    """An autoscaled deployment may have no engine pod at all (scaled to zero), and both
    upstream routers' readiness then fails (503: no healthy workers): the Service would have
    no endpoint and a client's connection would be refused, not answered. So its router is
    ready while it serves at all, and answers for itself (vllm-router: 503 "No available
    workers: 0 prefill, 0 decode"), once its discovery has had DISCOVERY_GRACE_S. Static per
    spec: a scaling step never changes the router's pod template, so it never restarts the
    router."""
    if pdd.spec.autoscaling is not None:
        probe = _http_probe(launch.liveness_path, 5, 3)
        return {**probe, "initialDelaySeconds": DISCOVERY_GRACE_S}
    return _http_probe(launch.readiness_path, 5, 3)


def render_router_deployment(
    pdd: PDDeployment, ctx: RenderContext, slice_index: int = 0
) -> dict[str, Any]:
    """The router's Deployment; with `slice_index` >= 1, slice k's router (`<id>-router-sk`),
    whose pods carry the slice's labels and stay behind the one router Service."""
    spec = pdd.spec
    router = spec.router
    launch = engine_router(pdd, ctx, slice_index)
    env = [
        {"name": PDD_PREFILL_SERVICE, "value": _service_host(pdd, "prefill")},
        {"name": PDD_DECODE_SERVICE, "value": _service_host(pdd, "decode")},
        {"name": PDD_ENGINE_PORT, "value": str(spec.engine.port)},
        {"name": PDD_MODEL, "value": spec.model.servedName or spec.model.name},
        *[e.model_dump(exclude_none=True) for e in router.env],
    ]
    container: dict[str, Any] = {
        "name": "router",
        "image": ctx.settings.router_image_for(router.image),
        "imagePullPolicy": router.imagePullPolicy,
        "env": env,
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": router.port, "protocol": "TCP"}],
        "resources": router.resources.model_dump(),
        # Not read-only: the upstream routers may write beside themselves.
        "securityContext": non_root_security_context(read_only_root=False),
    }
    if launch is not None:
        container["command"] = list(launch.command)
        args = [*launch.args, *router.args]
        container["ports"].append(
            {"name": METRICS_PORT_NAME, "containerPort": router.metricsPort, "protocol": "TCP"}
        )
        # Readiness: the router has a healthy prefill and decode to send to (503 before).
        container["readinessProbe"] = _readiness_probe(pdd, launch)
        # Liveness answers while the process serves at all, workers or not: an empty or
        # rolling deployment must not restart its router.
        container["livenessProbe"] = _http_probe(launch.liveness_path, 10, 6)
    else:
        if router.command is not None:
            container["command"] = list(router.command)
        args = list(router.args)
    if args:
        container["args"] = args
    template: dict[str, Any] = {
        "metadata": {
            # The revision it pairs: the rollout keeps old pods until such routers are gone.
            "labels": {
                **names.common_labels(pdd.name, "router"),
                names.LABEL_REVISION: paired_revision(pdd, ctx, slice_index),
            },
            "annotations": {
                "kubectl.kubernetes.io/default-container": "router",
                names.ANNOTATION_OWNER_NAME: pdd.name,
            },
        },
        "spec": {
            "serviceAccountName": names.router_account_name(pdd.name),
            "enableServiceLinks": False,
            "securityContext": pod_security_context(),
            "containers": [container],
            **ctx.settings.pull_secrets(),
        },
    }
    if router.podTemplate:
        template = merge_template(template, router.podTemplate)
    name = names.role_name(pdd.name, "router")
    selector = names.selector_labels(pdd.name, "router")
    if slice_index > 0:
        name = names.slice_name(pdd.name, "router", slice_index)
        selector = {**selector, names.LABEL_SLICE: str(slice_index)}
        template["metadata"]["labels"].update(slice_pod_labels(pdd, slice_index))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(pdd, name, "router"),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": selector},
            # No old router pod goes before a new one is Ready: that is what hands a rollout
            # over from the old engine revision to the new (router_discovery).
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": template,
        },
    }


def slice_pod_labels(pdd: PDDeployment, slice_index: int) -> dict[str, str]:
    """What a pod of slice k >= 1 carries on top of the home slice's labels."""
    return {
        names.LABEL_SLICE: str(slice_index),
        names.LABEL_APP_INSTANCE: names.slice_instance(pdd.name, slice_index),
    }


def render_router_service(pdd: PDDeployment, ctx: RenderContext) -> dict[str, Any]:
    router = pdd.spec.router
    ports = [{"name": HTTP_PORT_NAME, "port": router.port, "targetPort": HTTP_PORT_NAME}]
    if engine_router(pdd, ctx) is not None:
        ports.append(
            {"name": METRICS_PORT_NAME, "port": router.metricsPort, "targetPort": METRICS_PORT_NAME}
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, "router"), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(pdd.name, "router"),
            "ports": ports,
        },
    }


def render_router_access(pdd: PDDeployment) -> list[dict[str, Any]]:
    """The router's ServiceAccount and a Role that lets it list and watch pods in the
    deployment's namespace only: what service discovery needs (a custom router gets the same)."""
    account = names.router_account_name(pdd.name)
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": [*DISCOVERY_VERBS]}]
    return render_account(account, pdd.namespace, child_metadata(pdd, account, "router"), rules)


def _http_probe(path: str, period_s: int, failure_threshold: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failure_threshold,
    }


def _service_host(pdd: PDDeployment, role: str) -> str:
    return f"{names.role_name(pdd.name, role)}.{pdd.namespace}.svc"


DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments", why="The router.", stage=Stage.MAKES_PODS)
PART = ChildPart("router", (*ACCESS_KINDS, DEPLOYMENT, SERVICE), render_router)
