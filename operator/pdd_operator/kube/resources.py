"""The kinds the operator creates, and the URL path of each (no discovery round trips)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    # A child kind's reason to be in the operator's RBAC, the comment above its rule in the
    # chart (`make generate` writes those rules from CHILD_KINDS: charts/pdd-operator/
    # templates/_child-rules.tpl).
    why: str = ""

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    @property
    def version(self) -> str:
        return self.api_version.split("/")[-1]

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


CHILD_KINDS: tuple[Kind, ...] = (
    Kind(
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        why="The sidecars' and the router's accounts (rendering.access, rendering.router).",
    ),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "Role",
        "roles",
        why="Per-deployment Roles that let the sidecars and the router discover their peers.",
    ),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "rolebindings",
        why="Their bindings to the deployment's accounts.",
    ),
    Kind(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "networkpolicies",
        why="Who may reach the KV transfer and side-channel ports, and the router.",
    ),
    Kind(
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        why="GPU + NIC on one PCIe root through DRA (spec.topology.dra).",
    ),
    # Gang scheduling of instances over several nodes (rendering.gang); served only where the
    # cluster has them (Kubernetes' Workload API behind its feature gate, Volcano).
    Kind(
        "scheduling.k8s.io/v1alpha1",
        "Workload",
        "workloads",
        why="Gang scheduling of instances over several nodes (spec.scheduling.gang: native).",
    ),
    Kind(
        "scheduling.volcano.sh/v1beta1",
        "PodGroup",
        "podgroups",
        why="Gang scheduling through Volcano (spec.scheduling.gang: volcano).",
    ),
    Kind(
        "apps/v1",
        "StatefulSet",
        "statefulsets",
        why="The engine pods: one per role, or per instance over several nodes.",
    ),
    Kind("v1", "Service", "services", why="The roles' and the router's Services."),
    Kind("apps/v1", "Deployment", "deployments", why="The router."),
    Kind(
        "policy/v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        why="Each role's disruption budget.",
    ),
)
# What the operator does with its children: server-side apply (patch), create, prune (delete),
# and its informers watch them (only its own: a label selector).
CHILD_VERBS = ("get", "list", "watch", "create", "patch", "update", "delete")
SECRET = Kind("v1", "Secret", "secrets")
POD = Kind("v1", "Pod", "pods")
NODE = Kind("v1", "Node", "nodes", namespaced=False)
PERSISTENT_VOLUME_CLAIM = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
EVENT = Kind("v1", "Event", "events")
# The leader election's lock (kube/lease.py): one Lease in the operator's own namespace.
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
PDDEPLOYMENT = Kind("pdd.dev/v1alpha1", "PDDeployment", "pddeployments")
# Scale targets: created once and then written by the HPA/KEDA (spec) and the operator
# (status), never server-side applied, so not among CHILD_KINDS.
ROLE_SCALER = Kind("pdd.dev/v1alpha1", "PDDRoleScaler", "pddrolescalers")

# The chart's name-guard policy and its binding (read once at start-up: is it in force?).
ADMISSION_POLICY = Kind(
    "admissionregistration.k8s.io/v1",
    "ValidatingAdmissionPolicy",
    "validatingadmissionpolicies",
    namespaced=False,
)
ADMISSION_POLICY_BINDING = Kind(
    "admissionregistration.k8s.io/v1",
    "ValidatingAdmissionPolicyBinding",
    "validatingadmissionpolicybindings",
    namespaced=False,
)

_BY_KEY = {(k.api_version, k.kind): k for k in (*CHILD_KINDS, SECRET, PDDEPLOYMENT, ROLE_SCALER)}


def kind_of(api_version: str, kind: str) -> Kind:
    return _BY_KEY[(api_version, kind)]
