"""The scale targets of an autoscaled PDDeployment (pure): one PDDRoleScaler per role that
scales on its own (planning.autoscaling.scale_target_roles), and the status the operator
writes there.

A scaler is created once, at the count its role starts at, and its spec is then the HPA's
(or KEDA's, or `kubectl scale`'s): the operator never applies it again, so it never takes a
scaled count back. Its status says what runs; `status.selector` selects every pod of the role
(all revisions: an HPA averages a pod metric over the pods a rollout is moving too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import API_VERSION, SCALER_KIND, PDDeployment
from pdd_operator.planning.autoscaling import ScalingPlan, initial_replicas
from pdd_operator.rendering.children import owner_reference


def scaler_name(pdd_name: str, role: str) -> str:
    """`<deployment>-<role>`, as the role's StatefulSet: `kubectl scale pddrs/llama-decode`."""
    return names.role_name(pdd_name, role)


def render_scaler(pdd: PDDeployment, role: str) -> dict[str, Any]:
    """A new scale target, at the count the role starts at."""
    return {
        "apiVersion": API_VERSION,
        "kind": SCALER_KIND,
        "metadata": {
            "name": scaler_name(pdd.name, role),
            "namespace": pdd.namespace,
            "labels": names.common_labels(pdd.name, role),
            "annotations": {names.ANNOTATION_OWNER_NAME: pdd.name},
            "ownerReferences": [owner_reference(pdd)],
        },
        "spec": {
            "deployment": pdd.name,
            "role": role,
            "replicas": initial_replicas(pdd.spec, role),
        },
    }


def role_selector(pdd_name: str, role: str) -> str:
    """The label selector of the role's pods, as a string (the /scale subresource's form)."""
    labels = names.selector_labels(pdd_name, role)
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def scaler_status(
    pdd: PDDeployment, role: str, plan: ScalingPlan, ready: Mapping[str, int]
) -> dict[str, Any]:
    """What a role's scale target shows: the count run, how many are ready, its pods'
    selector, and why the count is not what was asked for (bounds, ratio)."""
    return {
        "replicas": plan.replicas[role],
        "readyReplicas": ready.get(role, 0),
        "selector": role_selector(pdd.name, role),
        "message": plan.notes.get(role, ""),
    }
