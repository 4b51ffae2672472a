"""The stock HPA controller of kube-controller-manager scales decode through its PDDRoleScaler
on a load metric, and prefill follows the ratio; it grows a deployment by a slice; and, with
the HPAScaleToZero gate on, it takes both roles to zero and back on a router metric.

This module runs a control plane of its own: the session's has no HPA controller and no
aggregation routing. The HPA reads `custom.metrics.k8s.io` through the API server's
aggregation layer from a metrics API this test serves (helpers.metrics_api, in a network
namespace the test creates: the API server refuses loopback endpoints). The metric is what
prometheus-adapter would expose from vLLM's `vllm:num_requests_waiting`: a fixed total of
waiting requests spread over the decode pods, so the HPA's answer is known in advance:
ceil(total / target per pod).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client, config

from helpers.factories import pdd_body
from helpers.metrics_api import (
    CustomMetricsServer,
    api_service_available,
    listen_in,
    network_namespace,
    register,
)
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, install_crd
from helpers.waits import create_namespace_ready, wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode, gpu_fleet
from pdd_localcluster.controlplane import DEFAULT_CONTROLLERS
from pdd_localcluster.nodes import gpu_node_capacity, gpu_node_labels

GROUP, VERSION, PLURAL, SCALERS = "pdd.dev", "v1alpha1", "pddeployments", "pddrolescalers"
METRIC = "vllm_num_requests_waiting"
TARGET_PER_POD = 10


class Load:
    """Waiting requests in all, per deployment namespace: spread evenly over its pods, and
    as a whole on its router's Service (what an HPA reads to scale up from zero pods)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, namespace: str, metric: str, pods: list[str]) -> Mapping[str, float]:
        with self.lock:
            total = self.total.get(namespace, 0.0) if metric == METRIC else 0.0
        return {pod: total / len(pods) for pod in pods} if pods else {}

    def on_router(self, namespace: str, resource: str, name: str, metric: str) -> float | None:
        if (resource, metric) != ("services", METRIC) or not name.endswith("-router"):
            return None
        with self.lock:
            return self.total.get(namespace)


@pytest.fixture(scope="module")
def hpa_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalControlPlane, client.ApiClient, Load, NodeSimulator]]:
    state = tmp_path_factory.mktemp("hpa-controlplane")
    plane = LocalControlPlane(
        state,
        controllers=(*DEFAULT_CONTROLLERS, "horizontalpodautoscaling"),
        users={OPERATOR_USER: ["system:masters"]},
        # No kube-proxy: the aggregator dials the endpoint address, not the ClusterIP.
        extra_apiserver_args=["--enable-aggregator-routing=true"],
        # The default 15 s sync and 5 min downscale window would only make the test slow.
        extra_controller_manager_args=["--horizontal-pod-autoscaler-sync-period=2s"],
        # minReplicas 0 (alpha since 1.16, still off by default in 1.35).
        feature_gates={"HPAScaleToZero": True},
    )
    load = Load()
    with (
        plane,
        network_namespace() as (netns, _, ns_ip),
        NodeSimulator(plane.kubeconfig, gpu_fleet(1, 2, zone="zone-h")) as sim,
    ):
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        sock = listen_in(netns, ns_ip)
        certs = state / "metrics-certs"
        with CustomMetricsServer(sock, api, load, certs, object_metrics=load.on_router) as server:
            register(api, "custom-metrics", ns_ip, server.port)
            wait_for(lambda: api_service_available(api), 60, what="the APIService Available")
            yield plane, api, load, sim
        api.close()


@pytest.fixture(scope="module")
def hpa_operator(
    hpa_cluster: tuple[LocalControlPlane, client.ApiClient, Load, NodeSimulator],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    plane, api, _, _ = hpa_cluster
    install_crd(api)
    log = tmp_path_factory.mktemp("hpa-operator") / "operator.log"
    proc = OperatorProcess(plane.kubeconfig_for(OPERATOR_USER), log, resync_seconds=2.0).start()
    yield proc
    proc.kill()


def new_namespace(api: client.ApiClient, name: str) -> str:
    return create_namespace_ready(api, f"{name}-{secrets.token_hex(3)}")


def decode_hpa(name: str) -> dict[str, Any]:
    """An HPA as a user writes it: target the decode scaler, average a pod metric."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"{name}-decode"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "PDDRoleScaler",
                "name": f"{name}-decode",
            },
            "minReplicas": 1,
            "maxReplicas": 8,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(TARGET_PER_POD)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
        },
    }


def replicas(api: client.ApiClient, ns: str, name: str) -> dict[str, int]:
    apps = client.AppsV1Api(api)
    return {
        role: apps.read_namespaced_stateful_set(f"{name}-{role}", ns).spec.replicas
        for role in ("prefill", "decode")
    }


def ready_counts(api: client.ApiClient, ns: str, name: str) -> tuple[str, str]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    st = obj.get("status", {})
    return st.get("prefillReplicas", ""), st.get("decodeReplicas", "")


def engine_pod_uids(api: client.ApiClient, ns: str) -> dict[str, str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="pdd.dev/role").items
    return {
        p.metadata.name: p.metadata.uid
        for p in pods
        if p.metadata.labels["pdd.dev/role"] in ("prefill", "decode")
        and not p.metadata.deletion_timestamp
    }


def _hpa_at_target(api: client.ApiClient, ns: str, name: str) -> Any:
    """The HPA once its last pass read the target average (10 waiting requests per pod)."""
    hpa = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(name, ns)
    metrics = hpa.status.current_metrics or []
    at_target = metrics and metrics[0].pods.current.average_value in ("10", "10000m")
    return hpa if at_target else None


def test_the_stock_hpa_scales_decode_on_a_load_metric_and_prefill_follows(
    hpa_cluster: tuple[LocalControlPlane, client.ApiClient, Load, NodeSimulator],
    hpa_operator: OperatorProcess,
) -> None:
    _, api, load, _ = hpa_cluster
    ns, name = new_namespace(api, "hpa"), "llama"
    body = pdd_body(
        name,
        ns,
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 2, "gpusPerInstance": 1},
        autoscaling={
            "decode": {"minReplicas": 1, "maxReplicas": 8},
            "prefill": {"minReplicas": 1, "maxReplicas": 4},
            "follower": "prefill",
            "ratio": {"prefill": 1, "decode": 2},
        },
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    wait_for(lambda: ready_counts(api, ns, name) == ("1/1", "2/2"), 120, what="1P/2D ready")
    before = engine_pod_uids(api, ns)

    # 50 waiting requests, 10 per pod wanted: the HPA asks for 5 decodes, prefill follows 3.
    load.total[ns] = 50
    client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(ns, decode_hpa(name))
    wait_for(lambda: replicas(api, ns, name) == {"prefill": 3, "decode": 5}, 90, what="3P/5D")
    wait_for(lambda: ready_counts(api, ns, name) == ("3/3", "5/5"), 120, what="3P/5D ready")
    # The HPA's status shows the average of its last pass (every 15 s): 50 over the 2 pods
    # it saw first, then over 5 once it sees them all, where it stays at 5.
    hpa = wait_for(lambda: _hpa_at_target(api, ns, f"{name}-decode"), 60, what="HPA at 10/pod")
    assert hpa.status.desired_replicas == 5
    after = engine_pod_uids(api, ns)
    assert {pod: after.get(pod) for pod in before} == before  # no running pod replaced

    # Load falls to 10: the HPA asks for 1 decode; prefill follows to its minimum 1.
    load.total[ns] = 10
    wait_for(lambda: replicas(api, ns, name) == {"prefill": 1, "decode": 1}, 90, what="1P/1D")
    scaler = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, SCALERS, f"{name}-decode"
    )
    assert scaler["spec"]["replicas"] == 1
    wait_for(lambda: len(engine_pod_uids(api, ns)) == 2, 60, what="pods gone")
    survivors = engine_pod_uids(api, ns)
    assert all(before.get(pod) == uid for pod, uid in survivors.items()), survivors


# Two domains of the slices test's own, under a level no other node carries and tainted so
# that no other pod lands there: `near` (4 GPUs, the first slice's best fit) and `far` (8).
# They go with the test, so that the next test sees the fleet it was written for.
SLICE_LEVEL = "pdd.test/hpa-slices"
SLICE_TAINT = {"key": "pdd.test/hpa-slices", "value": "true", "effect": "NoSchedule"}


@pytest.fixture
def slice_domains(
    hpa_cluster: tuple[LocalControlPlane, client.ApiClient, Load, NodeSimulator],
) -> Iterator[dict[str, str]]:
    """node name -> its domain; deleted after the test."""
    sim = hpa_cluster[3]
    nodes = [
        SimNode(
            f"hpa-slices-{domain}",
            labels={**gpu_node_labels(gpus, f"clique-hpa-{domain}"), SLICE_LEVEL: domain},
            capacity=gpu_node_capacity(gpus),
            taints=(SLICE_TAINT,),
        )
        for domain, gpus in (("near", 4), ("far", 8))
    ]
    with sim.nodes_for_a_while(nodes):
        yield {n.name: n.labels[SLICE_LEVEL] for n in nodes}


def slices(api: client.ApiClient, ns: str, name: str) -> list[tuple[str, int, int]]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    shown = obj.get("status", {}).get("slices", [])
    return [(s["domain"], s["prefill"], s["decode"]) for s in shown]


def test_the_stock_hpa_grows_a_deployment_by_a_slice_and_shrinks_the_newest_first(
    hpa_cluster: tuple[LocalControlPlane, client.ApiClient, Load, NodeSimulator],
    hpa_operator: OperatorProcess,
    slice_domains: dict[str, str],
) -> None:
    _, api, load, _ = hpa_cluster
    ns, name = new_namespace(api, "hpa-slices"), "llama"
    toleration = {**SLICE_TAINT, "operator": "Equal"}
    role = {"gpusPerInstance": 1, "tolerations": [toleration]}
    body = pdd_body(
        name,
        ns,
        prefill={"replicas": 1, **role},
        decode={"replicas": 2, **role},
        autoscaling={
            "decode": {"minReplicas": 1, "maxReplicas": 8},
            "prefill": {"minReplicas": 1, "maxReplicas": 4},
            "follower": "prefill",
            "ratio": {"prefill": 1, "decode": 2},
        },
        topology={"placement": "required", "levels": [SLICE_LEVEL]},
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    wait_for(lambda: ready_counts(api, ns, name) == ("1/1", "2/2"), 120, what="1P/2D ready")
    assert slices(api, ns, name) == [("near", 1, 2)]
    home = engine_pod_uids(api, ns)

    # 50 waiting requests at 10 per pod: the HPA asks for 5 decodes. near (4 GPUs) holds
    # 2 decodes + 1 prefill and no more: 3 decodes and 2 prefills open slice 1 in far.
    load.total[ns] = 50
    client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(ns, decode_hpa(name))
    wait_for(lambda: slices(api, ns, name) == [("near", 1, 2), ("far", 2, 3)], 90, what="slice 1")
    wait_for(lambda: ready_counts(api, ns, name) == ("3/3", "5/5"), 120, what="3P/5D ready")
    hpa = wait_for(lambda: _hpa_at_target(api, ns, f"{name}-decode"), 60, what="HPA at 10/pod")
    assert hpa.status.desired_replicas == 5  # its selector averages over both slices' pods
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="pdd.dev/role").items
    for pod in pods:
        if pod.metadata.labels["pdd.dev/role"] in ("prefill", "decode"):
            in_slice = pod.metadata.labels.get("pdd.dev/slice", "0")
            want = "near" if in_slice == "0" else "far"
            assert slice_domains[pod.spec.node_name] == want, pod.metadata.name
    after = engine_pod_uids(api, ns)
    assert {pod: after.get(pod) for pod in home} == home  # no running pod replaced

    # Load falls to 10: the HPA asks for 1 decode; slice 1 is emptied and removed first.
    load.total[ns] = 10
    wait_for(lambda: slices(api, ns, name) == [("near", 1, 1)], 90, what="slice 1 removed")
    wait_for(lambda: len(engine_pod_uids(api, ns)) == 2, 60, what="pods gone")
    survivors = engine_pod_uids(api, ns)
    assert all(home.get(pod) == uid for pod, uid in survivors.items()), survivors
    apps = client.AppsV1Api(api)
    assert not [s for s in apps.list_namespaced_stateful_set(ns).items if "-s1" in s.metadata.name]


def zero_hpa(name: str) -> dict[str, Any]:
    """An HPA that may scale decode to zero: with no pod left to average over, it reads the
    waiting requests on the router's Service (an Object metric, AverageValue per replica:
    ceil(waiting / target), whatever runs now)."""
    hpa = decode_hpa(name)
    hpa["spec"]["minReplicas"] = 0
    hpa["spec"]["metrics"] = [
        {
            "type": "Object",
            "object": {
                "describedObject": {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": f"{name}-router",
                },
                "metric": {"name": METRIC},
                "target": {"type": "AverageValue", "averageValue": str(TARGET_PER_POD)},
            },
        }
    ]
    return hpa


def test_the_stock_hpa_scales_both_roles_to_zero_and_back(
    hpa_cluster: tuple[LocalControlPlane, client.ApiClient, Load, NodeSimulator],
    hpa_operator: OperatorProcess,
) -> None:
    _, api, load, _ = hpa_cluster
    ns, name = new_namespace(api, "hpa-zero"), "llama"
    body = pdd_body(
        name,
        ns,
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 1, "gpusPerInstance": 1},
        autoscaling={"decode": {"minReplicas": 0, "maxReplicas": 4}, "follower": "prefill"},
    )
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    wait_for(lambda: ready_counts(api, ns, name) == ("1/1", "1/1"), 120, what="1P/1D ready")
    router = router_pod_uids(api, ns)

    # Nothing waits: the HPA asks for 0 decodes and prefill follows to 0.
    load.total[ns] = 0
    client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(ns, zero_hpa(name))
    wait_for(lambda: replicas(api, ns, name) == {"prefill": 0, "decode": 0}, 90, what="0P/0D")
    wait_for(lambda: scaled_to_zero(api, ns, name) == "True", 60, what="ScaledToZero=True")
    wait_for(lambda: not engine_pod_uids(api, ns), 60, what="engine pods gone")

    # 30 requests wait at the router: the HPA asks for ceil(30 / 10) = 3 from zero.
    load.total[ns] = 30
    wait_for(lambda: replicas(api, ns, name) == {"prefill": 3, "decode": 3}, 90, what="3P/3D")
    wait_for(lambda: ready_counts(api, ns, name) == ("3/3", "3/3"), 120, what="3P/3D ready")
    wait_for(lambda: scaled_to_zero(api, ns, name) == "False", 60, what="ScaledToZero=False")
    assert router_pod_uids(api, ns) == router  # the router stayed up all along


def router_pod_uids(api: client.ApiClient, ns: str) -> set[str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="pdd.dev/role=router")
    return {p.metadata.uid for p in pods.items if not p.metadata.deletion_timestamp}


def scaled_to_zero(api: client.ApiClient, ns: str, name: str) -> str:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "ScaledToZero"]
    return str(found[0]["status"]) if found else ""
