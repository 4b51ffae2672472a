"""The kinds of object the operator writes or reads, and what a child kind is: its API path,
its stage in a pass's applies, and why the operator may write it (the comment above its RBAC
rule). A renderer of children is a `ChildPart`: the kinds it makes and its render function.

A child kind that one part makes is declared in that part's module; the kinds several parts
make are declared here. So a new child kind is a `Kind` beside its renderer (and, for a new
renderer, its part's line in rendering.children.PARTS): its RBAC rule (`make generate`), its
informer, its apply wave and whether it waits for the engines' prerequisites follow from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdd_operator.api.v1alpha1 import PDDeployment
    from pdd_operator.rendering.context import RenderContext


class Stage(IntEnum):
    """When a child is applied in a pass, in this order."""

    REFERENCED = 0  # named by other children (a binding's Role, a pod's ServiceAccount)
    USED = 1  # what pods run against: Services, policies, claim templates, bindings
    ADMITS_PODS = 2  # the gang objects the scheduler admits the pods by
    MAKES_PODS = 3  # the workloads: their pods must find everything above in place


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    # A child kind's reason to be in the operator's RBAC, the comment above its rule in the
    # chart (`make generate` writes those rules from the child kinds: charts/pdd-operator/
    # templates/_child-rules.tpl).
    why: str = ""
    stage: Stage | None = None  # a child kind's; None for the kinds the operator only reads

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    @property
    def version(self) -> str:
        return self.api_version.split("/")[-1]

    @property
    def makes_pods(self) -> bool:
        """A workload or a gang object: what waits for the engines' prerequisites."""
        return self.stage is not None and self.stage >= Stage.ADMITS_PODS

    def path(self, namespace: str | None, name: str | None = None, subresource: str = "") -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


Render = Callable[["PDDeployment", "RenderContext"], list[dict[str, Any]]]


@dataclass(frozen=True)
class ChildPart:
    """A renderer of children: the kinds it may make (tests/unit/test_child_parts.py holds
    every rendered object to them) and how it renders them."""

    name: str
    kinds: tuple[Kind, ...]
    render: Render


# The kinds more than one part makes.
SERVICE_ACCOUNT = Kind(
    "v1",
    "ServiceAccount",
    "serviceaccounts",
    why="The sidecars' and the router's accounts (rendering.access, rendering.router).",
    stage=Stage.REFERENCED,
)
ROLE = Kind(
    "rbac.authorization.k8s.io/v1",
    "Role",
    "roles",
    why="Per-deployment Roles that let the sidecars and the router discover their peers.",
    stage=Stage.REFERENCED,
)
ROLE_BINDING = Kind(
    "rbac.authorization.k8s.io/v1",
    "RoleBinding",
    "rolebindings",
    why="Their bindings to the deployment's accounts.",
    stage=Stage.USED,
)
ACCESS_KINDS = (SERVICE_ACCOUNT, ROLE, ROLE_BINDING)  # rendering.access.render_account's
STATEFUL_SET = Kind(
    "apps/v1",
    "StatefulSet",
    "statefulsets",
    why="The engine pods: one per role, or per instance over several nodes.",
    stage=Stage.MAKES_PODS,
)
SERVICE = Kind(
    "v1", "Service", "services", why="The roles' and the router's Services.", stage=Stage.USED
)
