"""When a deployment's passes run: the one place that schedules them.

Triggers for one deployment coalesce (while a pass runs, later triggers collapse into one more
pass; bursts of child and pod events wait until they go quiet), at most `max_concurrent` passes
run at once, a timed pass is kept per deployment (the sooner of two asks wins), back-offs count
per deployment and reason, and a deployment that is gone is forgotten with its timed pass. What
a pass does is the caller's (`run_pass`); this module knows nothing of PDDeployments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass
class _KeyState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False
    due: bool = False  # a delayed pass is already waiting to start
    last_ask: float = 0.0  # when the latest delayed trigger came (the event loop's clock)
    asks: int = 0  # delayed triggers so far
    read: int = 0  # of those, how many came before the latest pass began to read
    # Versions of the object that came while a pass ran: the status that pass was writing,
    # or someone else's change; told apart once the pass knows what it wrote.
    unconfirmed: set[str] = field(default_factory=set)
    # Passes in a row that met the same lasting trouble, per reason (back_off).
    in_a_row: dict[str, int] = field(default_factory=dict)


class PassQueue(Generic[Key]):
    """Schedules `run_pass(key)`. `is_echo(key, version)` says whether a version of the
    object is a pass's own status write, `exists(key)` whether the object is still there after
    a pass; `gone(key)` is told when it is not."""

    def __init__(
        self,
        run_pass: Callable[[Key], Awaitable[None]],
        is_echo: Callable[[Key, str], bool],
        exists: Callable[[Key], bool],
        gone: Callable[[Key], None],
        max_concurrent: int = 64,
        coalesce_max_s: float = 0.0,
    ) -> None:
        self._run_pass, self._is_echo, self._exists, self._gone = run_pass, is_echo, exists, gone
        self._states: dict[Key, _KeyState] = {}
        # Bounds the passes in flight: each holds rendered children and API calls; beyond the
        # API pool more only queue.
        self._slots = asyncio.Semaphore(max_concurrent)
        # The longest a delayed pass waits for its burst to end (0: the delay after its first
        # trigger, however many follow).
        self.coalesce_max_s = coalesce_max_s
        # One timed pass per key at most: when it is due, and its task.
        self._timed: dict[Key, tuple[float, asyncio.Task[None]]] = {}

    def keys(self) -> set[Key]:
        """The keys the queue holds anything for (a metric's count)."""
        return set(self._states).union(self._timed)

    def needs_pass(self, key: Key, version: str) -> bool:
        """Whether this version of the object (its watch event) needs a pass: not the echo of
        a pass's own status write. A version that comes while a pass runs waits for that pass
        to say what it wrote."""
        if self._is_echo(key, version):
            return False
        state = self._states.get(key)
        if state is not None and state.lock.locked() and version:
            state.unconfirmed.add(version)
            return False
        return True

    async def request(self, key: Key, delay: float = 0.0) -> None:
        """A pass for `key`. With a `delay` (events that come in bursts) it waits until no
        request came for `delay` seconds, or `coalesce_max_s` after the first, and every
        request for the key meanwhile is answered by that one pass: it reads the indexes when
        it runs."""
        state = self._states.setdefault(key, _KeyState())
        if delay > 0:
            state.last_ask = asyncio.get_running_loop().time()
            state.asks += 1
            if state.due:
                return
            state.due = True
            try:
                await self._until_quiet(state, delay)
            finally:
                state.due = False
            if state.read == state.asks:
                return  # a pass began after the last of them: it read what they announced
        if state.lock.locked():
            state.dirty = True
            return
        async with state.lock:
            state.dirty = True
            while state.dirty:
                async with self._slots:
                    # Cleared once a pass slot is ours, not before: requests that come while
                    # this key waits for one are answered by the pass about to read.
                    state.dirty, before, state.read = False, state.read, state.asks
                    try:
                        await self._run_pass(key)
                    except BaseException:
                        state.read = before  # it answered nothing: the asks it took run
                        raise
                state.dirty |= self._changed_by_others(key, state)
        if not self._exists(key):
            self._gone(key)  # the caller forgets what it holds, and calls forget()

    def later(self, key: Key, delay: float, request: Callable[[], Awaitable[None]]) -> None:
        """`request()` `delay` seconds from now, whatever passes run before it: one in between
        may still find the wait going on and asks again. The sooner of two asks wins."""
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._timed.get(key)
        if pending is not None and not pending[1].done():
            if pending[0] <= due:
                return
            pending[1].cancel()  # still asleep: a due one leaves the table before its pass

        async def when_due() -> None:
            await asyncio.sleep(delay)
            self._timed.pop(key, None)
            await request()

        self._timed[key] = (due, asyncio.create_task(when_due()))

    def back_off(self, key: Key, reason: str, lasting: bool, first: float, most: float) -> float:
        """The delay before the next look at a trouble that lasts (`first`, doubling per pass
        in a row that met it, at most `most`); once it is over (`lasting` false) the count
        starts again, and 0."""
        state = self._states.setdefault(key, _KeyState())
        if not lasting:
            state.in_a_row.pop(reason, None)
            return 0.0
        in_a_row = state.in_a_row.get(reason, 0)
        state.in_a_row[reason] = in_a_row + 1
        return float(min(first * 2**in_a_row, most))

    def forget(self, key: Key) -> None:
        """The object is gone: its state and its timed pass."""
        self._states.pop(key, None)
        if (timed := self._timed.pop(key, None)) is not None:
            timed[1].cancel()

    def _changed_by_others(self, key: Key, state: _KeyState) -> bool:
        """Whether a version that came during the pass is not the status the pass wrote."""
        versions, state.unconfirmed = state.unconfirmed, set()
        return not all(self._is_echo(key, v) for v in versions)

    async def _until_quiet(self, state: _KeyState, quiet: float) -> None:
        """Until no request came for `quiet` seconds, or `coalesce_max_s` after the first: a
        steady stream of requests still gets a pass that often."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(quiet, self.coalesce_max_s)
        while True:  # each request meanwhile moves the end on: sleep to the latest end
            wait = min(state.last_ask + quiet, deadline) - loop.time()
            if wait <= 0:
                return
            await asyncio.sleep(wait)
