"""A timer thread for the simulator's periodic and delayed work (lease renewals, node status
reports, pod status stages, foreign pods that come and go).

One thread sleeps until the earliest due time and hands each due callable to an executor, so
thousands of timers (one lease per node) cost one thread, and a slow request never delays
the next timer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

log = logging.getLogger(__name__)


class Timers:
    """`call_later(delay, fn)` runs `fn` on `executor` about `delay` seconds from now."""

    def __init__(self, executor: Executor, name: str = "nodesim-timers") -> None:
        self._executor = executor
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()  # ties in due time keep their order, fns are not compared
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> Timers:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), fn))
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                self._executor.submit(fn)
            except RuntimeError:  # the executor shut down: the simulator is stopping
                return
