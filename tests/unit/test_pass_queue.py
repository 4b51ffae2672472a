"""pass_queue: the one place a deployment's passes are scheduled (coalescing, the pass slots,
timed passes, back-offs, forgetting). Driven by events the tests hold, not by timing, except
where a delay is the point, and there only its order is checked."""

from __future__ import annotations

import asyncio

from pdd_operator.pass_queue import PassQueue


class Passes:
    """A run_pass that records its keys and, while `hold` is clear, waits for the test."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.started = asyncio.Event()
        self.echoes: set[str] = set()
        self.existing = {"a", "b"}
        self.gone: list[str] = []

    async def run(self, key: str) -> None:
        self.ran.append(key)
        self.started.set()
        await self.hold.wait()

    def queue(self, **kwargs: float) -> PassQueue[str]:
        return PassQueue(
            self.run,
            lambda key, version: version in self.echoes,
            lambda key: key in self.existing,
            self.gone.append,
            **kwargs,  # type: ignore[arg-type]
        )


async def test_requests_during_a_pass_collapse_into_one_more_pass() -> None:
    passes = Passes()
    queue = passes.queue()
    passes.hold.clear()
    first = asyncio.create_task(queue.request("a"))
    await passes.started.wait()
    for _ in range(5):
        await queue.request("a")  # answered by marking the running pass dirty
    passes.hold.set()
    await first
    assert passes.ran == ["a", "a"]


async def test_a_burst_of_delayed_requests_gets_one_pass() -> None:
    passes = Passes()
    queue = passes.queue()
    await asyncio.gather(*(queue.request("a", delay=0.05) for _ in range(10)))
    assert passes.ran == ["a"]


async def test_pass_slots_bound_the_passes_in_flight() -> None:
    passes = Passes()
    queue = passes.queue(max_concurrent=1)
    passes.hold.clear()
    first = asyncio.create_task(queue.request("a"))
    await passes.started.wait()
    second = asyncio.create_task(queue.request("b"))
    await asyncio.sleep(0)
    assert passes.ran == ["a"]  # b waits for the slot
    passes.hold.set()
    await asyncio.gather(first, second)
    assert passes.ran == ["a", "b"]


async def test_a_status_echo_needs_no_pass_and_a_change_during_a_pass_gets_one() -> None:
    passes = Passes()
    queue = passes.queue()
    passes.echoes.add("7")
    assert not queue.needs_pass("a", "7")
    assert queue.needs_pass("a", "8")
    passes.hold.clear()
    running = asyncio.create_task(queue.request("a"))
    await passes.started.wait()
    assert not queue.needs_pass("a", "7")
    assert not queue.needs_pass("a", "9")  # held until the pass says what it wrote
    passes.hold.set()
    await running
    assert passes.ran == ["a", "a"]  # 9 was not its own write: one more pass


async def test_the_sooner_of_two_timed_passes_wins_and_forget_cancels_it() -> None:
    passes = Passes()
    queue = passes.queue()
    asked: list[str] = []

    async def request() -> None:
        asked.append("a")

    queue.later("a", 60.0, request)
    queue.later("a", 0.01, request)  # sooner: replaces the first
    queue.later("a", 30.0, request)  # later than the pending one: ignored
    await asyncio.sleep(0.1)
    assert asked == ["a"]
    assert queue.keys() == set()

    queue.later("b", 0.05, request)
    queue.forget("b")
    await asyncio.sleep(0.1)
    assert asked == ["a"]


def test_back_off_doubles_per_pass_in_a_row_up_to_the_most_and_starts_again() -> None:
    queue = Passes().queue()
    delays = [queue.back_off("a", "conflict", True, 1.0, 5.0) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert queue.back_off("a", "transient", True, 0.5, 8.0) == 0.5  # its own count
    assert queue.back_off("a", "conflict", False, 1.0, 5.0) == 0.0
    assert queue.back_off("a", "conflict", True, 1.0, 5.0) == 1.0


async def test_a_deployment_gone_after_its_pass_is_reported_and_forgotten() -> None:
    passes = Passes()
    queue = passes.queue()
    passes.existing.discard("a")
    await queue.request("a")
    assert passes.gone == ["a"]
    await queue.request("b")
    assert passes.gone == ["a"]
