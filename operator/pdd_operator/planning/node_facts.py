"""Build the planner's NodeFacts from raw Node and Pod objects (pure, one pass over each list).

GPUs in use are counted the way the scheduler counts them (the pod's effective request), so the
planner's idea of free GPUs matches what the scheduler will admit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from math import ceil
from typing import Any, TypeVar

from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.api.names import DeploymentKey
from pdd_operator.planning.eligibility import hard_taints
from pdd_operator.planning.placement import NodeFacts

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})
K = TypeVar("K")


def node_facts(nodes: Iterable[Mapping[str, Any]]) -> list[NodeFacts]:
    """NodeFacts for every Node, with no GPU in use: `with_usage` adds what the pods hold
    (Nodes change rarely, GPU use with every pod, so the two are built apart)."""
    facts: list[NodeFacts] = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        status = node.get("status") or {}
        facts.append(
            NodeFacts(
                name=name,
                labels=dict(meta.get("labels") or {}),
                allocatable_gpus=quantity_count(
                    (status.get("allocatable") or {}).get(GPU_RESOURCE)
                ),
                used_gpus=0,
                ready=_is_ready(status),
                schedulable=not (node.get("spec") or {}).get("unschedulable", False),
                taints=hard_taints((node.get("spec") or {}).get("taints")),
            )
        )
    return facts


# What one bound pod holds: its node, its GPUs, and the deployment it belongs to (if any).
Holding = tuple[str, int, DeploymentKey | None]


@dataclass(frozen=True)
class GpuUsage:
    """GPUs held by bound, unfinished pods: per node, and per PDDeployment per node."""

    used: dict[str, int]
    held: dict[DeploymentKey, dict[str, int]]  # {(namespace, name): {node: gpus}}

    def add(self, node: str, gpus: int, deployment: DeploymentKey | None = None) -> None:
        """A bound pod's GPUs on `node`, held by `deployment` when it has one."""
        add_to_count(self.used, node, gpus)
        if deployment is not None:
            add_to_count(self.held.setdefault(deployment, {}), node, gpus)
            if not self.held[deployment]:
                del self.held[deployment]

    def remove(self, node: str, gpus: int, deployment: DeploymentKey | None = None) -> None:
        """What `add` counted, taken back (the pod finished, moved or went)."""
        self.add(node, -gpus, deployment)

    def copy(self) -> GpuUsage:
        return GpuUsage(dict(self.used), {key: dict(nodes) for key, nodes in self.held.items()})


def add_to_count(counts: dict[K, int], key: K, delta: int) -> None:
    """Add to a count kept by key; a count back at zero goes (a node no pod holds, a domain
    nobody reserves, is not listed)."""
    total = counts.get(key, 0) + delta
    if total:
        counts[key] = total
    else:
        counts.pop(key, None)


def pod_holding(pod: Mapping[str, Any], deployment_label: str | None = None) -> Holding | None:
    """The GPUs a pod holds and where; None while it is unbound, once it finished, and for a
    pod without GPUs. The deployment is the value of `deployment_label`, when given."""
    spec = pod.get("spec") or {}
    node_name = spec.get("nodeName")
    if not node_name or (pod.get("status") or {}).get("phase") in TERMINATED_PHASES:
        return None
    gpus = pod_gpu_request(spec)
    if not gpus:
        return None
    owner = _labels(pod).get(deployment_label) if deployment_label else None
    namespace = (pod.get("metadata") or {}).get("namespace") or ""
    return node_name, gpus, (namespace, owner) if owner else None


def gpu_usage(pods: Iterable[Mapping[str, Any]], deployment_label: str | None = None) -> GpuUsage:
    """One pass over the pods: the count by definition (the operator keeps it current event by
    event in informers/fleet.GpuLedger, and the tests hold the two to each other). `held` (by
    the value of `deployment_label`, when given) comes from the same pods as `used`, so that
    what a plan counts as its own (free to place again) or as another slice's (reserved until
    bound) matches the used GPUs it sees."""
    usage = GpuUsage({}, {})
    for pod in pods:
        if (holding := pod_holding(pod, deployment_label)) is not None:
            usage.add(*holding)
    return usage


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def with_usage(
    bases: Sequence[NodeFacts], used: Mapping[str, int], last: Sequence[NodeFacts] = ()
) -> list[NodeFacts]:
    """The nodes (as built by node_facts without pods) with their GPUs in use. `last`, an
    earlier result over the same bases, lends the nodes whose count is unchanged: copying
    every node of a large fleet for each new count cost more than the count itself."""
    lent = last if len(last) == len(bases) else [None] * len(bases)
    return [_counted(n, used.get(n.name, 0), before) for n, before in zip(bases, lent, strict=True)]


def _counted(base: NodeFacts, gpus: int, before: NodeFacts | None) -> NodeFacts:
    if before is not None and before.name == base.name and before.used_gpus == gpus:
        return before
    return replace(base, used_gpus=gpus) if gpus else base


def pod_gpu_request(pod_spec: Mapping[str, Any]) -> int:
    """The pod's effective nvidia.com/gpu request, by Kubernetes' rule.

    max(sum of app containers + restartable init containers (sidecars), each regular init
    container + the sidecars started before it), plus the pod overhead.
    """
    app = sum(_container_gpus(c) for c in pod_spec.get("containers") or [])
    sidecars = 0
    init_peak = 0
    for container in pod_spec.get("initContainers") or []:
        gpus = _container_gpus(container)
        if container.get("restartPolicy") == "Always":
            app += gpus  # a sidecar keeps running beside the app containers
            sidecars += gpus
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, gpus + sidecars)
    overhead = quantity_count((pod_spec.get("overhead") or {}).get(GPU_RESOURCE))
    return max(app, init_peak) + overhead


def _container_gpus(container: Mapping[str, Any]) -> int:
    # Extended resources: requests default to limits and must equal them when both are set.
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    if GPU_RESOURCE in requests:
        return quantity_count(requests[GPU_RESOURCE])
    return quantity_count((resources.get("limits") or {}).get(GPU_RESOURCE))


def _is_ready(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


_SUFFIXES = {
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "m": Decimal(10) ** -3,
}


def quantity_count(value: object) -> int:
    """A count from a Kubernetes quantity ("8", 8, "1k"); rounded up; 0 when absent or invalid."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    text = str(value).strip()
    if text.isascii() and text.isdigit():  # the usual case ("8"), without Decimal's cost
        return int(text)
    multiplier = Decimal(1)
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "m"):
        if text.endswith(suffix):
            text, multiplier = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    try:
        number = Decimal(text) * multiplier
    except InvalidOperation:
        return 0
    if not number.is_finite() or number <= 0:
        return 0
    return ceil(number)
