"""A PDDeployment read back from the API server: the object, one of its conditions, and
whether it is Ready for the generation the test last wrote."""

from __future__ import annotations

from typing import Any

from kubernetes import client

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


def get_pdd(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition of that type, {} while the status has none."""
    conditions = body.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def ready_body(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    """The object once Ready=True was computed for its current generation; None before
    (a Ready of an older spec does not count)."""
    body = get_pdd(api, ns, name)
    fresh = body.get("status", {}).get("observedGeneration") == body["metadata"]["generation"]
    return body if fresh and condition(body, "Ready").get("status") == "True" else None
