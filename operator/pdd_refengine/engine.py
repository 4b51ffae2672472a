"""The engine's state shared by both protocols: config, identity, KV cache, metrics, sidecar,
and the blocking work (NIXL, sidecar calls) moved off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from typing import Any, TypeVar

from pdd_refengine.cli import EngineConfig
from pdd_refengine.kvcache import KvCache, RegionInfo, TransferError
from pdd_refengine.layout import layout_for
from pdd_refengine.metrics import EngineMetrics, engine_metrics
from pdd_refengine.openai_api import Completion
from pdd_sidecar.client import SidecarClient, SidecarError

log = logging.getLogger("pdd_refengine")
T = TypeVar("T")

KV_TIMEOUT_ENV = "PDD_REFENGINE_KV_TIMEOUT_S"  # every wait of one request's KV handoff
FAULT_FIELD = "pdd_refengine_fault"  # request body: "corrupt_kv" (tests of the decode's check)


@dataclass(frozen=True)
class KvOutcome:
    """One request's KV handoff, as the ``pdd_refengine`` response field reports it."""

    prefill: str
    decode: str
    kv_bytes: int
    verified: bool
    seconds: float = 0.0
    prefill_address: str = ""  # the pods' IPs: names repeat across a StatefulSet's revisions
    decode_address: str = ""

    def field(self) -> dict[str, Any]:
        return {
            "pdd_refengine": {
                "prefill": self.prefill,
                "decode": self.decode,
                "kv_bytes": self.kv_bytes,
                "kv_verified": self.verified,
                "kv_seconds": round(self.seconds, 6),
                "prefill_address": self.prefill_address,
                "decode_address": self.decode_address,
            }
        }


class KvSteps:
    """How long each step of one KV transfer took. Logged when it fails or is slow, and by
    the drain for those still under way: a request stuck in a transfer leaves no other trace."""

    SLOW_S = 2.0

    def __init__(self, what: str) -> None:
        self.what = what
        self.started = self._last = time.monotonic()
        self.durations: list[tuple[str, float]] = []
        self._reported = False

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.durations.append((step, now - self._last))
        self._last = now

    def describe(self) -> str:
        steps = ", ".join(f"{step} {seconds:.2f} s" for step, seconds in self.durations)
        return (
            f"{self.what} at {time.monotonic() - self.started:.2f} s, steps done: "
            f"{steps or 'none'}, then {time.monotonic() - self._last:.2f} s in the next"
        )

    def report(self, error: BaseException | None = None) -> None:
        slow = time.monotonic() - self.started >= self.SLOW_S
        if self._reported or (error is None and not slow):
            return
        self._reported = True
        outcome = f"failed ({type(error).__name__}: {error})" if error else "slow"
        log.warning("%s %s: %s", self.what, outcome, self.describe())


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # A pod's HOSTNAME is its name (the kubelet sets it); POD_NAME where a test sets it.
        self.identity = (
            os.environ.get("POD_NAME")
            or os.environ.get("HOSTNAME")
            or f"{config.host}:{config.port}"
        )
        self.address = os.environ.get("POD_IP") or config.host
        self.draining = False  # after SIGTERM: still serving, no longer healthy
        self.engine_id = _agent_name(f"{self.identity}-{uuid.uuid4().hex[:8]}")
        self.layout = layout_for(config.model)
        self.cache = KvCache(
            self.engine_id, self.layout, config.block_tokens, config.region_bytes, config.memory
        )
        self.metrics: EngineMetrics = engine_metrics(config.engine, config.served_name)
        self.kv_timeout_s = float(os.environ.get(KV_TIMEOUT_ENV) or 30)
        self.sidecar = SidecarClient.from_env(timeout_s=5)
        self.published = threading.Event()
        self.stop = threading.Event()
        self.transfers: set[KvSteps] = set()  # KV transfers under way, for the drain's report

    @contextlib.contextmanager
    def kv_steps(self, what: str) -> Iterator[KvSteps]:
        """Times the steps of one KV transfer; logs them if it fails or is slow."""
        steps = KvSteps(what)
        self.transfers.add(steps)
        try:
            yield steps
        except BaseException as exc:
            steps.report(exc)
            raise
        finally:
            self.transfers.discard(steps)
            steps.report()

    def transfers_under_way(self) -> str:
        return "; ".join(steps.describe() for steps in list(self.transfers)) or "none"

    def publish_forever(self) -> None:
        """Publish the agent's metadata to the sidecar, retrying until it answers, then keep
        it published (a heartbeat: it disappears within the TTL if this process dies)."""

        def run() -> None:
            metadata = self.cache.metadata()
            delay = 0.2
            while not self.stop.is_set():
                try:
                    self.sidecar.keep_published(self.engine_id, metadata, ttl_s=30)
                except (OSError, SidecarError) as exc:
                    log.warning("publishing agent metadata to the sidecar failed: %s", exc)
                    self.stop.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                log.info("agent %s published to the sidecar", self.engine_id)
                self.published.set()
                return

        threading.Thread(target=run, name="pdd-refengine-publish", daemon=True).start()

    def fetch_peer_metadata(self, agent: str, deadline: float) -> bytes:
        """A peer agent's metadata through this pod's sidecar. A just-started peer may not be
        known to the sidecar yet, so a 404 is retried until ``deadline``."""
        delay = 0.05
        while True:
            try:
                return self.sidecar.fetch(agent)
            except (OSError, SidecarError) as exc:
                if time.monotonic() + delay > deadline:
                    raise TransferError(
                        f"the sidecar has no metadata of agent {agent}: {exc}"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def load_peer(self, agent: str, deadline: float) -> None:
        self.cache.load_remote(agent, self.fetch_peer_metadata(agent, deadline))

    def record_received(self, outcome: KvOutcome) -> None:
        if outcome.verified:
            self.metrics.kv_bytes_verified.inc(outcome.kv_bytes)
        else:
            self.metrics.kv_verify_failures.inc()
        self.metrics.kv_transfer_seconds.observe(outcome.seconds)
        log.info(
            "KV from %s: %d bytes in %.4f s (%.2f GB/s), verified=%s",
            outcome.prefill,
            outcome.kv_bytes,
            outcome.seconds,
            outcome.kv_bytes / max(outcome.seconds, 1e-9) / 1e9,
            outcome.verified,
        )

    def region_json(self) -> dict[str, Any]:
        return {**self.cache.info.to_json(), "identity": self.identity, "address": self.address}


async def off_loop(func: Callable[..., T], *args: Any) -> T:
    """Run blocking work (NIXL, sidecar, numpy over gigabytes) in a thread."""
    return await asyncio.to_thread(func, *args)


async def compute_prompt_kv(engine: Engine, req: Completion) -> list[int]:
    """The prefill's work: the prompt's KV written into newly allocated blocks (one byte
    flipped when the request asks for that fault); the blocks are released if it fails."""
    tokens = len(req.prompt_tokens)
    blocks = await off_loop(engine.cache.allocate, tokens)
    try:
        await off_loop(engine.cache.write_prompt, blocks, req.digest, tokens)
        if req.body.get(FAULT_FIELD) == "corrupt_kv":
            await off_loop(engine.cache.corrupt_one_byte, blocks[-1])
    except BaseException:
        engine.cache.release(blocks)
        raise
    return blocks


class PeerHTTPError(TransferError):
    """A peer engine answered, with an HTTP error status."""

    def __init__(self, url: str, status: int, body: bytes) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:300]!r}")
        self.status = status


def http_call(method: str, url: str, body: Any, timeout_s: float) -> tuple[bytes, Message]:
    """A small blocking call to a peer engine (side channel, bootstrap server): the answer's
    body and headers; an error status raises ``PeerHTTPError``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=max(timeout_s, 0.1)) as response:
            return response.read(), response.headers
    except urllib.error.HTTPError as err:
        raise PeerHTTPError(url, err.code, err.read()) from None
    except OSError as exc:
        raise TransferError(f"cannot reach {url}: {exc}") from None


def http_json(method: str, url: str, body: Any, timeout_s: float) -> Any:
    """``http_call`` for a JSON answer."""
    answer, _headers = http_call(method, url, body, timeout_s)
    try:
        return json.loads(answer or b"null")
    except ValueError as exc:
        raise TransferError(f"{url} answered no JSON: {exc}") from None


def region_of(data: Any) -> RegionInfo:
    try:
        return RegionInfo.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise TransferError(f"the peer's region description is malformed: {exc}") from None


def _agent_name(text: str) -> str:
    """A sidecar agent name: letters, digits and ._:@- only."""
    return re.sub(r"[^A-Za-z0-9._:@-]", "-", text).lstrip("._:@-")[:200] or "refengine"
