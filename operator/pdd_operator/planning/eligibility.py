"""Which nodes a role's pods may go to, decided as the scheduler decides it: the node's labels
against the pods' nodeSelector, and its taints against their tolerations (pure).

The planner counts a domain's room only on nodes a role's pods can be scheduled to: a node
tainted for another tenant is not free GPUs for us, and a slice planned there would stay
Pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdd_contract.resources import GPU_RESOURCE
from pdd_operator.api.v1alpha1 import RoleSpec

# The scheduler refuses a node over these effects; PreferNoSchedule only steers its scoring.
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule: an empty effect or key matches any; Exists matches any value,
        Equal the same value; an operator it does not know matches nothing."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator == "Equal" and self.value == taint.value


# Every GPU pod of ours carries this one (rendering/roles.py), as the ExtendedResourceToleration
# admission plugin would add it where enabled: GPU nodes are commonly tainted so, to keep pods
# that need no GPU off them.
GPU_TOLERATION = Toleration(GPU_RESOURCE, "Exists", effect="NoSchedule")

# DefaultTolerationSeconds gives every pod these (for 300 s): a node that just went not-ready
# or unreachable does not refuse pods yet. Such nodes are not planned on anyway (not Ready).
ADMITTED = (
    Toleration("node.kubernetes.io/not-ready", "Exists", effect="NoExecute"),
    Toleration("node.kubernetes.io/unreachable", "Exists", effect="NoExecute"),
)


def hard_taints(raw: object) -> tuple[Taint, ...]:
    """A Node's spec.taints as the scheduler's filter reads them (hard effects only)."""
    if not isinstance(raw, list):
        return ()
    return tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"]))
        for t in raw
        if isinstance(t, Mapping) and t.get("effect") in HARD_EFFECTS
    )


@dataclass(frozen=True)
class RoleNodes:
    """What a role's pods ask of a node: labels (nodeSelector) and tolerated taints."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def accepts(self, labels: Mapping[str, str], taints: Sequence[Taint]) -> bool:
        return self.refusal(labels, taints) is None

    def refusal(self, labels: Mapping[str, str], taints: Sequence[Taint]) -> str | None:
        """Why the pods cannot go to a node with these labels and taints, said of the nodes
        ("without the label pool=a"); None when they can."""
        for key, value in self.node_selector:
            if labels.get(key) != value:
                return f"without the label {key}={value}"
        for taint in taints:
            if not any(t.tolerates(taint) for t in (*self.tolerations, *ADMITTED)):
                return f"with the taint {taint}, which they do not tolerate"
        return None


def role_nodes(role: RoleSpec, gpu_pods: bool = True) -> RoleNodes:
    """The role's nodeSelector and tolerations as its pods will have them (rendering/roles.py):
    a podTemplate's nodeSelector merges over the role's and its tolerations replace them
    (rendering/merge.py; null removes either), and GPU pods (`gpu_pods`: the device plugin's
    GPUs, not DRA's) tolerate GPU_TOLERATION."""
    template_spec = (role.podTemplate or {}).get("spec")
    template = template_spec if isinstance(template_spec, Mapping) else {}
    selector: dict[str, str] = dict(role.nodeSelector)
    if "nodeSelector" in template:
        merged = template["nodeSelector"]
        selector = {**selector, **_strings(merged)} if isinstance(merged, Mapping) else {}
    tolerations: list[Mapping[str, Any]] = [
        t.model_dump(exclude_none=True) for t in role.tolerations
    ]
    if "tolerations" in template:
        given = template["tolerations"]
        tolerations = (
            [t for t in given if isinstance(t, Mapping)] if isinstance(given, list) else []
        )
    return RoleNodes(
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(_toleration(t) for t in tolerations)
        + ((GPU_TOLERATION,) if gpu_pods else ()),
    )


def _toleration(raw: Mapping[str, Any]) -> Toleration:
    return Toleration(
        key=str(raw.get("key") or ""),
        operator=str(raw.get("operator") or "Equal"),
        value=str(raw.get("value") or ""),
        effect=str(raw.get("effect") or ""),
    )


def _strings(value: Mapping[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()}
