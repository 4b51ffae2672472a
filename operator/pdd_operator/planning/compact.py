"""Shrink Nodes and Pods to the fields placement reads, before the operator caches them.

The operator watches every Node and every bound Pod to count free GPUs; keeping whole objects
for thousands of them would cost hundreds of MiB, these keep a few hundred bytes each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.planning.eligibility import hard_taints
from pdd_operator.planning.node_facts import pod_gpu_request


def compact_node(node: Mapping[str, Any]) -> dict[str, Any]:
    status = node.get("status", {})
    return {
        "metadata": {
            "name": node["metadata"]["name"],
            "labels": dict(node["metadata"].get("labels") or {}),
        },
        "spec": {
            "unschedulable": bool(node.get("spec", {}).get("unschedulable", False)),
            "taints": [
                {"key": t.key, "value": t.value, "effect": t.effect}
                for t in hard_taints(node.get("spec", {}).get("taints"))
            ],
        },
        "status": {
            "allocatable": {GPU_RESOURCE: (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")},
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or []
                if c.get("type") == "Ready"
            ],
        },
    }


def compact_pod(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """Only pods that hold GPUs matter; None for the rest (not indexed at all). The pod's
    effective GPU request (init containers, sidecars and overhead counted by Kubernetes'
    rule) is worked out once, here, and kept as one container's request, as the fleet's
    GPU ledger counts it (informers/fleet.py)."""
    spec = pod.get("spec", {})
    phase = pod.get("status", {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return None
    gpus = pod_gpu_request(spec)
    if not gpus:
        return None
    labels = pod.get("metadata", {}).get("labels") or {}
    return {
        "metadata": {
            "namespace": pod.get("metadata", {}).get("namespace", ""),
            "labels": {k: v for k, v in labels.items() if k == LABEL_DEPLOYMENT},
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [{"resources": {"requests": {GPU_RESOURCE: str(gpus)}}}],
        },
        "status": {"phase": phase},
    }
