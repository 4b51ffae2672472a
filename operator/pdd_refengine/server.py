"""The HTTP face of the reference engine (a test double; see the package docstring): the
OpenAI and SGLang routes the routers forward to, and the endpoints they poll."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdd_refengine import openai_api, sglang_flow, vllm_flow, vllm_push
from pdd_refengine.cli import EngineConfig, UsageError, parse_args
from pdd_refengine.engine import Engine, KvOutcome, log
from pdd_refengine.kv_events import KvEvents
from pdd_refengine.kv_params import KvParamsError, wants_remote_decode, wants_remote_prefill
from pdd_refengine.kvcache import CacheFull, NotifLoop, TransferError
from pdd_refengine.openai_api import BadRequest, Completion, ModelNotFound
from pdd_refengine.sglang_bootstrap import BootstrapServer

VERSION = "0.1.0-pdd-refengine"
# After SIGTERM: serve at most this long (env, seconds), ending early once idle this long.
DRAIN_ENV = "PDD_REFENGINE_DRAIN_SECONDS"
# Seconds the test double takes per token after the first (default 0: no model runs here);
# set to give the inter-token latency a shape, as hack/dashboard_picture.py does.
STEP_ENV = "PDD_REFENGINE_STEP_SECONDS"
DRAIN_QUIET_S = 3.0
# vLLM serves its development routes (/server_info, /reset_prefix_cache, ...) only with this
# set to 1 (vllm/envs.py VLLM_SERVER_DEV_MODE; entrypoints/launchers/api_server/routers.py).
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# /tokenize's max_model_len when --max-model-len is not given: the double has no model whose
# context would bound it, and a router compares prompt lengths against it.
UNBOUNDED_MODEL_LEN = 2**31 - 1
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class App:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.config: EngineConfig = engine.config
        self.held = vllm_flow.HeldBlocks(engine)
        self.rooms = sglang_flow.Rooms(engine, loop)
        self.pushes = vllm_push.Pushes(engine, loop)
        self.in_flight = 0  # requests being served, for the routers' load polls
        self.notifs = NotifLoop(engine.cache, self.on_notif, engine.stop, self.awaits_peers)
        self.step_seconds = float(os.environ.get(STEP_ENV) or 0)
        self.dev_mode = os.environ.get(DEV_MODE_ENV, "0") == "1"
        # vLLM's prefix cache bookkeeping and its KV events (SGLang's are not played).
        self.kv_events = (
            KvEvents(self.config, engine.cache.info.num_blocks)
            if self.config.engine == "vllm"
            else None
        )

    def awaits_peers(self) -> bool:
        """Whether a peer's notification or read may come now (from the notification thread:
        reads of counts and dict sizes only)."""
        return (
            self.in_flight > 0
            or self.held.awaits_peers()
            or self.rooms.awaits_peers()
            or self.pushes.awaits_peers()
        )

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
        routes += self._vllm_routes() if self.config.engine == "vllm" else self._sglang_routes()
        app.add_routes(routes)
        return app

    def _sglang_routes(self) -> list[web.RouteDef]:
        paths = ("/server_info", "/get_server_info", "/model_info", "/get_model_info")
        return [web.get(path, self.server_info) for path in paths]

    def _vllm_routes(self) -> list[web.RouteDef]:
        """vLLM's: /tokenize always; from 0.33 the KV event sources and the render routes a
        router tokenizes with (entrypoints/serve/instrumentator/basic.py,
        entrypoints/scale_out/render/api_router.py); the development routes in dev mode."""
        routes = [web.post("/tokenize", self.tokenize)]
        if self.config.protocol == "0.33":
            routes += [
                web.get("/kv_event_sources", self.kv_event_sources),
                web.post("/v1/completions/render", self.render_completion),
                web.post("/v1/chat/completions/render", self.render_chat),
            ]
        if self.dev_mode:
            routes += [
                web.get("/server_info", self.vllm_server_info),
                web.post("/reset_prefix_cache", self.reset_prefix_cache),
            ]
        return routes

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

    # -- vLLM's routes beside the completions

    async def vllm_server_info(self, request: web.Request) -> web.Response:
        """vLLM's dev-mode /server_info: its config (JSON with ?config_format=json, else its
        text), the VLLM_ environment; the part of the config a double has."""
        config = self._vllm_config()
        as_json = request.query.get("config_format", "text") == "json"
        environment = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
        return web.json_response(
            {
                "vllm_config": config if as_json else str(config),
                "vllm_env": {k: v for k, v in environment.items() if "KEY" not in k},
                "system_env": {},
            }
        )

    def _vllm_config(self) -> dict[str, Any]:
        c = self.config
        return {
            "model_config": {
                "model": c.model,
                "served_model_name": c.served_name,
                "max_model_len": c.max_model_len,
            },
            "cache_config": {"block_size": c.block_tokens, "enable_prefix_caching": True},
            "parallel_config": {"tensor_parallel_size": c.tp_size, "data_parallel_size": 1},
            "kv_events_config": c.kv_events.to_json(),
        }

    async def kv_event_sources(self, _request: web.Request) -> web.Response:
        assert self.kv_events is not None
        return web.json_response(self.kv_events.sources())

    async def reset_prefix_cache(self, _request: web.Request) -> web.Response:
        assert self.kv_events is not None
        self.kv_events.reset()
        return web.Response(text="")

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: a prompt, or chat messages, as the engine tokenizes them."""
        try:
            body = await self._model_request(request)
            kind = openai_api.CHAT if "messages" in body else openai_api.COMPLETIONS
            tokens = openai_api.prompt_tokens(kind, body)
        except BadRequest as exc:
            return _error(400, "BadRequestError", str(exc))
        except ModelNotFound as exc:
            return _error(404, "NotFoundError", str(exc))
        limit = self.config.max_model_len or UNBOUNDED_MODEL_LEN
        return web.json_response(
            {"count": len(tokens), "max_model_len": limit, "tokens": tokens, "token_strs": None}
        )

    async def render_completion(self, request: web.Request) -> web.Response:
        """vLLM 0.33's completions render: one GenerateRequest per prompt."""
        try:
            body = await self._model_request(request)
            prompts = openai_api.completion_prompts_tokens(body)
        except BadRequest as exc:
            return _error(400, "BadRequestError", str(exc))
        except ModelNotFound as exc:
            return _error(404, "NotFoundError", str(exc))
        return web.json_response([_generate_request(tokens) for tokens in prompts])

    async def render_chat(self, request: web.Request) -> web.Response:
        """vLLM 0.33's chat render: the GenerateRequest of the prompt the chat turns into."""
        try:
            body = await self._model_request(request)
            tokens = openai_api.prompt_tokens(openai_api.CHAT, body)
        except BadRequest as exc:
            return _error(400, "BadRequestError", str(exc))
        except ModelNotFound as exc:
            return _error(404, "NotFoundError", str(exc))
        return web.json_response(_generate_request(tokens))

    async def _model_request(self, request: web.Request) -> dict[str, Any]:
        """The JSON body, its `model` checked as the completions check it."""
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        adapters = [name for name, _ in self.config.adapters]
        openai_api.requested_adapter("vllm", body, self.config.served_name, adapters)
        return body

    # -- completions

    def _serve(self, kind: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            metrics = self.engine.metrics
            metrics.running.inc()
            self.in_flight += 1
            self.notifs.wake()
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
        self._cache_prompt(req, adapter)
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

    def _cache_prompt(self, req: Completion, adapter: str) -> None:
        """vLLM: a request that computed its prompt's KV here (a prefill, or one served
        whole) caches the prompt's blocks, counts its prefix hit and publishes what it
        stored; a decode's KV came from its prefill."""
        metrics = self.engine.metrics
        if self.kv_events is None or wants_remote_prefill(req.body.get("kv_transfer_params")):
            return
        hit = self.kv_events.record(req.prompt_tokens, adapter)
        if metrics.prefix_cache_queries is not None and metrics.prefix_cache_hits is not None:
            metrics.prefix_cache_queries.inc(len(req.prompt_tokens))
            metrics.prefix_cache_hits.inc(hit)

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


def _generate_request(tokens: list[int]) -> dict[str, Any]:
    """vLLM 0.33's GenerateRequest, the fields a router reads (token_ids, no features)."""
    return {"request_id": uuid.uuid4().hex, "token_ids": tokens, "features": None}


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
    app.notifs.start()
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
    if app.kv_events is not None:
        await asyncio.to_thread(app.kv_events.close)
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
