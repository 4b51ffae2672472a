"""Shrink Nodes and Pods to the fields placement reads, before the operator caches them.

The operator watches every Node and every bound Pod to count free GPUs; keeping whole objects
for thousands of them would cost hundreds of MiB, these keep a few hundred bytes each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdd_contract.labels import LABEL_DEPLOYMENT
from pdd_contract.resources import GPU_RESOURCE


def compact_node(node: Mapping[str, Any]) -> dict[str, Any]:
    status = node.get("status", {})
    return {
        "metadata": {
            "name": node["metadata"]["name"],
            "labels": dict(node["metadata"].get("labels") or {}),
        },
        "spec": {"unschedulable": bool(node.get("spec", {}).get("unschedulable", False))},
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
    """Only pods that hold GPUs matter; None for the rest (not indexed at all)."""
    spec = pod.get("spec", {})
    phase = pod.get("status", {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return None
    containers = [_gpu_only(c) for c in spec.get("containers") or []]
    inits = [_gpu_only(c) for c in spec.get("initContainers") or []]
    if not any(_has_gpu(c) for c in containers + inits):
        return None
    labels = pod.get("metadata", {}).get("labels") or {}
    return {
        "metadata": {
            "namespace": pod.get("metadata", {}).get("namespace", ""),
            "labels": {k: v for k, v in labels.items() if k == LABEL_DEPLOYMENT},
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": containers,
            "initContainers": inits,
            "overhead": {GPU_RESOURCE: overhead}
            if (overhead := (spec.get("overhead") or {}).get(GPU_RESOURCE))
            else {},
        },
        "status": {"phase": phase},
    }


def _gpu_only(container: Mapping[str, Any]) -> dict[str, Any]:
    """GPU requests/limits, and restartPolicy: a sidecar init container (Always) holds its
    GPUs for the pod's lifetime, so it counts like an app container."""
    resources = container.get("resources") or {}
    out: dict[str, Any] = {
        "resources": {
            part: {GPU_RESOURCE: values[GPU_RESOURCE]}
            for part in ("requests", "limits")
            if GPU_RESOURCE in (values := resources.get(part) or {})
        }
    }
    if container.get("restartPolicy"):
        out["restartPolicy"] = container["restartPolicy"]
    return out


def _has_gpu(container: Mapping[str, Any]) -> bool:
    return bool(container["resources"])
