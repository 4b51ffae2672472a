"""The kinds the operator writes and reads, and the URL path of each (no discovery round trips).
The child kinds are declared by the parts that render them (rendering.kinds)."""

from __future__ import annotations

# Re-exported: the child kinds come from the parts that render them.
from pdd_operator.rendering.children import CHILD_KINDS as CHILD_KINDS
from pdd_operator.rendering.kinds import Kind as Kind

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
