"""DRA mode: one ResourceClaimTemplate per role asking for each GPU together with a NIC on the
same PCIe root (`matchAttribute: resource.kubernetes.io/pcieRoot`), instead of device-plugin
resources. NVIDIA's GPU DRA driver and dranet publish that attribute on their devices."""

from __future__ import annotations

from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.rendering.kinds import ChildPart, Kind, Stage
from pdd_operator.rendering.roles import child_metadata

PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


def render_claim_templates(pdd: PDDeployment) -> list[dict[str, Any]]:
    if not pdd.spec.topology.dra.enabled:
        return []
    return [render_claim_template(pdd, role) for role in names.ROLES]


def render_claim_template(pdd: PDDeployment, role: str) -> dict[str, Any]:
    dra = pdd.spec.topology.dra
    gpus = role_spec(pdd.spec, role).gpusPerInstance
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    for i in range(gpus):
        gpu, nic = f"gpu-{i}", f"nic-{i}"
        requests.append({"name": gpu, "exactly": {"deviceClassName": dra.gpuDeviceClass}})
        requests.append({"name": nic, "exactly": {"deviceClassName": dra.nicDeviceClass}})
        constraints.append({"requests": [gpu, nic], "matchAttribute": PCIE_ROOT_ATTRIBUTE})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": child_metadata(pdd, names.claim_template_name(pdd.name, role), role),
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}},
    }


RESOURCE_CLAIM_TEMPLATE = Kind(
    "resource.k8s.io/v1",
    "ResourceClaimTemplate",
    "resourceclaimtemplates",
    why="GPU + NIC on one PCIe root through DRA (spec.topology.dra).",
    stage=Stage.USED,
)
PART = ChildPart(
    "claim templates", (RESOURCE_CLAIM_TEMPLATE,), lambda pdd, ctx: render_claim_templates(pdd)
)
