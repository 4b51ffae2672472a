"""DRA mode on the real scheduler: the operator's rendered ResourceClaimTemplate, with one
GPU + NIC pair per GPU under a `matchAttribute: resource.kubernetes.io/pcieRoot` constraint,
against ResourceSlices made by hand the way NVIDIA's GPU DRA driver and dranet publish them
for a node. The kube-controller-manager's resourceclaim controller makes each pod's
ResourceClaim; kube-scheduler allocates the devices and binds the pod.

The simulated DRA nodes have four GPUs and four NICs on four PCIe roots, deliberately NOT
aligned by index (gpu-0 is on root 2, nic-0 on root 0), so pairing request gpu-i with device
nic-i would be wrong; a fourth node has its NICs only on roots without GPUs, so no claim of
the template can be satisfied there.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from helpers.factories import make_pdd
from helpers.waits import wait_for
from pdd_localcluster import NodeSimulator, SimNode
from pdd_localcluster.kubejson import KubeJson
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.dra import PCIE_ROOT_ATTRIBUTE, render_claim_template
from pdd_operator.rendering.roles import render_role_statefulset

RESOURCE = ("resource.k8s.io", "v1")
GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "dra.net"
# The operator's default device class names (DraSpec), selecting each driver's devices.
DEVICE_CLASSES = {"gpu.nvidia.com": GPU_DRIVER, "dranet": NIC_DRIVER}

# Keeps every other test's pods off the DRA nodes (and ours off the fleet: no ResourceSlices).
TAINT = {"key": "pdd.dev/dra-test", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": "pdd.dev/dra-test", "operator": "Exists", "effect": "NoSchedule"}


def root(i: int) -> str:
    return f"pci0000:{i:02x}"


# node -> (PCIe root of gpu-0..3, PCIe root of nic-0..3). Each good node has one NIC per
# root that holds a GPU, but never at the same index.
GOOD_NODES: dict[str, tuple[list[int], list[int]]] = {
    "dra-node-0": ([2, 3, 0, 1], [0, 1, 2, 3]),
    "dra-node-1": ([1, 0, 3, 2], [3, 2, 1, 0]),
}
# GPUs on roots 0 and 1, NICs on roots 2 and 3: no GPU has a NIC on its root.
BAD_NODE = "dra-node-misaligned"
BAD_LAYOUT = ([0, 0, 1, 1], [2, 2, 3, 3])
LAYOUTS = {**GOOD_NODES, BAD_NODE: BAD_LAYOUT}

PREFILL_REPLICAS = 4  # x 2 GPUs: exactly the 8 GPUs of the two good nodes
GPUS_PER_INSTANCE = 2


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def kube(kubeconfig: Path) -> Iterator[KubeJson]:
    """Plain JSON requests: the typed models know nothing of newer resource.k8s.io fields."""
    api = KubeJson(kubeconfig, pool_size=4)
    yield api
    api.close()


def resource_slice(node: str, driver: str, kind: str, roots: list[int]) -> dict[str, Any]:
    """One node-local pool, as the driver's kubelet plugin would publish it."""
    devices = [
        {
            "name": f"{kind}-{i}",
            "attributes": {
                PCIE_ROOT_ATTRIBUTE: {"string": root(r)},
                f"{driver}/index": {"int": i},
            },
        }
        for i, r in enumerate(roots)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_roots() -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> PCIe root, for every device in our ResourceSlices."""
    out = {}
    for node, (gpu_roots, nic_roots) in LAYOUTS.items():
        for driver, kind, roots in ((GPU_DRIVER, "gpu", gpu_roots), (NIC_DRIVER, "nic", nic_roots)):
            for i, r in enumerate(roots):
                out[(driver, node, f"{kind}-{i}")] = root(r)
    return out


def dra_pdd(
    namespace: str, gpus: int = GPUS_PER_INSTANCE, replicas: int = PREFILL_REPLICAS
) -> PDDeployment:
    return make_pdd(
        {
            "topology": {"dra": {"enabled": True}, "placement": "none"},
            "prefill": {
                "replicas": replicas,
                "gpusPerInstance": gpus,
                "tolerations": [TOLERATION],
            },
        },
        namespace=namespace,
    )


def without_owner(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The rendered object, minus owner references (there is no PDDeployment here)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}
    return {**obj, "metadata": {**meta, "namespace": namespace}}


RESOURCE_API = "/apis/resource.k8s.io/v1"


def create(kube: KubeJson, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return kube.request("POST", path, body=body)


def delete_quietly(kube: KubeJson, path: str) -> None:
    try:
        kube.request("DELETE", path)
    except ApiException as e:
        if e.status != 404:
            raise


def pod_claim(kube: KubeJson, pod: dict[str, Any]) -> dict[str, Any] | None:
    """The ResourceClaim the controller generated for the pod's `gpu-nic` claim, once known."""
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    names = [s.get("resourceClaimName") for s in statuses if s["name"] == "gpu-nic"]
    if not names or not names[0]:
        return None
    ns = pod["metadata"]["namespace"]
    return kube.request("GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{names[0]}")


def get_pod(kube: KubeJson, ns: str, name: str) -> dict[str, Any]:
    return kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond
    return None


def results_by_request(claim: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return {r["request"]: (r["driver"], r["pool"], r["device"]) for r in results}


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dra_nodes(kube: KubeJson, node_sim: NodeSimulator) -> Iterator[list[str]]:
    """Device classes, the DRA nodes (no `nvidia.com/gpu` capacity: DRA hands out the GPUs)
    and their ResourceSlices; all removed afterwards."""
    created_classes = []
    for name, driver in DEVICE_CLASSES.items():
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
        try:
            create(kube, f"{RESOURCE_API}/deviceclasses", body)
            created_classes.append(name)
        except ApiException as e:
            if e.status != 409:  # another test's, or the chart's: same selector
                raise
    capacity = {"cpu": "128", "memory": "2Ti", "pods": "256", "ephemeral-storage": "3500Gi"}
    labels = {"nvidia.com/gpu.present": "true", "pdd.dev/dra-test": "true"}
    node_sim.add_nodes(
        SimNode(name, labels=labels, capacity=capacity, taints=[TAINT]) for name in LAYOUTS
    )
    slices = []
    for node, (gpu_roots, nic_roots) in LAYOUTS.items():
        slices.append(resource_slice(node, GPU_DRIVER, "gpu", gpu_roots))
        slices.append(resource_slice(node, NIC_DRIVER, "nic", nic_roots))
    for rslice in slices:
        delete_quietly(kube, f"{RESOURCE_API}/resourceslices/{rslice['metadata']['name']}")
        create(kube, f"{RESOURCE_API}/resourceslices", rslice)
    try:
        yield list(LAYOUTS)
    finally:
        for name in LAYOUTS:
            node_sim.delete_node(name)
        for rslice in slices:
            delete_quietly(kube, f"{RESOURCE_API}/resourceslices/{rslice['metadata']['name']}")
        for name in created_classes:
            delete_quietly(kube, f"{RESOURCE_API}/deviceclasses/{name}")


# ---------------------------------------------------------------------------- tests


def test_layout_defeats_index_pairing() -> None:
    """The fixture's premise: on every node, gpu-i and nic-i sit on different PCIe roots, so a
    scheduler (or a renderer) pairing by index would fail the tests below."""
    roots = device_roots()
    for node, (gpu_roots, _) in LAYOUTS.items():
        for i in range(len(gpu_roots)):
            assert roots[(GPU_DRIVER, node, f"gpu-{i}")] != roots[(NIC_DRIVER, node, f"nic-{i}")]


def test_scheduler_pairs_each_gpu_with_a_nic_on_its_pcie_root(
    kube: KubeJson, namespace: str, dra_nodes: list[str]
) -> None:
    pdd = dra_pdd(namespace)
    template = without_owner(render_claim_template(pdd, "prefill"), namespace)
    sts = without_owner(render_role_statefulset(pdd, "prefill", RenderContext()), namespace)
    pod_spec = sts["spec"]["template"]["spec"]
    # What the renderer asks for: GPUs only through the claim, no device-plugin resources.
    assert pod_spec["resourceClaims"] == [
        {"name": "gpu-nic", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    for container in pod_spec["containers"][:1] + pod_spec["initContainers"]:
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
        assert container["resources"]["claims"] == [{"name": "gpu-nic"}]

    account = pod_spec.get("serviceAccountName")
    if account:  # the operator creates it next to the StatefulSet
        create(
            kube, f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}}
        )
    create(kube, f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates", template)
    create(kube, f"/apis/apps/v1/namespaces/{namespace}/statefulsets", sts)

    selector = ",".join(f"{k}={v}" for k, v in sts["spec"]["selector"]["matchLabels"].items())

    def scheduled_with_claims() -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
        pods = kube.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
        )["items"]
        if len(pods) != PREFILL_REPLICAS or not all(p["spec"].get("nodeName") for p in pods):
            return None
        pairs = []
        for pod in pods:
            claim = pod_claim(kube, pod)
            if not claim or not claim.get("status", {}).get("allocation"):
                return None
            pairs.append((pod, claim))
        return pairs

    pairs = wait_for(scheduled_with_claims, 60, 0.3, "4 DRA pods bound with allocated claims")

    roots = device_roots()
    gpus: list[tuple[str, str, str]] = []
    nics: list[tuple[str, str, str]] = []
    per_node: collections.Counter[str] = collections.Counter()
    for pod, claim in pairs:
        node = pod["spec"]["nodeName"]
        assert node in GOOD_NODES, f"{pod['metadata']['name']} went to {node}"
        per_node[node] += 1
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == (
            "gpu-nic"
        )
        assert [r["uid"] for r in claim["status"].get("reservedFor", [])] == [
            pod["metadata"]["uid"]
        ]
        by_request = results_by_request(claim)
        assert set(by_request) == {
            f"{kind}-{i}" for i in range(GPUS_PER_INSTANCE) for kind in ("gpu", "nic")
        }
        for i in range(GPUS_PER_INSTANCE):
            gpu, nic = by_request[f"gpu-{i}"], by_request[f"nic-{i}"]
            assert gpu[0] == GPU_DRIVER and nic[0] == NIC_DRIVER
            assert gpu[1] == nic[1] == node, "devices come from the pod's own node"
            assert roots[gpu] == roots[nic], (
                f"{pod['metadata']['name']}: request gpu-{i} got {gpu[2]} on {roots[gpu]} "
                f"but nic-{i} got {nic[2]} on {roots[nic]}"
            )
            gpus.append(gpu)
            nics.append(nic)

    # Every GPU and every NIC handed out once: 4 pods x 2 fill both nodes exactly.
    assert len(set(gpus)) == len(gpus) == PREFILL_REPLICAS * GPUS_PER_INSTANCE
    assert len(set(nics)) == len(nics)
    assert per_node == {node: 2 for node in GOOD_NODES}


def test_node_without_a_nic_on_any_gpu_root_leaves_the_claim_unschedulable(
    kube: KubeJson, namespace: str, dra_nodes: list[str]
) -> None:
    template = without_owner(
        render_claim_template(dra_pdd(namespace, gpus=1), "prefill"), namespace
    )
    templates = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
    create(kube, templates, template)
    # The same GPU + NIC requests without the PCIe-root constraint: proves the node's devices
    # are allocatable, so the constraint alone is what keeps the first pod off it.
    unconstrained = json.loads(json.dumps(template))
    unconstrained["metadata"]["name"] = "any-gpu-any-nic"
    del unconstrained["spec"]["spec"]["devices"]["constraints"]
    create(kube, templates, unconstrained)

    def pod(name: str, claim_template: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": BAD_NODE},
                "tolerations": [TOLERATION],
                "resourceClaims": [
                    {"name": "gpu-nic", "resourceClaimTemplateName": claim_template}
                ],
                "containers": [
                    {
                        "name": "engine",
                        "image": "vllm/vllm-openai:v0.11.0",
                        "resources": {"claims": [{"name": "gpu-nic"}]},
                    }
                ],
            },
        }

    create(
        kube, f"/api/v1/namespaces/{namespace}/pods", pod("aligned", template["metadata"]["name"])
    )

    def unschedulable() -> dict[str, Any] | None:
        body = get_pod(kube, namespace, "aligned")
        cond = condition(body, "PodScheduled")
        return body if cond and cond["status"] == "False" else None

    body = wait_for(unschedulable, 30, 0.3, "PodScheduled=False for the pinned pod")
    cond = condition(body, "PodScheduled")
    assert cond is not None and cond["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in cond["message"], cond["message"]
    claim = wait_for(lambda: pod_claim(kube, body), 10, 0.2, "the generated claim")
    assert not claim.get("status", {}).get("allocation")

    create(kube, f"/api/v1/namespaces/{namespace}/pods", pod("unaligned", "any-gpu-any-nic"))

    def bound() -> dict[str, Any] | None:
        body = get_pod(kube, namespace, "unaligned")
        return body if body["spec"].get("nodeName") == BAD_NODE else None

    other = wait_for(bound, 30, 0.3, "the unconstrained pod bound to the misaligned node")
    other_claim = pod_claim(kube, other)
    assert other_claim is not None
    got = results_by_request(other_claim)
    roots = device_roots()
    assert roots[got["gpu-0"]] != roots[got["nic-0"]]

    # And the constrained pod is still not bound.
    body = get_pod(kube, namespace, "aligned")
    assert not body["spec"].get("nodeName")
    assert (condition(body, "PodScheduled") or {}).get("status") == "False"
