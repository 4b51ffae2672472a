"""The model's lookups as the API server sees them: a claim is read, a 404 is an answer
("missing"), anything else is an error. A Secret is never read: the sidecar token is created,
and an existing one is known from the create's 409 alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from pdd_operator.kube.client import KubeApi


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


def test_an_existing_secret_is_known_from_one_create_answered_409() -> None:
    status = b'{"kind": "Status", "reason": "AlreadyExists", "code": 409}'
    api = RecordingClient(status=409, data=status)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "namespace": "a"}}
    assert KubeApi(api).create_if_absent(secret) is False  # type: ignore[arg-type]
    assert [(r["method"], r["path"]) for r in api.requests] == [
        ("POST", "/api/v1/namespaces/a/secrets")
    ]


def test_a_missing_claim_is_an_answer_and_forbidden_an_error() -> None:
    assert KubeApi(RecordingClient(status=404)).read_pvc("team-a", "llama") is None  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        KubeApi(RecordingClient(status=403)).read_pvc("team-a", "llama")  # type: ignore[arg-type]


def test_a_claim_is_read_whole() -> None:
    api = RecordingClient(data=b'{"status": {"phase": "Bound"}}')
    assert KubeApi(api).read_pvc("team-a", "llama") == {"status": {"phase": "Bound"}}  # type: ignore[arg-type]
    assert api.requests[0]["path"] == "/api/v1/namespaces/team-a/persistentvolumeclaims/llama"
    assert api.requests[0]["header_params"]["Accept"] == "application/json"
