"""The model's lookups as the API server sees them: a Secret is asked for as metadata only and
its answer is not decoded; a 404 is an answer ("missing"), anything else is an error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from pdd_operator.kube.client import METADATA_ONLY, KubeApi


@dataclass
class Response:
    status: int
    data: bytes
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def read(self) -> bytes:
        return self.data


@dataclass
class RecordingClient:
    """Stands in for kubernetes.client.ApiClient: records each request, answers `status`."""

    status: int = 200
    data: bytes = b"{}"
    requests: list[dict[str, Any]] = field(default_factory=list)

    def param_serialize(self, method: str, path: str, **kwargs: Any) -> tuple[Any, ...]:
        self.requests.append({"method": method, "path": path, **kwargs})
        return (method, path)

    def call_api(self, *_: Any, **__: Any) -> Response:
        return Response(self.status, self.data)


def test_a_secret_is_asked_for_as_metadata_and_the_answer_left_unread() -> None:
    # An answer that is not even JSON: decoding it would raise.
    api = RecordingClient(data=b"\x00 not decoded")
    assert KubeApi(api).secret_exists("team-a", "hf-token") is True  # type: ignore[arg-type]
    (request,) = api.requests
    assert (request["method"], request["path"]) == (
        "GET",
        "/api/v1/namespaces/team-a/secrets/hf-token",
    )
    assert request["header_params"]["Accept"] == METADATA_ONLY
    assert METADATA_ONLY.startswith("application/json;as=PartialObjectMetadata;g=meta.k8s.io")


@pytest.mark.parametrize(
    ("call", "missing"),
    [
        (lambda k: k.secret_exists("team-a", "hf-token"), False),
        (lambda k: k.read_pvc("team-a", "llama"), None),
    ],
    ids=["secret", "claim"],
)
def test_not_found_is_an_answer_and_forbidden_an_error(call: Any, missing: Any) -> None:
    assert call(KubeApi(RecordingClient(status=404))) is missing  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        call(KubeApi(RecordingClient(status=403)))  # type: ignore[arg-type]


def test_a_claim_is_read_whole() -> None:
    api = RecordingClient(data=b'{"status": {"phase": "Bound"}}')
    assert KubeApi(api).read_pvc("team-a", "llama") == {"status": {"phase": "Bound"}}  # type: ignore[arg-type]
    assert api.requests[0]["path"] == "/api/v1/namespaces/team-a/persistentvolumeclaims/llama"
    assert api.requests[0]["header_params"]["Accept"] == "application/json"
