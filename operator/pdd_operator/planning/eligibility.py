"""Which nodes a role's pods may go to, decided as the scheduler decides it: the node's labels
against the pods' nodeSelector, and its taints against their tolerations (pure).

The planner counts a domain's room only on nodes a role's pods can be scheduled to: a node
tainted for another tenant is not free GPUs for us, and a slice planned there would stay
Pending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
        """Kubernetes' rule: an empty effect or key matches any; Exists matches any value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


# Tolerations the API server's default admission plugins give every pod of ours, whatever the
# spec says: ExtendedResourceToleration for the GPUs it requests (managed clusters such as GKE
# taint GPU nodes nvidia.com/gpu:NoSchedule and rely on it), DefaultTolerationSeconds for a
# node that went not-ready or unreachable.
ADMITTED = (
    Toleration(GPU_RESOURCE, "Exists", effect="NoSchedule"),
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


ANY_NODE = RoleNodes()


def role_nodes(role: RoleSpec) -> RoleNodes:
    """The role's nodeSelector and tolerations as its pods will have them: a podTemplate's
    nodeSelector merges over the role's, its tolerations replace them (rendering/merge.py)."""
    template_spec = (role.podTemplate or {}).get("spec")
    template = template_spec if isinstance(template_spec, Mapping) else {}
    selector = {**role.nodeSelector, **_strings(template.get("nodeSelector"))}
    tolerations: Iterable[Mapping[str, Any]] = [
        t.model_dump(exclude_none=True) for t in role.tolerations
    ]
    if isinstance(template.get("tolerations"), list):
        tolerations = [t for t in template["tolerations"] if isinstance(t, Mapping)]
    return RoleNodes(
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in tolerations
        ),
    )


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}
