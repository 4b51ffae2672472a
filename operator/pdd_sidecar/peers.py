"""Peer discovery: which sidecars belong to this PDDeployment, and what their engines published.

A ``PeerSource`` lists the peer pods (the deployment's pods in a cluster, a fixed or
file-backed list locally). The ``PeerTracker`` follows every listed peer sidecar with a
long-poll on its ``/v1/local/agents`` and keeps the versioned view of peer agents that engines
read and watch. A peer that leaves the source or answers with another pod UID is dropped from
the view at once; one that stops answering is dropped after a grace period. A terminating peer
stays while it answers (its engine drains) until its engine unpublishes.
A peer of the other role whose engine revision differs from this pod's (``--revision``) is
never paired with: it stays out of the view and is reported as incompatible.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp

from pdd_contract.labels import LABEL_DEPLOYMENT, LABEL_POD_INDEX
from pdd_sidecar.config import ROLES, Identity, url_host
from pdd_sidecar.metrics import SidecarMetrics
from pdd_sidecar.peer_view import (
    UNREACHABLE,
    AgentRecord,
    PeerHistory,
    Removal,
    merge_pods,
    removal_reason,
)
from pdd_sidecar.registry import ChangeSignal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerEndpoint:
    """A peer pod's sidecar as the source lists it. ``pod``/``uid`` may be unknown (static
    lists); the peer sidecar then reports them itself."""

    role: str
    host: str
    port: int
    pod: str | None = None
    uid: str | None = None
    terminating: bool = False
    # The StatefulSet's pod index: the rank, in a role whose instances span nodes.
    pod_index: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def base_url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"


class PeerSource(Protocol):
    async def list_peers(self) -> list[PeerEndpoint]: ...

    async def wait_for_change(self, wait_s: float) -> None:
        """Return when the list may have changed, or after ``wait_s`` seconds."""
        ...


# -- sources -----------------------------------------------------------------------------------


class StaticPeerSource:
    """A fixed list, e.g. ``prefill=127.0.0.2:8790,decode=127.0.0.3:8790`` (local tests)."""

    def __init__(self, endpoints: list[PeerEndpoint]) -> None:
        self._endpoints = endpoints

    @classmethod
    def parse(cls, spec: str) -> StaticPeerSource:
        endpoints = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            role, _, address = item.partition("=")
            host, _, port = address.rpartition(":")
            if role not in ROLES or not host or not port.isdigit():
                raise ValueError(f"static peer {item!r}: expected ROLE=HOST:PORT, ROLE in {ROLES}")
            endpoints.append(PeerEndpoint(role, host.strip("[]"), int(port)))
        return cls(endpoints)

    async def list_peers(self) -> list[PeerEndpoint]:
        return list(self._endpoints)

    async def wait_for_change(self, wait_s: float) -> None:
        await asyncio.sleep(wait_s)


class FilePeerSource:
    """A JSON list of endpoints re-read when the file changes: the shape of the pod list
    without a cluster, so tests can delete a pod or replace its UID."""

    _POLL_S = 0.25

    def __init__(self, path: str) -> None:
        self._path = path

    async def list_peers(self) -> list[PeerEndpoint]:
        text = await asyncio.to_thread(_read_text, self._path)
        return [
            PeerEndpoint(
                role=item["role"],
                host=item["host"],
                port=int(item["port"]),
                pod=item.get("pod"),
                uid=item.get("uid"),
                terminating=bool(item.get("terminating", False)),
            )
            for item in json.loads(text or "[]")
        ]

    async def wait_for_change(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        before = await asyncio.to_thread(_mtime, self._path)
        while time.monotonic() < deadline:
            await asyncio.sleep(self._POLL_S)
            if await asyncio.to_thread(_mtime, self._path) != before:
                return


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AddressMap:
    """Pod IP -> address to dial, for local clusters whose pod IPs are not routable.

    Entries are ``POD_IP=ADDRESS`` or ``CIDR=CIDR`` with equal prefix lengths, which keeps the
    host bits: ``198.18.0.0/15=127.18.0.0/15`` dials ``127.18.0.7`` for ``198.18.0.7``, so pods
    created later (new IPs) are mapped too. An exact entry wins over a range; of several ranges
    the longest prefix wins. Addresses nothing maps are dialled as they are.
    """

    def __init__(
        self,
        exact: Mapping[str, str] | None = None,
        ranges: Sequence[tuple[IPNetwork, IPNetwork]] = (),
    ) -> None:
        self._exact = dict(exact or {})
        self._ranges = sorted(ranges, key=lambda pair: pair[0].prefixlen, reverse=True)

    @classmethod
    def parse(cls, spec: str) -> AddressMap:
        exact: dict[str, str] = {}
        ranges: list[tuple[IPNetwork, IPNetwork]] = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            source, sep, target = (side.strip() for side in item.partition("="))
            if not sep or not source or not target:
                raise ValueError(f"peer address map entry {item!r}: expected FROM=TO")
            if "/" not in source:
                exact[source] = target
                continue
            try:
                networks = ipaddress.ip_network(source), ipaddress.ip_network(target)
            except ValueError as exc:
                raise ValueError(f"peer address map entry {item!r}: {exc}") from exc
            if networks[0].version != networks[1].version or (
                networks[0].prefixlen != networks[1].prefixlen
            ):
                raise ValueError(
                    f"peer address map entry {item!r}: a range maps onto a range of the same "
                    "IP version and prefix length (the host bits are kept)"
                )
            ranges.append(networks)
        return cls(exact, ranges)

    def __bool__(self) -> bool:
        return bool(self._exact or self._ranges)

    def translate(self, host: str) -> str:
        if host in self._exact:
            return self._exact[host]
        if not self._ranges:
            return host
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host
        for source, target in self._ranges:
            if address.version == source.version and address in source:
                offset = int(address) - int(source.network_address)
                return str(target.network_address + offset)
        return host


class PodPeerSource:
    """The deployment's engine pods, listed and watched with the ``kubernetes`` client in a thread.

    Needs ``list`` and ``watch`` on ``pods`` in the namespace. Pods are read directly, not
    through the role Services' EndpointSlices: engines still loading (not Ready) must already
    exchange metadata, and the routers discover the same pods the same way. A pod counts only
    when its controller is the role's StatefulSet or one of the role's slice StatefulSets
    (`<role StatefulSet>-s<k>`: a deployment grown beyond its topology domain), so a pod that
    merely copies the labels is never a peer. Which prefill a decode pairs with is the
    router's choice (one per slice); the peer view only has to know every agent it may be
    handed.
    """

    def __init__(
        self,
        namespace: str,
        deployment: str,
        workloads: Mapping[str, str],
        port: int,
        address_map: AddressMap | Mapping[str, str] | None = None,
    ) -> None:
        self._namespace = namespace
        self._workloads = dict(workloads)  # StatefulSet name -> role
        self._port = port
        # Pod IP -> address to dial, for local clusters whose pod IPs are not routable.
        self._address_map = (
            address_map if isinstance(address_map, AddressMap) else AddressMap(address_map)
        )
        self._selector = f"{LABEL_DEPLOYMENT}={deployment}"
        self._resource_version: str | None = None
        self._api: Any = None

    def _core(self) -> Any:
        if self._api is None:
            from pdd_kubeconfig import core_v1_api

            self._api = core_v1_api()
        return self._api

    async def list_peers(self) -> list[PeerEndpoint]:
        return await asyncio.to_thread(self._list)

    def _list(self) -> list[PeerEndpoint]:
        result = self._core().list_namespaced_pod(
            self._namespace, label_selector=self._selector, _request_timeout=30
        )
        self._resource_version = result.metadata.resource_version
        endpoints = endpoints_from_pods(result.items, self._workloads, self._port)
        return [
            replace(e, host=self._address_map.translate(e.host)) if self._address_map else e
            for e in endpoints
        ]

    async def wait_for_change(self, wait_s: float) -> None:
        await asyncio.to_thread(self._watch_once, wait_s)

    def _watch_once(self, timeout: float) -> None:
        """Block until one watch event (any change) or the timeout; the caller re-lists."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        stream = watch.Watch()
        try:
            for _event in stream.stream(
                self._core().list_namespaced_pod,
                self._namespace,
                label_selector=self._selector,
                resource_version=self._resource_version,
                timeout_seconds=max(1, int(timeout)),
                _request_timeout=timeout + 10,
            ):
                return
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: our resourceVersion expired; re-list is the fix
                log.warning("watching pods failed: %s", exc.reason)
            time.sleep(1)  # in a worker thread: keeps a failing watch from spinning
        finally:
            stream.stop()


def endpoints_from_pods(
    pods: list[Any], workloads: Mapping[str, str], port: int
) -> list[PeerEndpoint]:
    """The pods that run with an address, of the role StatefulSets, one entry per pod.

    A role whose instances span nodes has one StatefulSet per instance, `<role's>-<i>`
    (pdd_operator.api.names.instance_name), and a deployment grown beyond its topology
    domain one per slice, `<role's>-s<k>` (names.slice_name): their pods are peers of that
    role too."""
    found: list[PeerEndpoint] = []
    for pod in pods:
        role = role_of_statefulset(_controller_statefulset(pod) or "", workloads)
        ip = pod.status.pod_ip if pod.status else None
        if role is None or not ip or pod.status.phase in ("Succeeded", "Failed"):
            continue
        terminating = pod.metadata.deletion_timestamp is not None
        found.append(
            PeerEndpoint(
                role, ip, port, pod.metadata.name, pod.metadata.uid, terminating, _pod_index(pod)
            )
        )
    return found


def _pod_index(pod: Any) -> int | None:
    index = (pod.metadata.labels or {}).get(LABEL_POD_INDEX, "")
    return int(index) if index.isdigit() else None


def role_of_statefulset(name: str, workloads: Mapping[str, str]) -> str | None:
    """The role a StatefulSet runs: a role StatefulSet's, or that of the role StatefulSet one
    of whose instances (`<name>-<i>`) or slices (`<name>-s<k>`, k >= 1) it is; None for any
    other."""
    if name in workloads:
        return workloads[name]
    base, _, index = name.rpartition("-")
    if index.isdigit():
        return workloads.get(base)
    if index[:1] == "s" and index[1:].isdigit() and not index[1:].startswith("0"):
        return workloads.get(base)
    return None


def _controller_statefulset(pod: Any) -> str | None:
    for ref in pod.metadata.owner_references or []:
        if ref.controller and ref.kind == "StatefulSet":
            return str(ref.name)
    return None


# -- tracker -----------------------------------------------------------------------------------


@dataclass
class PeerState:
    """What we know about one listed peer sidecar."""

    endpoint: PeerEndpoint
    pod: str | None = None  # as the peer reports it
    uid: str | None = None
    revision: str | None = None  # the engine revision it reports; None until it answers
    agents: list[AgentRecord] = field(default_factory=list)
    generation: int | None = None
    last_ok: float | None = None  # monotonic time of the last good answer
    failing_since: float | None = None  # monotonic time of the first failure in a row
    error: str | None = None
    is_self: bool = False

    @property
    def pod_name(self) -> str:
        return self.endpoint.pod or self.pod or f"{self.endpoint.host}:{self.endpoint.port}"

    @property
    def pod_uid(self) -> str | None:
        return self.endpoint.uid or self.uid

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "pod": self.pod_name,
            "pod_uid": self.pod_uid,
            "role": self.endpoint.role,
            "address": f"{self.endpoint.host}:{self.endpoint.port}",
            "revision": self.revision,
            "terminating": self.endpoint.terminating,
            "agents": [a.name for a in self.agents],
            "last_seen_s_ago": None if self.last_ok is None else round(now - self.last_ok, 1),
            "error": self.error,
        }


RemovalHook = Callable[[list[Removal]], Coroutine[Any, Any, None]]


class PeerTracker:
    def __init__(
        self,
        identity: Identity,
        own_address: tuple[str, int],
        source: PeerSource,
        token: Callable[[], str],
        metrics: SidecarMetrics,
        *,
        grace_s: float = 15.0,
        poll_timeout_s: float = 20.0,
        resync_s: float = 10.0,
        on_removed: RemovalHook | None = None,
    ) -> None:
        self.identity = identity
        self._own_address = own_address
        self._source = source
        self._token = token
        self._metrics = metrics
        self._grace_s = grace_s
        self._poll_timeout_s = poll_timeout_s
        self._resync_s = resync_s
        self._on_removed = on_removed
        self.history = PeerHistory(start_version=int(time.time() * 1000))
        self.signal = ChangeSignal()
        self._states: dict[tuple[str, int], PeerState] = {}
        self._followers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    # -- reading the view

    def agent(self, name: str) -> AgentRecord | None:
        return self.history.view.get(name)

    def listed(self) -> list[PeerState]:
        """Every peer sidecar the source lists, compatible or not (not this pod)."""
        return [s for s in self._states.values() if not s.is_self]

    def peers(self) -> list[PeerState]:
        """The listed peers this pod may pair with."""
        return [s for s in self.listed() if self.compatible(s)]

    def incompatible_peers(self) -> list[PeerState]:
        return [s for s in self.listed() if not self.compatible(s)]

    def compatible(self, state: PeerState) -> bool:
        """Same revision, or not subject to it: no revision of our own (no filtering), a peer
        of our own role (no KV transfer between them), or one that has not answered yet (it is
        not live either). A peer that reports no revision is incompatible."""
        revision = self.identity.revision
        if not revision or state.endpoint.role == self.identity.role or state.revision is None:
            return True
        return state.revision == revision

    def live_peers(self) -> list[PeerState]:
        now = time.monotonic()
        return [s for s in self.peers() if self._is_live(s, now)]

    async def wait_changed(self, since: int, wait_s: float) -> None:
        if since == self.history.version:
            await self.signal.wait(wait_s)

    # -- running

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            try:
                await self._discover_forever()
            finally:
                for task in self._followers.values():
                    task.cancel()
                await asyncio.gather(*self._followers.values(), return_exceptions=True)

    async def _discover_forever(self) -> None:
        delay = 0.5
        while True:
            try:
                self._set_endpoints(await self._source.list_peers())
                delay = 0.5
            except Exception as exc:  # the API server or file can be briefly unavailable
                log.warning("listing peers failed (retry in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30)
                continue
            self._rebuild()
            await self._source.wait_for_change(self._resync_s)

    def _set_endpoints(self, endpoints: list[PeerEndpoint]) -> None:
        listed = {e.key: e for e in endpoints if not self._is_own(e)}
        for key in list(self._states):
            if key not in listed:
                del self._states[key]
                self._followers.pop(key).cancel()
        for key, endpoint in listed.items():
            state = self._states.get(key)
            if state is None:
                self._states[key] = PeerState(endpoint)
                self._followers[key] = asyncio.create_task(self._follow(key))
            elif state.endpoint != endpoint:
                if endpoint.uid and state.uid and endpoint.uid != state.uid:
                    state.agents, state.uid, state.generation = [], None, None
                    state.revision = None
                state.endpoint = endpoint

    def _is_own(self, endpoint: PeerEndpoint) -> bool:
        return endpoint.uid == self.identity.pod_uid or endpoint.key == self._own_address

    async def _follow(self, key: tuple[str, int]) -> None:
        """Long-poll one peer sidecar for as long as it is listed."""
        delay = 0.2
        while key in self._states:
            state = self._states[key]
            try:
                await self._fetch(state)
                delay = 0.2
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                state.error = f"{type(exc).__name__}: {exc}"
                state.failing_since = state.failing_since or time.monotonic()
                log.debug("peer %s: %s (retry in %.1fs)", state.pod_name, state.error, delay)
                await asyncio.sleep(self._retry_delay(state, delay))
                delay = min(delay * 2, 2.0)
            self._rebuild()
            if state.is_self:
                return

    def _retry_delay(self, state: PeerState, backoff: float) -> float:
        """The backoff, but wake up when the grace period ends so the drop is not late."""
        assert state.failing_since is not None
        until_grace_ends = state.failing_since + self._grace_s - time.monotonic()
        return min(backoff, until_grace_ends + 0.05) if until_grace_ends > 0 else backoff

    async def _fetch(self, state: PeerState) -> None:
        assert self._session is not None
        params = {"wait_s": str(self._poll_timeout_s)}
        if state.generation is not None:
            params["since"] = str(state.generation)
        started = time.monotonic()
        async with self._session.get(
            f"{state.endpoint.base_url}/v1/local/agents",
            params=params,
            headers={"Authorization": f"Bearer {self._token()}"},
            timeout=aiohttp.ClientTimeout(total=self._poll_timeout_s + 10),
        ) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status} from the peer sidecar")
            document = await response.json()
        # The peer says how long it held the request; the rest is the exchange itself.
        self._metrics.metadata_exchange.observe(
            max(0.0, time.monotonic() - started - float(document.get("waited_s", 0)))
        )
        self._apply(state, document)

    def _apply(self, state: PeerState, document: Mapping[str, Any]) -> None:
        me = document["self"]
        state.is_self = me["pod_uid"] == self.identity.pod_uid
        state.pod, state.uid = me["pod"], me["pod_uid"]
        state.revision = str(me.get("revision") or "")  # sidecars before revisions send none
        state.generation = int(document["generation"])
        state.last_ok, state.failing_since, state.error = time.monotonic(), None, None
        if state.endpoint.uid and state.endpoint.uid != state.uid:
            # The IP now belongs to another pod than the slice says: trust neither for now.
            state.error = f"pod UID {state.uid} does not match the listed pod"
            state.agents = []
            return
        state.agents = [
            AgentRecord(
                name=a["name"],
                role=me["role"],
                pod=me["pod"],
                pod_uid=me["pod_uid"],
                address=f"{state.endpoint.host}:{state.endpoint.port}",
                sha256=a["sha256"],
                published_at=float(a.get("published_at", 0.0)),
                etcd_mod_revision=a.get("etcd_mod_revision"),
                metadata=base64.b64decode(a.get("metadata_b64", "")),
                revision=state.revision,
            )
            for a in document["agents"]
        ]

    def _is_live(self, state: PeerState, now: float) -> bool:
        """Served (below) and not terminating: a peer to probe and check."""
        return not state.endpoint.terminating and self._is_served(state, now)

    def _is_served(self, state: PeerState, now: float) -> bool:
        """Its agents are in the view: listed, compatible, answered, and either healthy or
        failing for less than the grace period. A terminating peer is served while it
        answers: its engine drains, and the transfers of the requests it took still need its
        metadata. Its agents go when its engine unpublishes them or its pod goes."""
        if state.is_self or state.last_ok is None:
            return False
        if not self.compatible(state):
            return False
        return state.failing_since is None or now - state.failing_since <= self._grace_s

    def _rebuild(self) -> None:
        """Recompute the view from every live peer; report and act on what left."""
        now = time.monotonic()
        served = [s for s in self.peers() if self._is_served(s, now)]
        view = merge_pods(s.agents for s in served)
        added, removed = self.history.update(view)
        self._update_peer_gauge([s for s in served if not s.endpoint.terminating])
        if not (added or removed):
            return
        self.signal.fire()
        for record in added:
            log.info("peer agent %s of pod %s added", record.name, record.pod)
        removals = self._explain(removed, view, now)
        for removal in removals:
            self._metrics.stale_peer_drops.labels(removal.reason).inc()
            log.info(
                "peer agent %s of pod %s removed: %s",
                removal.record.name,
                removal.record.pod,
                removal.reason,
            )
        if removals and self._on_removed is not None:
            task = asyncio.create_task(self._on_removed(removals))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _explain(
        self, removed: list[AgentRecord], view: Mapping[str, AgentRecord], now: float
    ) -> list[Removal]:
        listed = [s for s in self.listed() if not s.endpoint.terminating and s.pod_uid]
        live_uids = {s.pod_name: s.pod_uid or "" for s in listed}
        unreachable = {s.pod_uid for s in listed if not self._is_live(s, now)}
        removals = []
        for record in removed:
            if record.pod_uid in unreachable and live_uids.get(record.pod) == record.pod_uid:
                reason = UNREACHABLE
            else:
                reason = removal_reason(record, view, live_uids)
            removals.append(Removal(record, reason))
        return removals

    def _update_peer_gauge(self, live: list[PeerState]) -> None:
        for role in ROLES:
            self._metrics.peers.labels(role).set(sum(1 for s in live if s.endpoint.role == role))
