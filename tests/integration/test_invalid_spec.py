"""A PDDeployment the API server admitted but the operator cannot read: Stalled=True and
Ready=False with the fix in the message, a Warning event, no children, no write per resync;
and back to normal once fixed.

The API server checks the CRD's schema and rules, so such an object needs a CRD the operator
does not match: here the generated CRD plus one field the operator's models do not know (a CRD
newer than the operator, as after an operator rollback). The CRD is restored afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import small_pdd_body
from helpers.operator_proc import OPERATOR_USER, OperatorProcess, install_crd, load_crd
from helpers.waits import wait_for, wait_namespaces_gone

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NAME = "from-the-future"


def body(namespace: str) -> dict[str, Any]:
    return small_pdd_body(
        NAME,
        namespace,
        futureField="on",
    )


@pytest.fixture
def newer_crd(operator: OperatorProcess, api_client: client.ApiClient) -> Iterator[None]:
    crd = load_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"]["properties"]["futureField"] = {"type": "string"}
    install_crd(api_client, crd)
    # The operator starts on the newer CRD, as after a rollback: a CRD replaced under a running
    # operator restarts its watch, which can take longer than this test waits.
    operator.kill()
    operator.start()
    try:
        yield
    finally:
        install_crd(api_client)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def test_an_unreadable_spec_is_stalled_with_the_fix_and_recovers(
    newer_crd: None,
    operator: OperatorProcess,
    control_plane: Any,
    api_client: client.ApiClient,
    namespace: str,
) -> None:
    custom = client.CustomObjectsApi(api_client)

    def create_keeping_the_field() -> bool:
        # The API server takes a moment to serve the changed schema; until then it prunes
        # the unknown field. A dry run finds out without creating an object the operator
        # would reconcile (and give children) as a valid one.
        tried = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body(namespace), dry_run="All"
        )
        if "futureField" not in tried["spec"]:
            return False
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body(namespace))
        return True

    wait_for(create_keeping_the_field, 30, 0.5, "the CRD with futureField served")

    def stalled() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
        cond = conditions(obj).get("Stalled", {})
        fresh = obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
        return obj if fresh and cond.get("status") == "True" else None

    obj = wait_for(stalled, 60, what="Stalled=True")
    by_type = conditions(obj)
    generation = obj["metadata"]["generation"]
    message = by_type["Stalled"]["message"]
    assert by_type["Stalled"]["reason"] == "InvalidSpec"
    assert message.startswith("spec.futureField: this operator does not know the field")
    assert "remove the field, or upgrade the operator" in message
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("False", "InvalidSpec")
    assert by_type["Ready"]["message"] == message
    assert all(c["observedGeneration"] == generation for c in by_type.values())

    core = client.CoreV1Api(api_client)

    def invalid_events() -> list[Any]:
        return [
            e
            for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == NAME and e.reason == "InvalidSpec"
        ]

    [event] = wait_for(invalid_events, 20, what="the InvalidSpec event")
    assert (event.type, event.message) == ("Warning", message)
    # Nothing was rendered from a spec that was not understood.
    assert not client.AppsV1Api(api_client).list_namespaced_stateful_set(namespace).items

    # Resyncs (every 2 s here) of the same object write nothing: no status, no event.
    wait_namespaces_gone(api_client)  # other tests' clean-up writes are not ours
    time.sleep(1)  # the last status write and event land before the count starts
    reconciles_before = operator.metric("pdd_operator_reconciles_total")
    writes_before = control_plane.writes_by(OPERATOR_USER, namespace=namespace)
    time.sleep(6)  # a span of about three resyncs that must write nothing: no event to wait on
    assert operator.metric("pdd_operator_reconciles_total") - reconciles_before >= 2
    writes = control_plane.writes_by(OPERATOR_USER, namespace=namespace) - writes_before
    assert writes == 0, f"{writes} writes by the operator while nothing changed"
    [event] = invalid_events()
    assert (event.count or 1) == 1

    # Fixed: the next generation is reconciled normally, and Stalled turns False.
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, NAME, {"spec": {"futureField": None}}
    )

    def recovered() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
        fresh = obj.get("status", {}).get("observedGeneration") == generation + 1
        return obj if fresh and conditions(obj)["Stalled"]["status"] == "False" else None

    obj = wait_for(recovered, 60, what="Stalled=False after the fix")
    assert conditions(obj)["Stalled"]["reason"] != "InvalidSpec"
    wait_for(
        lambda: client.AppsV1Api(api_client).list_namespaced_stateful_set(namespace).items,
        60,
        what="the children rendered from the fixed spec",
    )
