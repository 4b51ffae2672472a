"""The HTTP face of the reference engine (a test double; see the package docstring): the
OpenAI and SGLang routes the routers forward to, and the endpoints they poll."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdd_refengine import openai_api, sglang_flow, vllm_flow, vllm_push
from pdd_refengine.cli import EngineConfig, UsageError, parse_args
from pdd_refengine.engine import Engine, KvOutcome, log
from pdd_refengine.kv_params import KvParamsError, wants_remote_decode, wants_remote_prefill
from pdd_refengine.kvcache import CacheFull, TransferError, run_notif_loop
from pdd_refengine.openai_api import BadRequest, Completion, ModelNotFound
from pdd_refengine.sglang_bootstrap import BootstrapServer

VERSION = "0.1.0-pdd-refengine"
# After SIGTERM: serve at most this long (env, seconds), ending early once idle this long.
DRAIN_ENV = "PDD_REFENGINE_DRAIN_SECONDS"
# Seconds the test double takes per token after the first (default 0: no model runs here);
# set to give the inter-token latency a shape, as hack/dashboard_picture.py does.
STEP_ENV = "PDD_REFENGINE_STEP_SECONDS"
DRAIN_QUIET_S = 3.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class App:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.config: EngineConfig = engine.config
        self.held = vllm_flow.HeldBlocks(engine)
        self.rooms = sglang_flow.Rooms(engine, loop)
        self.pushes = vllm_push.Pushes(engine, loop)
        self.in_flight = 0  # requests being served, for the routers' load polls
        self.step_seconds = float(os.environ.get(STEP_ENV) or 0)

    def on_notif(self, agent: str, message: bytes) -> None:
        self.held.on_notif(agent, message)
        self.rooms.on_notif(agent, message)
        self.pushes.on_notif(agent, message)

    def build(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        routes = [
            web.post("/v1/completions", self._serve(openai_api.COMPLETIONS)),
            web.post("/v1/chat/completions", self._serve(openai_api.CHAT)),
            web.post("/generate", self._serve(openai_api.GENERATE)),
            web.get("/health", self.health),
            web.get("/health_generate", self.health),
            web.get("/ready", self.health),  # SGLang 0.5.20 and later
            web.get("/ping", self.health),
            web.get("/metrics", self.metrics),
            web.get("/version", self.version),
            web.get("/v1/models", self.models),
        ]
        for path in ("/get_load", "/get_loads", "/loads", "/v1/loads"):
            routes.append(web.get(path, self.load))
        for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            routes.append(web.get(path, self.server_info))
        app.add_routes(routes)
        return app

    # -- what routers poll

    async def health(self, _request: web.Request) -> web.Response:
        if not self.engine.published.is_set():
            return web.Response(status=503, text="NIXL agent metadata not published yet")
        if self.engine.draining:
            return web.Response(status=503, text="shutting down: finishing the requests in flight")
        return web.Response(text="")

    def idle(self) -> bool:
        """No request in flight and no KV held for a peer (a decode may still read it)."""
        return self.in_flight == 0 and self.engine.cache.usage() == 0

    async def metrics(self, _request: web.Request) -> web.Response:
        self.engine.metrics.kv_usage.set(self.engine.cache.usage())
        body = generate_latest(self.engine.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION, "engine": self.config.engine})

    async def models(self, _request: web.Request) -> web.Response:
        c = self.config
        card = {
            "id": c.served_name,
            "object": "model",
            "created": 0,
            "owned_by": c.engine,
            "root": c.model,
            "max_model_len": c.max_model_len,
        }
        # vLLM lists each LoRA adapter with the base model as its parent (serving_models.py).
        adapters = [
            {**card, "id": name, "root": path, "parent": c.served_name} for name, path in c.adapters
        ]
        return web.json_response({"object": "list", "data": [card, *adapters]})

    async def load(self, _request: web.Request) -> web.Response:
        running = self.in_flight
        return web.json_response(
            {
                "load": running,
                "num_reqs": running,
                "num_waiting_reqs": 0,
                "kv_cache_usage": self.engine.cache.usage(),
            }
        )

    async def server_info(self, _request: web.Request) -> web.Response:
        c = self.config
        return web.json_response(
            {
                "model_path": c.model,
                "served_model_name": c.served_name,
                "tp_size": c.tp_size,
                "dp_size": 1,
                "page_size": c.block_tokens,
                "max_model_len": c.max_model_len,
                "disaggregation_mode": c.role if c.engine == "sglang" else "null",
                "disaggregation_bootstrap_port": c.bootstrap_port,
                "disaggregation_transfer_backend": "nixl",
                "is_generation": True,
                "version": VERSION,
                "engine": c.engine,
            }
        )

    # -- completions

    def _serve(self, kind: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            metrics = self.engine.metrics
            metrics.running.inc()
            self.in_flight += 1
            try:
                return await self._complete(kind, request)
            except (BadRequest, KvParamsError, UsageError) as exc:
                return _error(400, "BadRequestError", str(exc))
            except ModelNotFound as exc:
                return _error(404, "NotFoundError", str(exc))
            except CacheFull as exc:
                return _error(503, "ServiceUnavailableError", str(exc))
            except TransferError as exc:
                log.warning("request failed: %s", exc)
                return _error(502, "KVTransferError", str(exc))
            finally:
                metrics.running.dec()
                self.in_flight -= 1

        return handler

    async def _complete(self, kind: str, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        log.debug("%s %s fields %s", request.method, request.path, sorted(body))
        req = openai_api.parse_request(
            kind, body, self.config.served_name, request.headers.get("X-Request-Id", "")
        )
        self._check_model_len(req)
        adapter = openai_api.requested_adapter(
            self.config.engine,
            req.body,
            self.config.served_name,
            [name for name, _ in self.config.adapters],
        )
        arrived = time.monotonic()
        count, extra = await self._handoff(req)
        self.engine.metrics.time_to_first_token.observe(time.monotonic() - arrived)
        if adapter:
            self.engine.metrics.lora_requests.labels(adapter=adapter).inc()
        self.engine.metrics.prompt_tokens.inc(len(req.prompt_tokens))
        self.engine.metrics.generation_tokens.inc(count)
        self.engine.metrics.successes.inc()
        if req.stream:
            return await self._stream(request, req, count, extra)
        for _ in range(count - 1):
            await self._next_token()
        return web.json_response(openai_api.response(req, count, extra))

    async def _next_token(self) -> None:
        """One decode step after the first token: the step time, observed as measured."""
        started = time.monotonic()
        await asyncio.sleep(self.step_seconds)
        self.engine.metrics.inter_token_latency.observe(time.monotonic() - started)

    def _check_model_len(self, req: Completion) -> None:
        limit = self.config.max_model_len
        if limit is not None and len(req.prompt_tokens) + req.max_tokens > limit:
            raise BadRequest(
                f"{len(req.prompt_tokens)} prompt tokens + {req.max_tokens} to generate exceed "
                f"--max-model-len {limit}"
            )

    async def _handoff(self, req: Completion) -> tuple[int, dict[str, Any]]:
        """The request's KV part: (tokens to generate, extra response fields)."""
        engine = self.engine
        if self.config.engine == "vllm":
            params = req.body.get("kv_transfer_params")
            push = self.config.kv_mode == "push"
            if wants_remote_decode(params) and push:
                return 1, await vllm_push.prefill(engine, self.pushes, req)
            if wants_remote_decode(params):
                return 1, await vllm_flow.prefill(engine, self.held, req)
            if wants_remote_prefill(params) and push:
                outcome = await vllm_push.decode(engine, self.pushes, req, params)
                return req.max_tokens, outcome.field()
            if wants_remote_prefill(params):
                outcome = await vllm_flow.decode(engine, req, params)
                return req.max_tokens, outcome.field()
        else:
            bootstrap = sglang_flow.bootstrap_of(req)
            if bootstrap is not None and self.config.role == "prefill":
                outcome = await sglang_flow.prefill(engine, self.rooms, req, bootstrap[2])
                return 1, outcome.field()
            if bootstrap is not None:
                outcome = await sglang_flow.decode(engine, self.rooms, req, bootstrap)
                return req.max_tokens, outcome.field()
        # Not disaggregated: this engine is prefill and decode, no KV moves.
        local = KvOutcome(engine.identity, engine.identity, 0, False)
        return req.max_tokens, local.field()

    async def _stream(
        self, request: web.Request, req: Completion, count: int, extra: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for i, event in enumerate(openai_api.sse_events(req, count, extra)):
            if 0 < i < count:
                await self._next_token()
            await response.write(event)
        await response.write_eof()
        return response


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response(
        {
            "object": "error",
            "error": {"message": message, "type": kind, "code": status},
            "message": message,
            "type": kind,
            "code": status,
        },
        status=status,
    )


# -- running -----------------------------------------------------------------------------------


async def serve(config: EngineConfig) -> None:
    loop = asyncio.get_running_loop()
    engine = await asyncio.to_thread(Engine, config)
    app = App(engine, loop)
    run_notif_loop(engine.cache, app.on_notif, engine.stop)
    engine.publish_forever()
    # SGLang: the prefill's rank is registered before the engine takes a request.
    runners = await _start_sglang(engine, app) if config.engine == "sglang" else []
    runners.append(await _start(app.build(), config.host, config.port))
    if config.engine == "vllm":
        side_host, side_port = vllm_flow.side_channel(config)
        runners.append(await _start(vllm_flow.side_channel_app(engine), side_host, side_port))
    log.info(
        "reference engine (test double) %s serving %s as %s on %s:%d, agent %s, "
        "%d KV blocks of %d B (%d B/token, %s)",
        config.engine,
        config.served_name,
        config.role,
        config.host,
        config.port,
        engine.engine_id,
        engine.cache.info.num_blocks,
        engine.cache.block_bytes,
        engine.cache.bytes_per_token,
        engine.cache.info.mem,
    )
    stopped = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await _drain(engine, app)
    engine.stop.set()
    for runner in runners:
        await runner.cleanup()
    await app.rooms.sockets.close()
    await asyncio.to_thread(_unpublish, engine)


async def _start_sglang(engine: Engine, app: App) -> list[web.AppRunner]:
    """The rank's ZMQ socket, and on a prefill the bootstrap server with the rank in it."""
    config, runners = engine.config, []
    if config.role == "prefill" and config.bootstrap_port:
        server = BootstrapServer(config.bootstrap_protocol, engine.identity)
        runners.append(await _start(server.app(), config.host, config.bootstrap_port))
    await sglang_flow.start_rank(engine, app.rooms)
    log.info(
        "SGLang %s bootstrap exchange, rank socket %s",
        config.bootstrap_protocol,
        app.rooms.sockets.endpoint,
    )
    return runners


async def _drain(engine: Engine, app: App) -> None:
    """As vLLM does on SIGTERM: unhealthy at once (so the kubelet marks the pod not Ready and
    the routers stop choosing it), while the requests in flight, and KV held for decodes,
    finish; then stop, at the latest after the drain time."""
    engine.draining = True
    deadline = time.monotonic() + float(os.environ.get(DRAIN_ENV) or 8)
    quiet_since = None
    while time.monotonic() < deadline:
        if not app.idle():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= DRAIN_QUIET_S:
            return
        await asyncio.sleep(0.1)
    log.warning(
        "drain time over with %d request(s) in flight; transfers: %s",
        app.in_flight,
        engine.transfers_under_way(),
    )


async def _start(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def _unpublish(engine: Engine) -> None:
    try:
        engine.sidecar.unpublish(engine.engine_id)
    except Exception as exc:  # the sidecar may be gone first; its TTL then drops the agent
        log.info("unpublishing at shutdown: %s", exc)


def main(argv: Sequence[str] | None = None) -> int:
    level = os.environ.get("PDD_REFENGINE_LOG_LEVEL", "info").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s pdd-refengine: %(message)s",
    )
    try:
        config = parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        sys.stderr.write(f"pdd-refengine: {exc}\n")
        return 2
    if config.ignored:
        log.warning(
            "ignoring flags the reference engine does not use: %s", " ".join(config.ignored)
        )
    started = time.monotonic()
    asyncio.run(serve(config))
    log.info("stopped after %.0f s", time.monotonic() - started)
    return 0
