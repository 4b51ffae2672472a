"""A small synchronous client for engines (standard library only: engine images need nothing
beyond this file), plus ``PeerSync``, which keeps a ``nixl_agent``'s remote agents equal to the
live peers the sidecar reports.

    client = SidecarClient.from_env()            # PDD_SIDECAR_URL, PDD_SIDECAR_TOKEN_FILE
    client.keep_published(agent.name, agent.get_agent_metadata(), ttl_s=30)
    sync = PeerSync(client, agent)                # peers of the other role
    while serving:
        sync.sync(wait_s=30)                      # long-poll; add/remove remote agents
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdd_sidecar.token import TokenFile

# The values of pdd_contract.env, .paths and .ports, spelled out rather than imported so that this
# file alone can be copied into an engine image; a unit test keeps them equal.
URL_ENV = "PDD_SIDECAR_URL"
TOKEN_FILE_ENV = "PDD_SIDECAR_TOKEN_FILE"
DEFAULT_TOKEN_FILE = "/var/run/pdd/token/token"
DEFAULT_URL = "http://127.0.0.1:8099"


class SidecarError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"sidecar answered HTTP {status}: {message}")
        self.status = status


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the sidecar's Unix socket (``unix:///run/pdd/sidecar.sock``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


@dataclass
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body or b"null")


class SidecarClient:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | Callable[[], str] | None = None,
        timeout_s: float = 10.0,
    ):
        self._url = urllib.parse.urlsplit(url)
        if self._url.scheme not in ("http", "unix"):
            raise ValueError("sidecar URL must be http://host:port or unix:///path")
        self._token = token
        self._timeout_s = timeout_s

    @classmethod
    def from_env(cls, timeout_s: float = 10.0) -> SidecarClient:
        # Read again whenever the file changes: the token Secret may be created again.
        token = TokenFile(os.environ.get(TOKEN_FILE_ENV, DEFAULT_TOKEN_FILE))
        return cls(os.environ.get(URL_ENV, DEFAULT_URL), token, timeout_s)

    # -- the API

    def publish(
        self, agent_name: str, metadata: bytes, ttl_s: float | None = None
    ) -> dict[str, Any]:
        """Publish (or refresh) this engine's agent metadata. With ``ttl_s`` the sidecar stops
        serving it unless it is published again within that time (see ``keep_published``)."""
        headers = {"Content-Type": "application/octet-stream"}
        if ttl_s:
            headers["X-PDD-TTL-Seconds"] = str(ttl_s)
        result: dict[str, Any] = self._call(
            "PUT", f"/v1/agents/{_quote(agent_name)}", metadata, headers
        ).json()
        return result

    def unpublish(self, agent_name: str) -> None:
        self._call("DELETE", f"/v1/agents/{_quote(agent_name)}")

    def fetch(self, agent_name: str, expect_sha256: str | None = None) -> bytes:
        """A peer's (or a local) agent's metadata, for ``nixl_agent.add_remote_agent``."""
        response = self._call("GET", f"/v1/agents/{_quote(agent_name)}")
        sha = response.headers.get("X-PDD-Metadata-SHA256")
        if expect_sha256 is not None and sha != expect_sha256:
            raise SidecarError(409, f"agent {agent_name} was re-published meanwhile")
        return response.body

    def peers(self, role: str | None = None) -> dict[str, Any]:
        """Peer agents and pods; the other role unless ``role`` ("prefill", "decode", "any")."""
        result: dict[str, Any] = self._call("GET", "/v1/peers" + _query(role=role)).json()
        return result

    def watch(self, since: int, wait_s: float = 30.0, role: str | None = None) -> dict[str, Any]:
        """Block up to ``wait_s`` for a change after version ``since``: ``{version, added,
        removed, resync}``. Start with ``since=0`` (answers at once with ``resync``)."""
        path = "/v1/peers/watch" + _query(since=since, wait_s=wait_s, role=role)
        result: dict[str, Any] = self._call("GET", path, timeout_s=wait_s + self._timeout_s).json()
        return result

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/status").json()
        return result

    def probe(self, peer: str, **spec: Any) -> dict[str, Any]:
        """Run the transfer probe from this pod to ``peer`` (a pod name); returns the result."""
        body = json.dumps({"peer": peer, **spec}).encode()
        timeout = float(spec.get("timeout_s", 120)) + 90
        result: dict[str, Any] = self._call(
            "POST", "/v1/probe", body, {"Content-Type": "application/json"}, timeout
        ).json()
        return result

    def keep_published(
        self, agent_name: str, metadata: bytes, ttl_s: float = 30.0, interval_s: float | None = None
    ) -> threading.Event:
        """Publish now and re-publish from a daemon thread; set the returned event to stop.

        Identical bytes only refresh the TTL, so this is a heartbeat: if the engine process
        dies, its metadata stops being served after ``ttl_s`` even though the pod lives on."""
        self.publish(agent_name, metadata, ttl_s)
        stop = threading.Event()
        every = interval_s or ttl_s / 3

        def beat() -> None:
            while not stop.wait(every):
                try:
                    self.publish(agent_name, metadata, ttl_s)
                except (OSError, SidecarError):
                    continue  # the sidecar restarting; the next beat re-publishes

        threading.Thread(target=beat, name=f"pdd-publish-{agent_name}", daemon=True).start()
        return stop

    # -- transport

    def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        connection = self._connect(timeout_s or self._timeout_s)
        all_headers = dict(headers or {})
        token = self._token() if callable(self._token) else self._token
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        try:
            connection.request(method, path, body=body, headers=all_headers)
            raw = connection.getresponse()
            response = Response(raw.status, raw.read(), {k: v for k, v in raw.getheaders()})
        finally:
            connection.close()
        if response.status >= 400:
            raise SidecarError(response.status, _error_text(response))
        return response

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._url.scheme == "unix":
            return _UnixHTTPConnection(self._url.path, timeout_s)
        return http.client.HTTPConnection(self._url.netloc, timeout=timeout_s)


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _query(**params: Any) -> str:
    present = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(present) if present else ""


def _error_text(response: Response) -> str:
    try:
        return str(response.json().get("error", ""))
    except (ValueError, AttributeError):
        return response.body[:200].decode(errors="replace")


# -- keeping a nixl_agent in step with the peers ------------------------------------------------


@dataclass
class SyncReport:
    version: int
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class PeerSync:
    """Applies the sidecar's peer changes to a ``nixl_agent``.

    Removals are applied before additions, so when a pod is replaced by one re-using the agent
    name the predecessor is dropped (``remove_remote_agent``) before the successor's metadata is
    loaded: no transfer can be posted against the predecessor's memory keys. With
    ``fetch_via="etcd"`` additions go through NIXL's own etcd client (``fetch_remote_metadata``).
    """

    def __init__(
        self, client: SidecarClient, agent: Any, role: str | None = None, fetch_via: str = "sidecar"
    ) -> None:
        if fetch_via not in ("sidecar", "etcd"):
            raise ValueError("fetch_via must be sidecar or etcd")
        self._client = client
        self._agent = agent
        self._role = role
        self._fetch_via = fetch_via
        self.version = 0
        self.loaded: dict[str, tuple[Any, ...]] = {}  # agent name -> identity loaded

    def sync(self, wait_s: float = 0.0) -> SyncReport:
        changes = self._client.watch(self.version, wait_s, self._role)
        report = SyncReport(int(changes["version"]))
        if changes.get("resync"):
            current = {r["name"]: _identity(r) for r in changes["added"]}
            for name, identity in list(self.loaded.items()):
                if current.get(name) != identity:
                    self._remove(name, report)
        for record in changes["removed"]:
            if self.loaded.get(record["name"]) == _identity(record):
                self._remove(record["name"], report)
        for record in changes["added"]:
            if self.loaded.get(record["name"]) != _identity(record):
                self._add(record, report)
        # A failed addition is retried from a full resync on the next call.
        self.version = 0 if report.failed else report.version
        return report

    def _remove(self, name: str, report: SyncReport) -> None:
        del self.loaded[name]
        try:
            self._agent.remove_remote_agent(name)
        except Exception as exc:  # NIXL raises its own types; the agent is gone either way
            report.failed[name] = f"remove_remote_agent: {exc}"
            return
        report.removed.append(name)

    def _add(self, record: Mapping[str, Any], report: SyncReport) -> None:
        name = record["name"]
        if name in self.loaded:  # same name, new identity, removal not seen: drop it first
            self._remove(name, report)
        try:
            if self._fetch_via == "etcd":
                self._agent.fetch_remote_metadata(name)
                _wait_for(lambda: bool(self._agent.check_remote_metadata(name)), 10.0)
            else:
                self._agent.add_remote_agent(self._client.fetch(name, record["sha256"]))
        except Exception as exc:  # sidecar, network or NIXL errors: retried on the next sync
            report.failed[name] = f"{type(exc).__name__}: {exc}"
            return
        self.loaded[name] = _identity(record)
        report.added.append(name)


def _identity(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return (record["name"], record["pod_uid"], record["sha256"], record.get("etcd_mod_revision"))


def _wait_for(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("NIXL did not load the agent's metadata from etcd in time")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
