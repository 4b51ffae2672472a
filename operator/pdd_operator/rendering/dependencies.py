"""Which children run against which (pure). While someone else's object holds a child's name,
that child is not written, and neither is any child that would run against that object; every
other child is kept as the spec says.

A workload runs against its pods' ServiceAccount and the RoleBindings that grant that account
its rights (and so their Roles), its StatefulSet's headless Service, the Services its
containers address by DNS name, and the claim templates and gang objects its pods name. A
RoleBinding runs against its Role and the ServiceAccounts it binds. Nothing runs against a
NetworkPolicy, a PodDisruptionBudget or a Service that no workload addresses: such a child
holds only itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pdd_operator.rendering.children import WORKLOAD_KINDS
from pdd_operator.rendering.gang import VOLCANO_GROUP_ANNOTATION

Ref = tuple[str, str]  # kind, name


def held_with(taken: Collection[Ref], objects: Sequence[Mapping[str, Any]]) -> list[Ref]:
    """The children of `objects` held while the names `taken` are someone else's: those, and
    every child that runs against a held one, directly or through another; in `objects`'
    order."""
    uses = _uses_with_bindings(objects)
    held = set(taken)
    grew = True
    while grew:
        grown = {ref for ref, used in uses.items() if ref not in held and used & held}
        held |= grown
        grew = bool(grown)
    return [ref for ref in uses if ref in held]


def uses(obj: Mapping[str, Any], services: Collection[str] = ()) -> set[Ref]:
    """What one child runs against, by kind and name (`services`: the names of the
    deployment's Services, found in a workload's containers as `<name>.<namespace>.svc`)."""
    if obj["kind"] == "RoleBinding":
        role = obj.get("roleRef") or {}
        found = {(str(role.get("kind", "Role")), str(role.get("name", "")))}
        subjects = obj.get("subjects") or []
        return found | {("ServiceAccount", s["name"]) for s in subjects if _is_account(s)}
    template = (obj.get("spec") or {}).get("template")
    if obj["kind"] not in WORKLOAD_KINDS or not template:
        return set()
    pod = template.get("spec") or {}
    found = set()
    if account := pod.get("serviceAccountName"):
        found.add(("ServiceAccount", account))
    if service := obj["spec"].get("serviceName"):
        found.add(("Service", service))
    for claim in pod.get("resourceClaims") or []:
        if claim_template := claim.get("resourceClaimTemplateName"):
            found.add(("ResourceClaimTemplate", claim_template))
    if workload := (pod.get("workloadRef") or {}).get("name"):
        found.add(("Workload", workload))
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    if group := annotations.get(VOLCANO_GROUP_ANNOTATION):
        found.add(("PodGroup", group))
    namespace = obj["metadata"].get("namespace", "")
    return found | {("Service", name) for name in _addressed(pod, services, namespace)}


def _uses_with_bindings(objects: Sequence[Mapping[str, Any]]) -> dict[Ref, set[Ref]]:
    """`uses` of every child, a workload's extended by the RoleBindings of its account."""
    services = [obj["metadata"]["name"] for obj in objects if obj["kind"] == "Service"]
    found = {_ref(obj): uses(obj, services) for obj in objects}
    bindings: dict[Ref, set[Ref]] = {}
    for obj in objects:
        if obj["kind"] == "RoleBinding":
            for used in found[_ref(obj)]:
                if used[0] == "ServiceAccount":
                    bindings.setdefault(used, set()).add(_ref(obj))
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            ref = _ref(obj)
            found[ref] |= {b for used in list(found[ref]) for b in bindings.get(used, ())}
    return found


def _addressed(pod: Mapping[str, Any], services: Collection[str], namespace: str) -> set[str]:
    """The Services whose DNS name a container's command, args or env holds."""
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    text = json.dumps(containers)
    return {
        name
        for name in services
        if re.search(rf"(?<![a-z0-9-]){re.escape(name)}\.{re.escape(namespace)}\.svc\b", text)
    }


def _is_account(subject: Mapping[str, Any]) -> bool:
    return subject.get("kind") == "ServiceAccount" and bool(subject.get("name"))


def _ref(obj: Mapping[str, Any]) -> Ref:
    return (str(obj["kind"]), str(obj["metadata"]["name"]))
