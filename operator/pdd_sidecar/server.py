"""The sidecar's HTTP API (aiohttp). See docs/sidecar.md for the contract.

Engine-facing: publish/fetch NIXL agent metadata, list and watch peers, status, probe.
Sidecar-facing: ``/v1/local/agents`` (long-poll of what this pod published) and the probe
target endpoints. Every route but ``/healthz`` needs the deployment's bearer token; neither the
token nor metadata bytes are ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from pdd_probe.probe import ProbeResult, ProbeSpec
from pdd_sidecar.config import ROLES, SidecarConfig, other_role
from pdd_sidecar.etcd_mode import EtcdGateway, EtcdJanitor
from pdd_sidecar.metrics import CONTENT_TYPE_LATEST, SidecarMetrics
from pdd_sidecar.peer_view import AgentRecord, Removal
from pdd_sidecar.peers import PeerSource, PeerState, PeerTracker
from pdd_sidecar.probe_service import ProbeBusy, ProbeTargets, run_remote_probe
from pdd_sidecar.prober import (
    PodAnnotations,
    ProbeRequests,
    operator_answer,
    read_kv_path_check,
)
from pdd_sidecar.reachability import ReachabilityChecker, side_channel_for
from pdd_sidecar.registry import LocalAgents

log = logging.getLogger(__name__)

AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$")
MAX_METADATA_BYTES = 64 << 20  # many registered KV regions make large metadata
MAX_WAIT_S = 300.0
TTL_HEADER = "X-PDD-TTL-Seconds"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _float_param(request: web.Request, name: str, default: float) -> float:
    try:
        return min(max(float(request.query.get(name, default)), 0.0), MAX_WAIT_S)
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{name} must be a number") from exc


def _int_param(request: web.Request, name: str, default: int) -> int:
    try:
        return int(request.query.get(name, default))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{name} must be an integer") from exc


def _role_param(request: web.Request, own_role: str) -> str | None:
    """The role asked for; engines ask for the other role by default, ``any`` for all."""
    role = request.query.get("role", other_role(own_role))
    if role == "any":
        return None
    if role not in ROLES:
        raise web.HTTPBadRequest(text=f"role must be one of {ROLES} or any")
    return role


def bearer_auth(token: Callable[[], str]) -> Middleware:
    """Every route but /healthz needs the token now in force (`token()`: it changes when the
    operator creates a deleted token Secret again)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        # compare_digest: no timing side channel on how much of the token matched.
        expected = token().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), expected):
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return middleware


class Sidecar:
    """One sidecar: the local registry, the peer tracker and the HTTP routes over them."""

    def __init__(self, config: SidecarConfig, source: PeerSource) -> None:
        self.config = config
        self.identity = config.identity
        self.metrics = SidecarMetrics()
        self.local = LocalAgents(start_generation=int(time.time() * 1000))
        self.tracker = PeerTracker(
            self.identity,
            (self.identity.pod_ip or config.host, config.port),
            source,
            config.token,
            self.metrics,
            grace_s=config.peer_grace_s,
            poll_timeout_s=config.poll_timeout_s,
            resync_s=config.resync_s,
            on_removed=self._on_removed,
        )
        self.targets = ProbeTargets()
        self.janitor: EtcdJanitor | None = None
        channel = side_channel_for(
            config.side_channel,
            self.identity.role,
            config.side_channel_ports,
            config.side_channel_roles,
            config.side_channel_rank_ports,
        )
        self.reachability = (
            ReachabilityChecker(
                channel, self.tracker.live_peers, self.metrics, config.connect_timeout_s
            )
            if channel
            else None
        )
        self.last_probe: dict[str, Any] | None = None
        self._probe_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[bearer_auth(self.config.token)], client_max_size=MAX_METADATA_BYTES
        )
        app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/metrics", self.metrics_page),
                web.put("/v1/agents/{name}", self.put_agent),
                web.get("/v1/agents/{name}", self.get_agent),
                web.delete("/v1/agents/{name}", self.delete_agent),
                web.get("/v1/peers", self.get_peers),
                web.get("/v1/peers/watch", self.watch_peers),
                web.get("/v1/local/agents", self.local_agents),
                web.get("/v1/status", self.status),
                web.post("/v1/probe", self.post_probe),
                web.post("/v1/probe/targets", self.post_probe_target),
                web.get("/v1/probe/targets/{id}", self.get_probe_target),
                web.delete("/v1/probe/targets/{id}", self.delete_probe_target),
            ]
        )
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._release_long_polls)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession()
        self._spawn(self.tracker.run())
        self._spawn(self._expire_forever())
        if self.config.exchange == "etcd":
            assert self.config.etcd is not None
            gateway = EtcdGateway(self.config.etcd.endpoints, self._session)
            self.janitor = EtcdJanitor(self.config.etcd, gateway, self.local, self.metrics)
            self._spawn(self.janitor.run_refresh(self.config.resync_s / 2))
        if self.reachability is not None:
            self._spawn(self.reachability.run(self.config.reachability_interval_s))
        if self.config.prober:
            pod = PodAnnotations(self.identity.namespace, self.identity.pod_name)
            requests = ProbeRequests(pod, self.probe_other_role, self.config.probe_poll_s)
            self._spawn(requests.run())

    async def _release_long_polls(self, _app: web.Application) -> None:
        """Answer held watches now, so shutdown does not wait out their timeouts."""
        self.local.release_waiters()
        self.tracker.signal.fire()

    async def _cleanup(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.targets.close()
        if self._session is not None:
            await self._session.close()

    def _spawn(self, coro: Awaitable[None]) -> None:
        self._tasks.append(asyncio.ensure_future(coro))

    async def outlive_engine(self, limit_s: float) -> None:
        """Every container of a pod gets SIGTERM at once, and the engine then drains: its
        requests in flight still load their peers' metadata from here. So serve on until the
        engine has unpublished its agents (it does as it stops; a dead engine's expire), at
        most `limit_s`."""
        deadline = time.monotonic() + limit_s
        if self.local.all():
            log.info("stopping once the engine's agents are gone (at most %g s)", limit_s)
        while self.local.all() and (left := deadline - time.monotonic()) > 0:
            await self.local.wait_changed(self.local.generation, left)

    async def _expire_forever(self) -> None:
        while True:
            for name in self.local.expire():
                log.info("agent %s expired: its engine stopped re-publishing", name)
            await asyncio.sleep(1.0)

    async def _on_removed(self, removals: list[Removal]) -> None:
        if self.janitor is not None:
            await self.janitor.on_removed(removals)

    # -- engine-facing

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def put_agent(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not AGENT_NAME.match(name):
            return _error(400, "agent name: letters, digits and ._:@- only, at most 253")
        metadata = await request.read()
        if not metadata and self.config.exchange == "sidecar":
            return _error(400, "empty metadata: send nixl_agent.get_agent_metadata() bytes")
        try:
            ttl = float(request.headers.get(TTL_HEADER, "0")) or None
        except ValueError:
            return _error(400, f"{TTL_HEADER} must be a number of seconds")
        # Mode etcd: publish with the revision already read, so that peers never see the agent
        # first without one (that would look like a re-publication a moment later).
        revision = await self.janitor.revision(name) if self.janitor is not None else None
        agent = self.local.publish(name, metadata, ttl, revision)
        return web.json_response(
            {"name": name, "sha256": agent.sha256, "generation": self.local.generation}
        )

    async def delete_agent(self, request: web.Request) -> web.Response:
        if not self.local.unpublish(request.match_info["name"]):
            return _error(404, "no such local agent")
        return web.json_response({"generation": self.local.generation})

    async def get_agent(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        local = self.local.get(name)
        if local is not None:
            return self._metadata_response(
                local.metadata,
                local.sha256,
                self.identity.role,
                self.identity.pod_name,
                self.identity.pod_uid,
            )
        record = self.tracker.agent(name)
        if record is None:
            return _error(404, "no live peer publishes this agent")
        if not record.metadata:
            return _error(404, "this agent publishes its metadata through etcd")
        return self._metadata_response(
            record.metadata, record.sha256, record.role, record.pod, record.pod_uid
        )

    @staticmethod
    def _metadata_response(
        metadata: bytes, sha: str, role: str, pod: str, uid: str
    ) -> web.Response:
        headers = {
            "X-PDD-Metadata-SHA256": sha,
            "X-PDD-Role": role,
            "X-PDD-Pod": pod,
            "X-PDD-Pod-UID": uid,
            "Cache-Control": "no-store",
        }
        return web.Response(body=metadata, content_type="application/octet-stream", headers=headers)

    async def get_peers(self, request: web.Request) -> web.Response:
        role = _role_param(request, self.identity.role)
        agents = [r for r in self.tracker.history.view.values() if role in (None, r.role)]
        now = time.monotonic()
        pods = [p.to_json(now) for p in self.tracker.peers() if role in (None, p.endpoint.role)]
        return web.json_response(
            {
                "version": self.tracker.history.version,
                "role": role or "any",
                "agents": [r.to_json() for r in sorted(agents, key=_by_name)],
                "pods": pods,
            }
        )

    async def watch_peers(self, request: web.Request) -> web.Response:
        role = _role_param(request, self.identity.role)
        since = _int_param(request, "since", 0)
        await self.tracker.wait_changed(since, _float_param(request, "wait_s", 30.0))
        changes = self.tracker.history.changes_since(since).for_role(role)
        return web.json_response(changes.to_json())

    async def status(self, _request: web.Request) -> web.Response:
        now = time.monotonic()
        return web.json_response(
            {
                "self": self.identity.to_json(),
                "exchange": self.config.exchange,
                "version": self.tracker.history.version,
                "local_agents": [a.to_json(include_metadata=False) for a in self.local.all()],
                "peers": [p.to_json(now) for p in self.tracker.peers()],
                # Peers of the other role with another engine revision: never paired with.
                "incompatible_peers": [p.to_json(now) for p in self.tracker.incompatible_peers()],
                "side_channel": self.reachability.to_json() if self.reachability else [],
                "last_probe": self.last_probe,
            }
        )

    async def post_probe(self, request: web.Request) -> web.Response:
        body = await request.json()
        peer_name = body.pop("peer", None)
        peer = next((p for p in self.tracker.live_peers() if p.pod_name == peer_name), None)
        if peer is None:
            return _error(404, f"no live peer pod named {peer_name!r}")
        try:
            spec = ProbeSpec.from_dict(body)
        except (TypeError, ValueError) as exc:
            return _error(400, str(exc))
        if self._probe_lock.locked():
            return _error(409, "a probe is already running from this pod")
        return web.json_response((await self.probe_peer(peer, spec)).to_dict())

    async def probe_peer(self, peer: PeerState, spec: ProbeSpec) -> ProbeResult:
        """One probe at a time from this pod: they would share the memory and the link."""
        async with self._probe_lock:
            assert self._session is not None
            result = await run_remote_probe(
                self._session, peer.endpoint.base_url, self.config.token(), spec
            )
        self._record_probe(result, peer.endpoint.role, peer.pod_name)
        return result

    async def probe_other_role(self, peer_pod: str = "") -> ProbeResult:
        """The operator's probe: to ``peer_pod`` where the request names one (this rank's
        pair), else to the first live peer of the other role; default spec.

        A request can be seen before discovery has found the peers (a sidecar that just
        started): wait for one up to ``probe_peer_wait_s`` before answering with an error."""
        role = other_role(self.identity.role)
        deadline = time.monotonic() + self.config.probe_peer_wait_s
        while True:
            peers = sorted(
                (
                    p
                    for p in self.tracker.live_peers()
                    if p.endpoint.role == role and peer_pod in ("", p.pod_name)
                ),
                key=lambda p: p.pod_name,
            )
            if peers or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.25)
        if not peers:
            error = f"no {role} pod with a reachable sidecar to probe"
            if peer_pod:
                error = (
                    f"{role} pod {peer_pod}, this rank's pair, has no reachable sidecar: check "
                    "that it runs, that its nixl-sidecar container is Ready and that the "
                    "NetworkPolicy admits this pod"
                )
            return ProbeResult(
                src_role=self.identity.role, dst_role=role, peer=peer_pod, error=error
            )
        peer = await self.probe_peer(peers[0], ProbeSpec())
        return operator_answer(peer, read_kv_path_check(Path(self.config.kv_path_file)))

    def _record_probe(self, result: ProbeResult, dst_role: str, peer: str) -> None:
        result.src_role, result.dst_role, result.peer = self.identity.role, dst_role, peer
        labels = (result.src_role, dst_role, result.path)
        if result.error or not result.verified:
            self.metrics.transfer_errors.labels(*labels).inc()
        else:
            self.metrics.transfer_bandwidth.labels(*labels).set(result.gbps * 1e9)
        self.last_probe = result.to_dict()

    # -- sidecar-facing

    async def local_agents(self, request: web.Request) -> web.Response:
        since = request.query.get("since")
        started = time.monotonic()
        if since is not None:
            wait_s = _float_param(request, "wait_s", 20.0)
            await self.local.wait_changed(_int_param(request, "since", 0), wait_s)
        return web.json_response(
            {
                "self": self.identity.to_json(),
                "generation": self.local.generation,
                "agents": [a.to_json(include_metadata=True) for a in self.local.all()],
                "waited_s": round(time.monotonic() - started, 4),
            }
        )

    async def post_probe_target(self, request: web.Request) -> web.Response:
        try:
            spec = ProbeSpec.from_dict(await request.json())
        except (TypeError, ValueError) as exc:
            return _error(400, str(exc))
        try:
            return web.json_response(await self.targets.create(spec))
        except ProbeBusy as exc:
            return _error(409, str(exc))
        except RuntimeError as exc:
            return _error(500, str(exc))

    async def get_probe_target(self, request: web.Request) -> web.Response:
        try:
            verdict = await self.targets.verdict(
                request.match_info["id"], _float_param(request, "wait_s", 30.0)
            )
        except KeyError:
            return _error(404, "no such probe target")
        return web.json_response(verdict)

    async def delete_probe_target(self, request: web.Request) -> web.Response:
        if not await self.targets.delete(request.match_info["id"]):
            return _error(404, "no such probe target")
        return web.json_response({"deleted": True})


def _by_name(record: AgentRecord) -> str:
    return record.name


async def serve(config: SidecarConfig, source: PeerSource, access_log: bool = False) -> None:
    """Run until SIGTERM/SIGINT."""
    sidecar = Sidecar(config, source)
    runner = web.AppRunner(
        sidecar.build_app(), access_log=log if access_log else None, shutdown_timeout=5
    )
    await runner.setup()
    sites: list[web.BaseSite] = [web.TCPSite(runner, config.host, config.port)]
    if config.unix_socket:
        sites.append(web.UnixSite(runner, config.unix_socket))
    for site in sites:
        await site.start()
    log.info(
        "pdd-sidecar %s/%s (%s, exchange %s) listening on %s:%d",
        config.identity.namespace,
        config.identity.pod_name,
        config.identity.role,
        config.exchange,
        config.host,
        config.port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        await sidecar.outlive_engine(config.drain_s)
    finally:
        await runner.cleanup()
