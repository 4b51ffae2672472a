"""Child object names and labels, derived so they always fit Kubernetes' limits.

A StatefulSet's name plus the 11 characters of its `controller-revision-hash` suffix must stay a
63-character label value, and Service names must be DNS-1035 labels (start with a letter, no
dots), while a PDDeployment may be named with up to 253 characters and dots. So every child
name starts from `instance_id`: the name itself when short and label-safe, else a readable
prefix plus a hash of the full name (stable, and distinct for names sharing a prefix).

Two PDDeployments of one namespace never share an instance id (they would fight over the same
children): a name kept as it is never ends in `-<8 hex>`, the shape of a hashed one, so a name
spelled like another's hashed id (`a-b-1234abcd` beside `a.b`) is hashed too. Past that only a
32-bit hash collision is left, which the reconciler refuses like any other taken name. No
suffix appended to the id is the end of another suffix, so distinct ids give distinct children.
"""

from __future__ import annotations

import hashlib
import re

# The pod labels and probe annotations are shared with the sidecar: their keys live in the
# contract, re-exported here with the operator's own keys so its modules find all in one place.
from pdd_contract.labels import ANNOTATION_PROBE_PEER as ANNOTATION_PROBE_PEER
from pdd_contract.labels import ANNOTATION_PROBE_REQUEST as ANNOTATION_PROBE_REQUEST
from pdd_contract.labels import ANNOTATION_PROBE_RESULT as ANNOTATION_PROBE_RESULT
from pdd_contract.labels import LABEL_DEPLOYMENT as LABEL_DEPLOYMENT
from pdd_contract.labels import LABEL_INSTANCE as LABEL_INSTANCE
from pdd_contract.labels import LABEL_POD_INDEX as LABEL_POD_INDEX
from pdd_contract.labels import LABEL_REVISION as LABEL_REVISION
from pdd_contract.labels import LABEL_ROLE as LABEL_ROLE

# How the operator's indexes and caches key a PDDeployment: (namespace, name).
DeploymentKey = tuple[str, str]

MAX_INSTANCE_ID = 40  # + "-prefill" (8) stays under the 52 a StatefulSet name may use
MANAGED_BY = "pdd-operator"
# The operator's own bookkeeping on its children; nothing else reads them.
ANNOTATION_OWNER_NAME = "pdd.dev/deployment-name"
ANNOTATION_APPLIED_HASH = "pdd.dev/applied-hash"
# The slice (index >= 1) a pod beyond the deployment's home domain belongs to; pods of the
# home slice carry none (their template is what it was before slices existed).
LABEL_SLICE = "pdd.dev/slice"
LABEL_APP_INSTANCE = "app.kubernetes.io/instance"


def prober_pod_name(name: str, prefill_nodes: int = 1) -> str:
    """The pod whose sidecar runs the transfer probe: the first prefill pod, the leader of
    the first instance where prefill instances span nodes."""
    if prefill_nodes > 1:
        return f"{instance_name(name, 'prefill', 0)}-0"
    return f"{role_name(name, 'prefill')}-0"


def rank_pod_name(name: str, role: str, nodes: int, instance: int, rank: int) -> str:
    """A role's pod by instance and rank: `<id>-<role>-<i>-<rank>` where instances span
    nodes, else the role StatefulSet's `<id>-<role>-<i>` (rank 0)."""
    if nodes > 1:
        return f"{instance_name(name, role, instance)}-{rank}"
    return f"{role_name(name, role)}-{instance}"


ROLES = ("prefill", "decode")


# The tail instance_id gives a hashed name: a name that ends like it is hashed too.
_HASHED = re.compile(r"-[0-9a-f]{8}$")


def instance_id(name: str) -> str:
    safe = re.sub(r"[^a-z0-9-]", "-", name.lower())
    if not safe[:1].isalpha():
        safe = "pdd-" + safe
    if safe == name and len(safe) <= MAX_INSTANCE_ID and not _HASHED.search(safe):
        return safe
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{safe[: MAX_INSTANCE_ID - 9].rstrip('-')}-{digest}"


def role_name(name: str, role: str) -> str:
    """StatefulSet and headless Service of a role (and the router's Deployment/Service)."""
    return f"{instance_id(name)}-{role}"


def slice_name(name: str, role: str, index: int) -> str:
    """StatefulSet of a role (or the router's Deployment) in slice `index` >= 1: its pods are
    `<this>-<ordinal>` (`<id>-prefill-s99` is 52 characters at most)."""
    return f"{role_name(name, role)}-s{index}"


def slice_instance(name: str, index: int) -> str:
    """The app.kubernetes.io/instance of a slice's pods: the home slice's is the instance id,
    so a router selecting on it pairs only the home slice's pods."""
    return instance_id(name) if index == 0 else f"{instance_id(name)}-s{index}"


def instance_name(name: str, role: str, index: int) -> str:
    """StatefulSet and headless Service of one instance that spans nodes: its pods are
    `<this>-<rank>`, rank 0 the leader (`<id>-prefill-511` is 52 characters at most)."""
    return f"{role_name(name, role)}-{index}"


def token_secret_name(name: str, uid: str) -> str:
    """The sidecar token Secret, with the PDDeployment's uid in its name: the operator may
    create Secrets but not read them, so it could not tell a Secret of this name that someone
    made beforehand (and whose token they know) from its own; one named after a uid that did
    not exist before the PDDeployment cannot have been made beforehand."""
    return f"{instance_id(name)}-sidecar-token-{uid[:8]}"


def sidecar_account_name(name: str) -> str:
    return f"{instance_id(name)}-sidecar"


def router_account_name(name: str) -> str:
    """ServiceAccount, Role and RoleBinding of the router (its pod discovery)."""
    return f"{instance_id(name)}-router"


def network_policy_name(name: str) -> str:
    return f"{instance_id(name)}-kv-transfer"


def pdb_name(name: str, role: str) -> str:
    return f"{instance_id(name)}-{role}"


def claim_template_name(name: str, role: str) -> str:
    return f"{instance_id(name)}-{role}-gpu-nic"


def selector_labels(name: str, role: str | None = None) -> dict[str, str]:
    labels = {LABEL_DEPLOYMENT: instance_id(name)}
    if role:
        labels[LABEL_ROLE] = role
    return labels


def common_labels(name: str, component: str) -> dict[str, str]:
    """Recommended labels plus the pdd.dev ones the operator selects on."""
    return {
        "app.kubernetes.io/name": "pdd",
        LABEL_APP_INSTANCE: instance_id(name),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "pdd",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector_labels(name, component),
    }
