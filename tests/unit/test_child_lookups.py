"""The look at whose a child's name is, as the API server sees it: the object's metadata
(owner references, labels, annotations, managed fields) as PartialObjectMetadata, never what
the object holds; a 404 says the name is free."""

from __future__ import annotations

import json

from pdd_operator.kube.client import METADATA_ONLY, KubeApi
from pdd_operator.kube.resources import CHILD_KINDS
from unit.test_kube_lookups import RecordingClient

POLICY = next(k for k in CHILD_KINDS if k.kind == "NetworkPolicy")


def test_an_objects_metadata_is_read_as_partial_metadata() -> None:
    meta = {"name": "kv-kv-transfer", "managedFields": [{"manager": "pdd-operator"}]}
    api = RecordingClient(data=json.dumps({"metadata": meta}).encode())

    assert KubeApi(api).object_metadata(POLICY, "team-a", "kv-kv-transfer") == meta  # type: ignore[arg-type]

    (request,) = api.requests
    assert (request["method"], request["path"]) == (
        "GET",
        "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/kv-kv-transfer",
    )
    assert request["header_params"]["Accept"] == METADATA_ONLY


def test_a_free_name_is_none_and_its_owner_references_too() -> None:
    missing = KubeApi(RecordingClient(status=404))  # type: ignore[arg-type]
    assert missing.object_metadata(POLICY, "team-a", "kv-kv-transfer") is None
    assert missing.owner_references(POLICY, "team-a", "kv-kv-transfer") is None
