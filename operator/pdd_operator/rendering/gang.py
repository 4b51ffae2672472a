"""All or nothing: the pods of one instance that spans nodes are scheduled together or not at
all (spec.scheduling.gang), pure.

- `native`: Kubernetes' own gang scheduling (v1.35 alpha: feature gates GenericWorkload and
  GangScheduling, API scheduling.k8s.io/v1alpha1). One Workload per role with one gang pod
  group of minCount = nodesPerInstance; each instance's pods name it in `spec.workloadRef`
  with the instance index as `podGroupReplicaKey`, so the scheduler gangs every instance on
  its own (kube-scheduler's workload manager keys pod groups by replica key).
- `kueue`: Kueue's pod groups (v0.17): the queue label and, per instance, the pod-group name
  label and total-count annotation; Kueue admits an instance's pods as one workload.
- `volcano`: one Volcano PodGroup per instance (minMember = nodesPerInstance), named by the
  pods' `scheduling.k8s.io/group-name` annotation, and schedulerName `volcano`.
- `none`: nothing; an instance may start with some ranks pending.
Instances of one node are never gangs: a single pod is all or nothing by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import GROUP, KIND, PDDeployment
from pdd_operator.engines.base import role_spec
from pdd_operator.rendering.kinds import ChildPart, Kind, Stage
from pdd_operator.rendering.meta import child_metadata

WORKLOAD_API = "scheduling.k8s.io/v1alpha1"
POD_GROUP = "instance"  # the one pod group of a role's Workload; instances are its replicas
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"


@dataclass(frozen=True)
class GangPodFields:
    """What an instance's pod template carries for its gang scheduler."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)


def gang_pod_fields(pdd: PDDeployment, role: str, index: int) -> GangPodFields:
    scheduling = pdd.spec.scheduling
    nodes = role_spec(pdd.spec, role).nodesPerInstance
    instance = names.instance_name(pdd.name, role, index)
    if scheduling.gang == "native":
        ref = {
            "name": names.role_name(pdd.name, role),
            "podGroup": POD_GROUP,
            "podGroupReplicaKey": str(index),
        }
        return GangPodFields(spec={"workloadRef": ref})
    if scheduling.gang == "kueue":
        labels = {KUEUE_QUEUE_LABEL: scheduling.queueName or "", KUEUE_GROUP_LABEL: instance}
        return GangPodFields(labels=labels, annotations={KUEUE_COUNT_ANNOTATION: str(nodes)})
    if scheduling.gang == "volcano":
        return GangPodFields(
            annotations={VOLCANO_GROUP_ANNOTATION: instance},
            spec={"schedulerName": VOLCANO_SCHEDULER},
        )
    return GangPodFields()


def render_gang_objects(pdd: PDDeployment) -> list[dict[str, Any]]:
    """The gang objects of every role whose instances span nodes."""
    out: list[dict[str, Any]] = []
    for role in names.ROLES:
        rspec = role_spec(pdd.spec, role)
        if rspec.nodesPerInstance < 2 or rspec.replicas == 0:
            continue
        if pdd.spec.scheduling.gang == "native":
            out.append(render_workload(pdd, role))
        elif pdd.spec.scheduling.gang == "volcano":
            out += [render_volcano_group(pdd, role, i) for i in range(rspec.replicas)]
    return out


def render_workload(pdd: PDDeployment, role: str) -> dict[str, Any]:
    nodes = role_spec(pdd.spec, role).nodesPerInstance
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": child_metadata(pdd, names.role_name(pdd.name, role), role),
        "spec": {
            "controllerRef": {"apiGroup": GROUP, "kind": KIND, "name": pdd.name},
            "podGroups": [{"name": POD_GROUP, "policy": {"gang": {"minCount": nodes}}}],
        },
    }


def render_volcano_group(pdd: PDDeployment, role: str, index: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": role_spec(pdd.spec, role).nodesPerInstance}
    if pdd.spec.scheduling.queueName:
        spec["queue"] = pdd.spec.scheduling.queueName
    return {
        "apiVersion": VOLCANO_API,
        "kind": "PodGroup",
        "metadata": child_metadata(pdd, names.instance_name(pdd.name, role, index), role),
        "spec": spec,
    }


# Served only where the cluster has them (Kubernetes' Workload API behind its feature gate,
# Volcano).
WORKLOAD = Kind(
    "scheduling.k8s.io/v1alpha1",
    "Workload",
    "workloads",
    why="Gang scheduling of instances over several nodes (spec.scheduling.gang: native).",
    stage=Stage.ADMITS_PODS,
)
VOLCANO_POD_GROUP = Kind(
    "scheduling.volcano.sh/v1beta1",
    "PodGroup",
    "podgroups",
    why="Gang scheduling through Volcano (spec.scheduling.gang: volcano).",
    stage=Stage.ADMITS_PODS,
)
PART = ChildPart(
    "gang objects", (WORKLOAD, VOLCANO_POD_GROUP), lambda pdd, ctx: render_gang_objects(pdd)
)
