"""What runs against what (rendering.dependencies): a name conflict holds its child and the
children that would run against the object holding it, and nothing else."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from helpers.factories import BASE_BODY
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.dependencies import Ref, held_with, uses

NS = "team-a"


def meta(name: str) -> dict[str, Any]:
    return {"name": name, "namespace": NS}


def statefulset(name: str, account: str = "", service: str = "", **pod: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}], **pod}
    if account:
        spec["serviceAccountName"] = account
    body: dict[str, Any] = {"template": {"spec": spec}}
    if service:
        body["serviceName"] = service
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(name), "spec": body}


def binding(name: str, role: str, *accounts: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": a, "namespace": NS} for a in accounts],
    }


def plain(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": meta(name)}


@pytest.mark.parametrize(
    "obj,services,expected",
    [
        (plain("NetworkPolicy", "np"), [], set()),
        (plain("Service", "svc"), [], set()),
        (binding("rb", "role", "sa"), [], {("Role", "role"), ("ServiceAccount", "sa")}),
        (
            statefulset("w", account="sa", service="svc"),
            [],
            {("ServiceAccount", "sa"), ("Service", "svc")},
        ),
        (
            statefulset("w", resourceClaims=[{"name": "g", "resourceClaimTemplateName": "t"}]),
            [],
            {("ResourceClaimTemplate", "t")},
        ),
        (
            statefulset("w", workloadRef={"name": "gang", "podGroup": "instance"}),
            [],
            {("Workload", "gang")},
        ),
        (
            statefulset(
                "w", containers=[{"name": "c", "env": [{"name": "X", "value": "svc.team-a.svc"}]}]
            ),
            ["svc", "other"],
            {("Service", "svc")},
        ),
        (
            statefulset("w", containers=[{"name": "c", "args": ["--leader=w-0.svc.team-a.svc"]}]),
            ["svc"],
            {("Service", "svc")},
        ),
        (
            # A name that only ends like the Service's is another host.
            statefulset("w", containers=[{"name": "c", "args": ["my-svc.team-a.svc"]}]),
            ["svc"],
            set(),
        ),
    ],
    ids=[
        "a NetworkPolicy: nothing",
        "a Service: nothing",
        "a RoleBinding: its Role and accounts",
        "a StatefulSet: its account and headless Service",
        "a claim template",
        "a gang Workload",
        "a Service addressed in env",
        "a Service addressed in args (a pod's host)",
        "a look-alike host",
    ],
)
def test_what_a_child_runs_against(
    obj: dict[str, Any], services: list[str], expected: set[Ref]
) -> None:
    assert uses(obj, services) == expected


OBJECTS = [
    plain("ServiceAccount", "sa"),
    plain("Role", "role"),
    binding("rb", "role", "sa"),
    plain("NetworkPolicy", "np"),
    statefulset("prefill", account="sa", service="prefill"),
    plain("Service", "prefill"),
    statefulset("decode", account="sa", service="decode"),
    plain("Service", "decode"),
]


@pytest.mark.parametrize(
    "taken,held",
    [
        ([("NetworkPolicy", "np")], [("NetworkPolicy", "np")]),
        ([("Service", "decode")], [("StatefulSet", "decode"), ("Service", "decode")]),
        ([("StatefulSet", "prefill")], [("StatefulSet", "prefill")]),
        (
            # The binding grants the account its rights; the workloads run as that account.
            [("Role", "role")],
            [("Role", "role"), ("RoleBinding", "rb"), ("StatefulSet", "prefill"),
             ("StatefulSet", "decode")],
        ),
        (
            [("ServiceAccount", "sa")],
            [("ServiceAccount", "sa"), ("RoleBinding", "rb"), ("StatefulSet", "prefill"),
             ("StatefulSet", "decode")],
        ),
        (
            [("NetworkPolicy", "np"), ("Service", "prefill")],
            [("NetworkPolicy", "np"), ("StatefulSet", "prefill"), ("Service", "prefill")],
        ),
        ([], []),
    ],
    ids=["a NetworkPolicy", "a headless Service", "a workload", "a Role (through its binding)",
         "a ServiceAccount", "two names", "none"],
)  # fmt: skip
def test_a_taken_name_holds_its_child_and_what_runs_against_it(
    taken: list[Ref], held: list[Ref]
) -> None:
    assert held_with(taken, OBJECTS) == held


def test_the_router_runs_against_the_engine_services_it_addresses() -> None:
    body = copy.deepcopy(BASE_BODY)
    body["metadata"].update(name="llama", namespace=NS, uid="uid-llama")
    objects = render_children(PDDeployment.from_body(body), RenderContext())

    held = held_with([("Service", "llama-prefill")], objects)

    assert held == [
        ("StatefulSet", "llama-prefill"),
        ("Service", "llama-prefill"),
        ("Deployment", "llama-router"),
    ]
