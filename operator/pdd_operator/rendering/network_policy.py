"""Who may open a connection to the deployment's pods: two NetworkPolicies, ingress only.

``<id>-kv-transfer`` selects the deployment's prefill and decode pods and admits
  (a) every TCP port from the deployment's own prefill and decode pods. A port list cannot
      describe what P and D use between them: vLLM's NIXL side channel listens on its base
      port plus the data-parallel index (one listener per DP engine), SGLang binds each rank's
      ZMQ PULL socket on a random port and tells peers through its bootstrap server, UCX's TCP
      transport and NIXL's wire-up connect to ephemeral ports, and the sidecars of the
      deployment talk to each other on the sidecar port;
  (b) from the deployment's router pods, the engine's HTTP port (``spec.engine.port``) and
      the ports the adapter's ``router_ports`` names, nothing else. Requests are HTTP on the
      engine port (vllm-router with NIXL pairs vLLM pods over HTTP alone,
      tests/fixtures/routers/README.md). SGLang's router hands decode the prefill's bootstrap
      address in the request body, and decode connects to it under (a), but smg 1.13.0 also
      connects to each prefill's bootstrap port itself when it registers the pod
      (engines.sglang), so that port is open to the router. One policy covers both roles, so
      it is open on decode pods too, where nothing listens on it. Where the operator renders
      no router (``spec.router.enabled: false``), the user's own router sits outside the
      deployment with labels the operator cannot know, so the HTTP port is open to every
      source instead and the router's other ports to none (a router of your own that needs
      them needs a policy of your own: policies add up);
  (c) nothing else: other pods of the namespace and pods of other PDDeployments reach no port;
  (d) except, where the operator runs with --metrics-scraper-namespace (the chart's
      metrics.scraperNamespaces), the engine's HTTP port, which serves its /metrics, from
      the pods of those namespaces (where Prometheus runs) that carry the
      --metrics-scraper-pod-label labels (every pod there where none are given). That port
      serves the engine's whole API too: name the scraper's labels to admit it alone.
The kubelet's probes still arrive: traffic from a pod's own node is always allowed.

``<id>-router`` (only where a router is rendered) selects the router pods and admits their
HTTP port (``spec.router.port``) from anywhere: the router is the deployment's front door; and
its metrics port (``spec.router.metricsPort``) from the metrics-scraper namespaces, if any.

Egress is left open (policyTypes is Ingress only): the pods resolve DNS, download models,
read the API server (the sidecar's peer discovery) and, in etcd mode, reach the user's etcd,
none of which a pod selector can name. Every destination inside a deployment is guarded by
these ingress rules anyway.

The policies are rendered whatever ``metadataExchange.mode`` is: in ``engine`` mode, with no
sidecar, the engines' own side channels still carry NIXL metadata (memory keys), which only
the deployment's own pods may read. Traffic over RDMA (Multus secondary networks) bypasses the
pod network and every NetworkPolicy; these rules govern the pod network, where the side
channels, UCX's TCP lanes and the HTTP requests travel.
"""

from __future__ import annotations

from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import EnginePort
from pdd_operator.rendering.context import OperatorSettings, RenderContext
from pdd_operator.rendering.kinds import ChildPart, Kind, Stage
from pdd_operator.rendering.roles import child_metadata
from pdd_operator.rendering.router import render_router

COMPONENT = "network-policy"
# The label the API server sets on every namespace, its name (Kubernetes 1.22+).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def render_network_policies(pdd: PDDeployment, ctx: RenderContext) -> list[dict[str, Any]]:
    router_pods = router_pod_selector(pdd, ctx)
    router_ports = ctx.engine(pdd.spec).router_ports(pdd.spec)
    scrapers = _scrapers(ctx.settings)
    policies = [render_engine_policy(pdd, router_pods, router_ports, scrapers)]
    if router_pods is not None:
        policies.append(render_router_policy(pdd, router_pods, scrapers))
    return policies


def render_engine_policy(
    pdd: PDDeployment,
    router_pods: dict[str, str] | None,
    router_ports: tuple[EnginePort, ...],
    scrapers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    ingress = [
        # A port entry without a number: every TCP port.
        {"from": [{"podSelector": engine_pod_selector(pdd)}], "ports": [{"protocol": "TCP"}]},
        _from_router(pdd, router_pods, router_ports),
    ]
    if scrapers:  # the engines serve /metrics on their HTTP port
        ingress.append(_from_scrapers(scrapers, pdd.spec.engine.port))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(pdd, names.network_policy_name(pdd.name), COMPONENT),
        "spec": {
            "podSelector": engine_pod_selector(pdd),
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _scrapers(settings: OperatorSettings) -> list[dict[str, Any]]:
    """(d)'s peers: the operator's metrics-scraper namespaces (--metrics-scraper-namespace,
    by the name label every namespace carries), and in them the pods with its
    --metrics-scraper-pod-label labels (all pods where none are given); [] without any."""
    namespaces = settings.metrics_scraper_namespaces
    if not namespaces:
        return []
    peer: dict[str, Any] = {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(namespaces)}
            ]
        }
    }
    if settings.metrics_scraper_pod_labels:
        peer["podSelector"] = {"matchLabels": dict(settings.metrics_scraper_pod_labels)}
    return [peer]


def _from_scrapers(scrapers: list[dict[str, Any]], port: int) -> dict[str, Any]:
    """(d): the metrics port from the scraper's pods."""
    return {"from": scrapers, "ports": [{"port": port, "protocol": "TCP"}]}


def _from_router(
    pdd: PDDeployment, router_pods: dict[str, str] | None, router_ports: tuple[EnginePort, ...]
) -> dict[str, Any]:
    """(b): the HTTP port and the router's own ports from the router pods; without a rendered
    router, the HTTP port from anywhere and nothing more."""
    http = {"port": pdd.spec.engine.port, "protocol": "TCP"}
    if router_pods is None:
        return {"ports": [http]}
    return {
        "from": [{"podSelector": {"matchLabels": router_pods}}],
        "ports": [http, *[{"port": p.port, "protocol": "TCP"} for p in router_ports]],
    }


def render_router_policy(
    pdd: PDDeployment, router_pods: dict[str, str], scrapers: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    ingress: list[dict[str, Any]] = [{"ports": [{"port": pdd.spec.router.port, "protocol": "TCP"}]}]
    if scrapers:
        ingress.append(_from_scrapers(scrapers, pdd.spec.router.metricsPort))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, "router"), COMPONENT),
        "spec": {
            "podSelector": {"matchLabels": router_pods},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def engine_pod_selector(pdd: PDDeployment) -> dict[str, Any]:
    """This deployment's prefill and decode pods (not its router)."""
    return {
        "matchLabels": names.selector_labels(pdd.name),
        "matchExpressions": [
            {"key": names.LABEL_ROLE, "operator": "In", "values": list(names.ROLES)}
        ],
    }


def router_pod_selector(pdd: PDDeployment, ctx: RenderContext) -> dict[str, str] | None:
    """The selector of the router Deployment the operator renders (so it matches the router's
    pods by construction), or None where it renders none."""
    for obj in render_router(pdd, ctx):
        if obj["kind"] == "Deployment":
            return dict(obj["spec"]["selector"]["matchLabels"])
    return None


NETWORK_POLICY = Kind(
    "networking.k8s.io/v1",
    "NetworkPolicy",
    "networkpolicies",
    why="Who may reach the KV transfer and side-channel ports, and the router.",
    stage=Stage.USED,
)
PART = ChildPart("network policies", (NETWORK_POLICY,), render_network_policies)
