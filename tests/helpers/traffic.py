"""Requests through a router, one at a time or as steady background traffic, with every outcome
kept: the request-path tests count what succeeded, what failed and how long the slowest took.

Completions go to the OpenAI-compatible ``/v1/completions``. The reference engine adds a
``pdd_refengine`` field to each answer saying which prefill and decode served it and how many KV
bytes the decode verified; a real engine's answer simply lacks it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    status: int | None = None
    error: str = ""
    text: str = ""
    served: dict[str, Any] = field(default_factory=dict)  # the reference engine's report
    url: str = ""  # where it was sent
    sent_at: float = 0.0  # wall clock (time.time()) when it was sent: to line up with pod logs

    @property
    def kv_bytes(self) -> int:
        return int(self.served.get("kv_bytes", 0)) if self.served.get("kv_verified") else 0


def complete(
    url: str, model: str, prompt: str, max_tokens: int = 8, timeout: float = 30
) -> Outcome:
    """One non-streaming completion; never raises for what the server or network did."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    sent_at, started = time.time(), time.monotonic()
    where = {"url": url, "sent_at": sent_at}
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
            return Outcome(
                ok=bool(answer.get("choices")),
                seconds=time.monotonic() - started,
                status=response.status,
                text=answer["choices"][0].get("text", "") if answer.get("choices") else "",
                served=answer.get("pdd_refengine") or {},
                **where,
            )
    except urllib.error.HTTPError as err:
        detail = err.read()[:300].decode(errors="replace")
        return Outcome(
            False, time.monotonic() - started, err.code, f"HTTP {err.code}: {detail}", **where
        )
    except (OSError, ValueError) as err:
        error = f"{type(err).__name__}: {err}"
        return Outcome(False, time.monotonic() - started, None, error, **where)


Target = str | Callable[[], str]


class SteadyTraffic:
    """`workers` threads sending completions back to back (with `pause_s` between), until
    stopped. Each prompt differs, so every request moves its own KV. `url` may be a function,
    asked before every request: what a Service would do, picking a ready endpoint each time."""

    def __init__(
        self,
        url: Target,
        model: str,
        *,
        workers: int = 2,
        timeout: float = 30,
        pause_s: float = 0.05,
    ) -> None:
        self._url, self._model = url, model
        self._workers, self._timeout, self._pause = workers, timeout, pause_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.outcomes: list[Outcome] = []

    def start(self) -> SteadyTraffic:
        for index in range(self._workers):
            thread = threading.Thread(target=self._send_forever, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(self._timeout + 5)
        with self._lock:
            return list(self.outcomes)

    def _send(self, prompt: str) -> Outcome:
        try:
            url = self._url() if callable(self._url) else self._url
        except Exception as err:  # no endpoint to send to counts as a failed request
            return Outcome(False, 0.0, None, f"no endpoint: {err}", sent_at=time.time())
        return complete(url, self._model, prompt, timeout=self._timeout)

    def _send_forever(self, worker: int) -> None:
        count = 0
        while not self._stop.is_set():
            prompt = f"request {worker}-{count}: " + " ".join(
                f"w{i}" for i in range(24 + count % 9)
            )
            outcome = self._send(prompt)
            with self._lock:
                self.outcomes.append(outcome)
            count += 1
            self._stop.wait(self._pause)


@contextmanager
def steady_traffic(url: Target, model: str, **kwargs: Any) -> Iterator[SteadyTraffic]:
    traffic = SteadyTraffic(url, model, **kwargs).start()
    try:
        yield traffic
    finally:
        traffic.stop()


@dataclass
class Tally:
    """What a run of requests came to, for the request-path summary."""

    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    kv_bytes_verified: int = 0
    slowest_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def add(self, outcomes: list[Outcome]) -> Tally:
        for outcome in outcomes:
            self.sent += 1
            self.succeeded += outcome.ok
            self.failed += not outcome.ok
            self.kv_bytes_verified += outcome.kv_bytes
            self.slowest_s = max(self.slowest_s, outcome.seconds)
            if not outcome.ok and len(self.errors) < 5:
                self.errors.append(outcome.error)
        return self


def when_and_where(outcomes: list[Outcome]) -> str:
    """Failed outcomes grouped by the URL they went to, with the UTC span they were sent in, to
    line up with the pods' logs (a router pod's address names the pod)."""
    spans: dict[str, list[float]] = {}
    for outcome in outcomes:
        spans.setdefault(outcome.url or "no endpoint", []).append(outcome.sent_at)
    return "; ".join(
        f"{len(times)} via {url} from {_utc(min(times))} to {_utc(max(times))}"
        for url, times in sorted(spans.items())
    )


def _utc(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}"
