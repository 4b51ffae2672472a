"""A thin JSON layer over the `kubernetes` client's ApiClient: its kubeconfig loading, auth
and connection pool, without its model classes. The simulator handles thousands of pods;
deserialising each watch event into V1Pod models would cost more than everything else."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

Json = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeJson:
    def __init__(self, kubeconfig: Path | str, pool_size: int = 32) -> None:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        # One connection per worker thread, or requests queue behind each other.
        cfg.connection_pool_maxsize = pool_size
        self.api = client.ApiClient(cfg)

    def close(self) -> None:
        self.api.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Json | None = None,
        content_type: str | None = None,
        timeout: float = 30,
    ) -> Json:
        """One request; the decoded JSON answer. Raises ApiException on a non-2xx status."""
        resp = self._send(method, path, query, body, content_type, timeout)
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode())
        return json.loads(data) if data else {}

    def get_bytes(
        self, path: str, query: Mapping[str, str | int] | None = None, timeout: float = 30
    ) -> bytes:
        """The raw body of a GET (a profile from /debug/pprof, say)."""
        resp = self._send("GET", path, query, None, None, timeout)
        data: bytes = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode())
        return data

    def list_all(self, path: str, query: Mapping[str, str | int]) -> tuple[list[Json], str]:
        """Every item of a collection, in pages; (items, resourceVersion of the list)."""
        items: list[Json] = []
        cont = ""
        while True:
            q = {**query, "limit": 500, **({"continue": cont} if cont else {})}
            page = self.request("GET", path, query=q)
            items.extend(page.get("items") or [])
            cont = page.get("metadata", {}).get("continue", "")
            if not cont:
                return items, str(page["metadata"]["resourceVersion"])

    def open_watch(
        self, path: str, query: Mapping[str, str | int], read_timeout: float
    ) -> urllib3.BaseHTTPResponse:
        """A streaming watch response; iterate it with `watch_events`, close it with
        `shutdown()` from another thread to end the watch at once."""
        q = {**query, "watch": "true", "allowWatchBookmarks": "true"}
        resp = self._send("GET", path, q, None, None, (5.0, read_timeout))
        if resp.status != 200:
            body = resp.read().decode(errors="replace")
            raise ApiException(status=resp.status, reason=resp.reason, body=body)
        raw: urllib3.BaseHTTPResponse = resp.response
        return raw

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int] | None,
        body: Json | None,
        content_type: str | None,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(k, str(v)) for k, v in (query or {}).items()],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(*params, _request_timeout=timeout)


def watch_events(resp: urllib3.BaseHTTPResponse) -> Iterator[Json]:
    """The events of a watch stream, one JSON object per line."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
