"""Nodes whose pods really run (the local cluster's PodRuntime) for the request-path tests,
and the reference-engine PDDeployment those tests create on them.

The nodes are tainted and labelled with the test's own key, so only the test's pods land there
and the session's simulated fleet is left as it was."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode, gpu_node_labels
from pdd_localcluster.runtime import KNOWN_IMAGES, ImageFs, PodRuntime, RuntimeOptions
from pdd_operator.engines.registry import ENGINES

REFENGINE_IMAGE = "ghcr.io/pdd-dev/pdd-refengine"
# Probe periods capped at 1 s (the rendered 10 s would only make the tests slow); a container
# that exits restarts after 1 s.
QUICK = RuntimeOptions(
    backoff_base_s=1.0, backoff_max_s=5.0, max_grace_s=10.0, max_probe_period_s=1.0
)


@dataclass(frozen=True)
class OwnNodes:
    """Node names and the label/taint key that keeps them to one test."""

    key: str  # e.g. "pdd.test/request-path"
    names: tuple[str, ...]

    @property
    def taint(self) -> dict[str, str]:
        return {"key": self.key, "value": "true", "effect": "NoSchedule"}

    @property
    def placement(self) -> dict[str, Any]:
        """The nodeSelector and toleration that put a pod on these nodes."""
        toleration = {**self.taint, "operator": "Equal"}
        return {"nodeSelector": {self.key: "true"}, "tolerations": [toleration]}


@contextlib.contextmanager
def running_nodes(
    control_plane: LocalControlPlane,
    state: Path,
    nodes: OwnNodes,
    address_block: str,
    extra: Sequence[SimNode] = (),
    images: Mapping[str, ImageFs] | None = None,
) -> Iterator[PodRuntime]:
    """`nodes` (and `extra`, nodes a test labels and taints itself) registered, their pods run
    as local processes at addresses of `address_block` ("127.87": 127.87.0.1 and on); deleted
    and stopped after the block. `images` replaces entries of the runtime's image table (built
    images run from their own files)."""
    table = {**KNOWN_IMAGES, **(images or {})}
    runtime = PodRuntime(control_plane.kubeconfig, state, images=table, options=QUICK)
    addresses = iter(f"{address_block}.{i // 250}.{i % 250 + 1}" for i in range(5000))
    labels = {**gpu_node_labels(clique=nodes.key.rsplit("/", 1)[-1]), nodes.key: "true"}
    specs = [SimNode(name, labels=labels, taints=(nodes.taint,)) for name in nodes.names]
    specs += extra
    sim = NodeSimulator(control_plane.kubeconfig, specs, pod_ips=addresses, runtime=runtime).start()
    try:
        yield runtime
    finally:
        for spec in specs:
            sim.delete_node(spec.name)
        sim.stop()


def refengine_image(engine: str, release: str | None = None, build: str = "") -> str:
    """The reference engine image that plays ``release`` of ``engine`` (default: the newest
    supported): its tag names the release, whose KV protocol it then speaks (like an engine
    image of that release). ``build`` tells two builds of one release apart (a roll)."""
    versions = ENGINES[engine].versions
    assert versions is not None
    tag = f"{engine}-{release or versions.newest}"
    return f"{REFENGINE_IMAGE}:{tag}-{build}" if build else f"{REFENGINE_IMAGE}:{tag}"


def refengine_pdd(
    name: str,
    engine: str,
    nodes: OwnNodes,
    *,
    replicas: int,
    release: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A PDDeployment of the reference engine (the one test double: no GPU here) behind the
    upstream router of `engine`, `replicas` instances per role, all on `nodes`; `spec` adds
    fields. The operator renders the wiring of `release` of `engine` (default: the newest
    supported), which the reference image's tag does not name."""
    place = nodes.placement
    versions = ENGINES[engine].versions
    assert versions is not None
    release = release or str(versions.newest)
    return {
        "apiVersion": "pdd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "test-org/tiny-model", "servedName": "tiny"},
            "engine": {
                "type": engine,
                "image": refengine_image(engine, release),
                "version": release,
            },
            "prefill": {"replicas": replicas, "gpusPerInstance": 1, **place},
            "decode": {"replicas": replicas, "gpusPerInstance": 1, **place},
            "router": {"replicas": 1, "podTemplate": {"spec": place}},
            # No GPU and no RDMA here: UCX moves the KV over TCP on loopback.
            "kvTransfer": {"gpuDirect": "off", "ucx": {"transports": ["tcp", "cuda_copy"]}},
            "topology": {"placement": "none"},
            **spec,
        },
    }


def ready_router_url(core: client.CoreV1Api, ns: str, name: str) -> str:
    """A ready router pod's own address, as the router Service would pick one (its ClusterIP
    is not routed here: no kube-proxy). While a rollout hands over, old and new may both be
    ready."""
    return ready_router_url_of(core.list_namespaced_pod(ns, label_selector=router_pods(name)).items)


def router_pods(name: str) -> str:
    """The label selector of deployment `name`'s router pods."""
    return f"pdd.dev/deployment={name},pdd.dev/role=router"


def ready_router_url_of(pods: Sequence[Any]) -> str:
    """The first ready, not deleted router pod's address among `pods` (from a list or a
    helpers.pod_watch.PodWatch)."""
    for pod in pods:
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if ready and pod.status.pod_ip and not pod.metadata.deletion_timestamp:
            return f"http://{pod.status.pod_ip}:8000"
    raise LookupError("no ready router pod")
