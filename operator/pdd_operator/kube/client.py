"""The one module that talks to the API server.

Calls are synchronous (the official `kubernetes` client); the reconciler runs them with
`asyncio.to_thread`, so no blocking call ever sits inside an `async def`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import pdd_kubeconfig
from pdd_operator.kube.decoding import WHOLE, Decode, Decoding
from pdd_operator.kube.resources import (
    ADMISSION_POLICY,
    ADMISSION_POLICY_BINDING,
    LEASE,
    PDDEPLOYMENT,
    PERSISTENT_VOLUME_CLAIM,
    ROLE_SCALER,
    Kind,
    kind_of,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = {409, 429, 500, 502, 503, 504}
# The client library calls the credentials' refresh hook before every request. A kubeconfig's
# hook copies its whole configuration again each time (the host setter reads the proxy
# settings from the environment): ~2 % of the operator's CPU at 100 deployments. Asked at most
# this often, an expired token is still replaced within this long.
CREDENTIALS_REFRESH_S = 0.5


# The fields of a binding's matchResources that leave some objects out of its policy.
_NARROWING = ("namespaceSelector", "objectSelector", "resourceRules", "excludeResourceRules")

API_CONNECTIONS = 32  # as many as the worker threads that call the API at once
# urllib3 sends a request again after a failed read only for these methods (its default also
# resends PUT and DELETE, without asking anyone): a write goes out once per fence check
# (kube/lease.py), and one that failed goes back to its caller, which retries through the
# check. Connections that fail before the request is sent are retried for every method.
SEND_WRITES_ONCE = urllib3.Retry(total=3, allowed_methods=frozenset({"GET", "HEAD", "OPTIONS"}))
WATCH_CHUNK = 64 * 1024
JSON = "application/json"
# The object's metadata only (name, labels, ...): the API server leaves out everything else.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """The project's one rule for credentials (pdd_kubeconfig), on a configuration that
    limits how often they refresh."""
    return pdd_kubeconfig.load_configuration(kubeconfig, RefreshLimitedConfiguration())


class RefreshLimitedConfiguration(client.Configuration):
    """A client configuration whose credentials refresh hook runs at most once per
    `refresh_every_s`.

    The limit sits where the hook is called, not in a wrapper around the hook: the client
    library's kubeconfig and in-cluster loaders install a new hook each time theirs runs,
    and would replace a wrapper (for good, when two requests race)."""

    refresh_every_s: float = CREDENTIALS_REFRESH_S
    clock: Callable[[], float] = time.monotonic
    _refreshed_at: float = -math.inf
    _refresh_lock = threading.Lock()  # a class's: a configuration is deep-copied by value

    def get_api_key_with_prefix(self, identifier: str, alias: str | None = None) -> str | None:
        hook = self.refresh_api_key_hook
        if hook is not None and self._refresh_due():
            hook(self)
        key = self.api_key.get(identifier, self.api_key.get(alias) if alias is not None else None)
        if not key:
            return None
        prefix = self.api_key_prefix.get(
            identifier, self.api_key_prefix.get(alias) if alias is not None else None
        )
        return f"{prefix} {key}" if prefix else str(key)

    def _refresh_due(self) -> bool:
        with self._refresh_lock:
            now = self.clock()
            if now - self._refreshed_at < self.refresh_every_s:
                return False
            self._refreshed_at = now
            return True


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    configuration = load_configuration(kubeconfig)
    configuration.connection_pool_maxsize = API_CONNECTIONS
    configuration.retries = SEND_WRITES_ONCE
    return client.ApiClient(configuration)


class KubeApi:
    """`fence`, when given, is called before every request that writes (anything but GET) and
    raises when this process may not write any more: the leader election's fence
    (kube/lease.py). It runs after the request is built, as close to the send as this layer
    gets, so that a process frozen and resumed meets it on its next write."""

    def __init__(
        self,
        api_client: client.ApiClient,
        field_manager: str = "pdd-operator",
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.api = api_client
        self.field_manager = field_manager
        self.fence = fence

    def apply(
        self, obj: dict[str, Any], dry_run: bool = False, want_result: bool = True
    ) -> dict[str, Any]:
        """Server-side apply under our one field manager (force: we own these fields).

        `want_result=False` returns the object's metadata only (PartialObjectMetadata, which
        the API server cuts down before sending): its resourceVersion names the write's
        watch event, and the reconciler learns the rest from its watches (decoding every
        whole answer cost CPU at scale)."""
        kind = kind_of(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        path = kind.path(meta.get("namespace"), meta["name"])
        query = [("fieldManager", self.field_manager), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        content_type = "application/apply-patch+yaml"
        accept = JSON if want_result else METADATA_ONLY
        # Sent as bytes (JSON is YAML): the client library would walk the object and encode
        # it with the standard library, 40 times slower per deployment's children.
        body = orjson.dumps(obj)
        return _retry(lambda: self._call("PATCH", path, body, query, content_type, accept=accept))

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        """POST; an existing object is left alone (tokens must never be regenerated)."""
        kind = kind_of(obj["apiVersion"], obj["kind"])
        path = kind.path(obj["metadata"].get("namespace"))
        try:
            _retry(lambda: self._call("POST", path, obj, [], JSON, want_result=False))
            return True
        except ApiException as err:
            if api_status(err).reason == "AlreadyExists":
                return False
            raise

    def owner_references(
        self, kind: Kind, namespace: str, name: str
    ) -> list[dict[str, Any]] | None:
        """The owner references of the object of that name, None when there is none. Only its
        metadata is read (PartialObjectMetadata): whose it is, not what it holds."""
        meta = self.object_metadata(kind, namespace, name)
        if meta is None:
            return None
        refs = meta.get("ownerReferences") or []
        return [ref for ref in refs if isinstance(ref, dict)]

    def object_metadata(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        """The metadata of the object of that name (owner references, labels, annotations,
        managed fields), None when there is none: whose it is and who applied it, never what
        it holds (PartialObjectMetadata)."""
        path = kind.path(namespace, name)
        try:
            found = _retry(lambda: self._call("GET", path, None, [], "", accept=METADATA_ONLY))
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        meta = found.get("metadata")
        return meta if isinstance(meta, dict) else {}

    def delete(self, kind: Kind, namespace: str, name: str, uid: str = "") -> None:
        """Delete the object; with `uid`, only that object (a precondition): a name freed and
        taken by someone else's object meanwhile is left alone."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        path = kind.path(namespace, name)
        try:
            _retry(
                lambda: self._call("DELETE", path, body, [], "application/json"),
                retryable=lambda err: _retryable(err) and not _precondition_failed(err),
            )
        except ApiException as err:
            if _precondition_failed(err):
                log.info(
                    "not deleting %s %s/%s: it is another object now", kind.kind, namespace, name
                )
                return
            if err.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        """Merge-patch the status subresource (never spec: GitOps tools own spec); return the
        new resourceVersion ("" when the object is gone), read from the metadata alone."""
        path = PDDEPLOYMENT.path(namespace, name, "status")
        body = {"status": status}
        merge = "application/merge-patch+json"
        try:
            patched = _retry(
                lambda: self._call("PATCH", path, body, [], merge, accept=METADATA_ONLY)
            )
        except ApiException as err:
            if err.status != 404:  # deleted meanwhile: nothing to report on
                raise
            return ""
        return str((patched.get("metadata") or {}).get("resourceVersion") or "")

    def patch_scaler_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch a PDDRoleScaler's status (what the role runs; its spec is the HPA's)."""
        path = ROLE_SCALER.path(namespace, name, "status")
        body = {"status": status}
        try:
            _retry(lambda: self._call("PATCH", path, body, [], "application/merge-patch+json"))
        except ApiException as err:
            if err.status != 404:  # deleted meanwhile: the next pass creates it again
                raise

    def annotate_pod(
        self, namespace: str, name: str, annotations: dict[str, str]
    ) -> dict[str, Any]:
        """The pod's metadata after the write (its resourceVersion names the watch event)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        body = {"metadata": {"annotations": annotations}}
        merge = "application/merge-patch+json"
        return _retry(lambda: self._call("PATCH", path, body, [], merge, accept=METADATA_ONLY))

    def name_guard_problem(self, policy: str) -> str:
        """Why the name-guard admission policy of that name (and its binding of the same
        name, as the chart installs them) is not in force; "" when it is: it exists, fails
        closed, and its binding denies."""
        found: list[dict[str, Any]] = []
        for kind in (ADMISSION_POLICY, ADMISSION_POLICY_BINDING):
            path = kind.path(None, policy)
            try:
                found.append(_retry(lambda: self._call("GET", path, None, [], JSON)))  # noqa: B023
            except ApiException as err:
                if err.status in (403, 404):
                    return f"{kind.kind} {policy}: {api_error_message(err)}"
                raise
        policy_spec, binding_spec = (obj.get("spec") or {} for obj in found)
        if policy_spec.get("failurePolicy", "Fail") != "Fail":
            return f"ValidatingAdmissionPolicy {policy} does not fail closed (failurePolicy)"
        if binding_spec.get("policyName") != policy:
            return f"ValidatingAdmissionPolicyBinding {policy} binds another policy"
        if "Deny" not in (binding_spec.get("validationActions") or []):
            return f"ValidatingAdmissionPolicyBinding {policy} does not deny (validationActions)"
        match = binding_spec.get("matchResources") or {}
        if any(match.get(field) for field in _NARROWING) or binding_spec.get("paramRef"):
            return f"ValidatingAdmissionPolicyBinding {policy} narrows what it covers"
        return ""

    def read_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PersistentVolumeClaim, or None when there is none."""
        path = PERSISTENT_VOLUME_CLAIM.path(namespace, name)
        try:
            return _retry(lambda: self._call("GET", path, None, [], JSON))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def serves(self, api: str, plural: str = "") -> bool:
        """Whether the API server serves `api` (group/version, or a group: any version) and,
        when given, the resource `plural` in it (discovery)."""
        path = f"/apis/{api}"
        try:
            found = _retry(lambda: self._call("GET", path, None, [], ""))
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        if not plural:
            return True
        return any(r.get("name") == plural for r in found.get("resources") or [])

    def read_lease(self, namespace: str, name: str, timeout_s: float) -> dict[str, Any] | None:
        """The Lease, or None when there is none. One request, no retries: the leader
        election's own loop retries, on its own clock."""
        try:
            return self._call("GET", LEASE.path(namespace, name), None, [], "", timeout=timeout_s)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def create_lease(self, lease: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """POST the Lease; a 409 AlreadyExists is raised (someone created it first)."""
        path = LEASE.path(lease["metadata"]["namespace"])
        return self._call("POST", path, lease, [], JSON, timeout=timeout_s)

    def replace_lease(self, lease: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """PUT the Lease; its metadata.resourceVersion is the precondition (optimistic
        concurrency): a 409 Conflict is raised when someone wrote it since."""
        meta = lease["metadata"]
        path = LEASE.path(meta["namespace"], meta["name"])
        return self._call("PUT", path, lease, [], JSON, timeout=timeout_s)

    def list_page(
        self,
        path: str,
        limit: int,
        continue_token: str = "",
        selectors: Iterable[tuple[str, str]] = (),
        decoding: Decoding = WHOLE,
    ) -> dict[str, Any]:
        """One page of a collection (a list in pages keeps the API server's answers, and our
        memory, bounded on a large fleet)."""
        query = [*selectors, ("limit", str(limit))]
        if continue_token:
            query.append(("continue", continue_token))
        return _retry(lambda: self._call("GET", path, None, query, "", decode=decoding.page))

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_s: int,
        selectors: Iterable[tuple[str, str]] = (),
        decoding: Decoding = WHOLE,
    ) -> Iterator[dict[str, Any]]:
        """The watch events of a collection from `resource_version`, one decoded event per
        line of the stream, bookmarks included, until the API server ends the watch after
        `timeout_s`. Runs in a thread of its own (the stream blocks between events).

        Raises WatchExpired when the server no longer has that version (list again)."""
        params = [
            *selectors,
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        request = self.api.param_serialize(
            "GET",
            path,
            query_params=params,
            header_params={"Accept": JSON},
            auth_settings=["BearerToken"],
        )
        # A read that waits longer than the server's own timeout means the stream is dead.
        response = self.api.call_api(*request, _request_timeout=(10, timeout_s + 30))
        try:
            if response.status == 410:
                raise WatchExpired(path)
            if not 200 <= response.status <= 299:
                response.read()
                raise ApiException(http_resp=response)
            for event in _json_lines(response.response.stream(WATCH_CHUNK), decoding.event):
                if event.get("type") == "ERROR":
                    raise _watch_error(path, event.get("object") or {})
                yield event
        finally:
            response.response.release_conn()

    def _call(
        self,
        method: str,
        path: str,
        body: Any,
        query: list[tuple[str, str]],
        content_type: str,
        want_result: bool = True,
        accept: str = JSON,
        decode: Decode = orjson.loads,
        timeout: float = 30,
    ) -> dict[str, Any]:
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        request = self.api.param_serialize(
            method,
            path,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        if method != "GET" and self.fence is not None:
            self.fence()
        response = self.api.call_api(*request, _request_timeout=timeout)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        if not want_result:
            return {}
        data = decode(response.data or b"{}")
        return data if isinstance(data, dict) else {}


class WatchExpired(Exception):
    """The API server no longer has the version a watch asked for (410 Gone): list again."""


def _watch_error(path: str, status: Mapping[str, Any]) -> Exception:
    """The Status a watch stream ends with: 410 Gone (as an HTTP status or, from the watch
    cache, as an ERROR event) means list again; anything else is an error."""
    if status.get("code") == 410:
        return WatchExpired(path)
    return RuntimeError(f"watch of {path}: {status.get('message') or status}")


def _json_lines(chunks: Iterable[bytes], decode: Decode) -> Iterator[dict[str, Any]]:
    """Decode a stream of newline-delimited JSON objects (an event may span chunks)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield decode(line)
    if pending.strip():
        yield decode(pending)


def _retry(
    call: Callable[[], T],
    attempts: int = 5,
    base_delay: float = 0.2,
    retryable: Callable[[ApiException], bool] | None = None,
) -> T:
    """Retry conflicts and server errors with jittered exponential backoff, never hot-looping.

    Runs in a worker thread (see module docstring), so sleeping here blocks no event loop.
    """
    worth_retrying = retryable or _retryable
    for attempt in range(attempts):
        try:
            return call()
        except ApiException as err:
            if not worth_retrying(err) or attempt == attempts - 1:
                raise
            delay = min(base_delay * 2**attempt, 5.0) * (0.5 + random.random())
            log.info("API answered %s; retrying in %.2fs", err.status, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _retryable(err: ApiException) -> bool:
    # A 409 is either Conflict (someone wrote in between: try again) or AlreadyExists (a
    # create of a name that is taken: the same answer every time).
    return err.status in RETRYABLE and api_status(err).reason != "AlreadyExists"


def _precondition_failed(err: ApiException) -> bool:
    """A delete's uid precondition did not hold: the name is another object's now, and
    retrying gives the same answer. A DELETE without a resourceVersion has no other cause of
    409 Conflict."""
    status = api_status(err)
    return status.code == 409 and status.reason == "Conflict"


@dataclass(frozen=True)
class ApiStatus:
    """What the API server's Status object says about a refused request: the HTTP code, the
    machine-readable `reason` (NotFound, AlreadyExists, Conflict, Forbidden, ...), and from
    `details` the resource kind it is about and the causes' types. Errors are told apart by
    these, never by their message, which is for people and may change between versions."""

    code: int = 0
    reason: str = ""
    kind: str = ""  # details.kind: for NotFound the resource, e.g. "namespaces"
    group: str = ""  # details.group
    causes: frozenset[str] = frozenset()  # details.causes[].reason, e.g. NamespaceTerminating


def api_status(err: BaseException) -> ApiStatus:
    """The Status of an API error; an empty one for anything else (no answer came)."""
    if not isinstance(err, ApiException):
        return ApiStatus()
    try:
        body: Any = json.loads(err.body or "{}")
    except (ValueError, TypeError):
        body = None
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return ApiStatus(code=int(err.status or 0))
    details: Any = body.get("details")
    details = details if isinstance(details, dict) else {}
    causes: Any = details.get("causes")
    causes = causes if isinstance(causes, list) else []
    return ApiStatus(
        code=int(body.get("code") or err.status or 0),
        reason=str(body.get("reason") or ""),
        kind=str(details.get("kind") or ""),
        group=str(details.get("group") or ""),
        causes=frozenset(str(c.get("reason")) for c in causes if isinstance(c, dict)),
    )


def namespace_unavailable(err: BaseException) -> bool:
    """Whether a create was refused because its namespace is being deleted (403 Forbidden
    with a NamespaceTerminating cause, from the NamespaceLifecycle admission plugin) or is
    already gone (404 NotFound about the namespace itself, not the object)."""
    status = api_status(err)
    if status.code == 403 and status.reason == "Forbidden":
        return "NamespaceTerminating" in status.causes
    return (
        status.code == 404
        and status.reason == "NotFound"
        and status.kind == "namespaces"
        and not status.group
    )


def transient(err: BaseException) -> bool:
    """Whether a failed request may succeed, unchanged, once time has passed: no answer came
    (a connection refused or reset, a timeout), or the answer says "not now": 408, 429, any
    5xx (the API server or a webhook it called failed or timed out: a webhook it cannot reach
    answers 500 InternalError, "failed calling webhook"), or a 409 Conflict (someone wrote in
    between). Every other refusal (422 Invalid, 403 Forbidden by RBAC, a quota or an admission
    policy, 409 AlreadyExists, 404) answers the same until a person changes something."""
    if isinstance(err, ApiException):
        status = api_status(err)
        if status.code == 409:
            return status.reason == "Conflict"
        return status.code in (408, 429) or 500 <= status.code <= 599
    return isinstance(err, (urllib3.exceptions.HTTPError, OSError))


def api_error_message(err: Exception) -> str:
    """A short, user-facing message from an API error (the server's own message, not a trace)."""
    if isinstance(err, ApiException):
        try:
            return str(json.loads(err.body or "{}").get("message") or err.reason)
        except ValueError:
            return f"{err.status} {err.reason}"
    return str(err)
