"""The Lease election and its fence (kube/lease.py) on a fake clock and an in-memory Lease:
who leads when, that a standby counts the lease duration from what it saw, and that a leader
whose renewals stopped (or that was frozen) is refused its next write before anyone else can
hold the Lease."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdd_operator.kube.client import KubeApi
from pdd_operator.kube.lease import (
    WRITE_ALLOWANCE_S,
    LeaderElector,
    LeadershipLost,
    LeaseConflict,
    LeaseRecord,
    LeaseTimings,
)

TIMINGS = LeaseTimings()
D, R, P = TIMINGS.duration_s, TIMINGS.renew_deadline_s, TIMINGS.retry_period_s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class MemoryLease:
    """The Lease as the API server keeps it: a resourceVersion per write, 409 on a stale one.
    `write_takes` seconds pass on the clock during each write (a slow API server)."""

    clock: Clock
    lease: dict[str, Any] | None = None
    version: int = 0
    fail: Exception | None = None
    write_takes: float = 0.0
    writes: list[tuple[float, str]] = field(default_factory=list)  # (when stored, holder)
    where: str = "pdd-system/pdd-operator-leader"

    def read(self) -> LeaseRecord | None:
        if self.fail:
            raise self.fail
        return LeaseRecord.of(self.lease) if self.lease is not None else None

    def create(self, spec: dict[str, Any]) -> LeaseRecord:
        if self.lease is not None:
            raise LeaseConflict("exists")
        return self._store(spec)

    def replace(self, current: LeaseRecord, spec: dict[str, Any]) -> LeaseRecord:
        if self.fail:
            raise self.fail
        if self.lease is None or current.resource_version != str(self.version):
            raise LeaseConflict("conflict")
        return self._store(spec)

    def _store(self, spec: dict[str, Any]) -> LeaseRecord:
        self.clock.advance(self.write_takes)
        self.version += 1
        self.lease = {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(spec)}
        self.writes.append((self.clock.now, spec["holderIdentity"]))
        return LeaseRecord.of(self.lease)

    @property
    def holder(self) -> str:
        return str(((self.lease or {}).get("spec") or {}).get("holderIdentity") or "")


@dataclass
class Candidate:
    elector: LeaderElector
    lost: list[str]


def candidate(store: MemoryLease, name: str, clock: Clock) -> Candidate:
    lost: list[str] = []
    elector = LeaderElector(store, name, lost.append, TIMINGS, clock=clock)
    return Candidate(elector, lost)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryLease:
    return MemoryLease(clock)


def test_the_first_candidate_creates_the_lease_and_leads(clock: Clock, store: MemoryLease) -> None:
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    assert a.elector.try_acquire_or_renew()
    assert store.holder == "a" and a.elector.holds()
    assert not b.elector.try_acquire_or_renew()
    assert not b.elector.holds()
    with pytest.raises(LeadershipLost):
        b.elector.fence()  # a standby writes nothing


def test_a_standby_takes_over_a_lease_duration_after_the_last_renewal_it_saw(
    clock: Clock, store: MemoryLease
) -> None:
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    a.elector.try_acquire_or_renew()
    for _ in range(5):  # renewals seen by the standby push its takeover back
        clock.advance(P)
        assert a.elector.try_acquire_or_renew()
        assert not b.elector.try_acquire_or_renew()
    seen = clock.now
    # a dies here: no renewal after `seen`
    clock.advance(D - 0.01)
    assert not b.elector.try_acquire_or_renew()
    clock.advance(0.01)
    assert b.elector.try_acquire_or_renew()
    assert store.holder == "b"
    assert clock.now - seen == pytest.approx(D)
    assert LeaseRecord.of(store.lease or {}).transitions == 1


def test_a_standby_counts_from_when_it_first_saw_the_lease_not_from_its_renew_time(
    clock: Clock, store: MemoryLease
) -> None:
    """Another node's wall clock is never read: a Lease renewed "long ago" by its renewTime
    is still given a whole lease duration from the moment this standby first read it."""
    a = candidate(store, "a", clock)
    a.elector.try_acquire_or_renew()
    clock.advance(3600)
    b = candidate(store, "b", clock)
    assert not b.elector.try_acquire_or_renew()
    clock.advance(D - 0.5)
    assert not b.elector.try_acquire_or_renew()
    clock.advance(0.5)
    assert b.elector.try_acquire_or_renew()


def test_a_released_lease_is_taken_at_once(clock: Clock, store: MemoryLease) -> None:
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    a.elector.try_acquire_or_renew()
    assert not b.elector.try_acquire_or_renew()
    a.elector.release()
    assert store.holder == ""
    with pytest.raises(LeadershipLost):
        a.elector.fence()  # after release (the operator stopped), no write
    assert b.elector.try_acquire_or_renew()
    assert store.holder == "b"


def test_two_standbys_racing_for_an_expired_lease_one_wins(
    clock: Clock, store: MemoryLease
) -> None:
    a, b, c = (candidate(store, n, clock) for n in "abc")
    a.elector.try_acquire_or_renew()
    assert not b.elector.try_acquire_or_renew()
    assert not c.elector.try_acquire_or_renew()
    clock.advance(D)
    assert b.elector.try_acquire_or_renew()
    # c read the same version as b, and b wrote since: c's write of that version is refused.
    assert not c.elector.try_acquire_or_renew()
    assert store.holder == "b"


@pytest.mark.parametrize("stalled_for", [R - 0.01, R, D, 3600.0])
def test_the_fence_holds_for_the_renew_deadline_after_the_last_renewal_was_sent(
    clock: Clock, store: MemoryLease, stalled_for: float
) -> None:
    """Counted from before the renewal was sent: a slow write (0.4 s here) counts against
    the leader, never for it. A leader frozen for longer than R (SIGSTOP, a paused VM) is
    refused at its first write after resuming: its clock ran on while it was stopped."""
    store.write_takes = 0.4
    a = candidate(store, "a", clock)
    sent = clock.now
    a.elector.try_acquire_or_renew()
    clock.now = sent + stalled_for
    if stalled_for < R:
        a.elector.fence()
        assert a.lost == []
    else:
        with pytest.raises(LeadershipLost):
            a.elector.fence()
        assert len(a.lost) == 1 and "renewed" in a.lost[0]


def test_a_leader_that_finds_another_holder_stops_at_once(clock: Clock, store: MemoryLease) -> None:
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    a.elector.try_acquire_or_renew()
    b.elector.try_acquire_or_renew()
    clock.advance(D)  # a was frozen: b saw no renewal for D and took over
    assert b.elector.try_acquire_or_renew()
    with pytest.raises(LeadershipLost):
        a.elector.try_acquire_or_renew()  # a's renewal: 409, then the Lease names b
    assert a.lost and "held by 'b'" in a.lost[0]
    assert not a.elector.holds()
    assert store.holder == "b"


def test_a_leader_whose_renewal_answer_was_lost_keeps_leading(
    clock: Clock, store: MemoryLease
) -> None:
    """Its write went through but the answer never came: the next renewal's version is stale
    (409), and the Lease read then still names it."""
    a = candidate(store, "a", clock)
    a.elector.try_acquire_or_renew()
    store._store({**(store.lease or {})["spec"], "renewTime": "later"})  # the lost answer's
    clock.advance(P)
    assert a.elector.try_acquire_or_renew()
    assert a.lost == [] and a.elector.holds()


def test_the_renewer_stops_the_leader_once_the_renew_deadline_passes(
    clock: Clock, store: MemoryLease
) -> None:
    """The API server stops answering: the renewer keeps trying every retry period and, at
    the renew deadline, calls on_lost (the operator exits)."""
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        clock.advance(seconds)
        return len(waits) > 100

    lost: list[str] = []
    a = LeaderElector(store, "a", lost.append, TIMINGS, clock=clock, wait=wait)
    a.try_acquire_or_renew()
    start = clock.now
    store.fail = ConnectionError("connection refused")
    a.renew_until_lost()
    assert lost and "renewed" in lost[0]
    assert R <= clock.now - start <= R + P
    assert all(w <= P for w in waits)


def test_a_standby_waits_until_the_lease_expires_not_a_whole_period_more(
    clock: Clock, store: MemoryLease
) -> None:
    a = candidate(store, "a", clock)
    a.elector.try_acquire_or_renew()
    last_renewal = clock.now

    def wait(seconds: float) -> bool:
        clock.advance(seconds)
        return False

    b = LeaderElector(store, "b", lambda _: None, TIMINGS, clock=clock, wait=wait)
    assert b.acquire()
    # It first read the Lease right after a's write: it took over D later, to the instant.
    assert clock.now - last_renewal == pytest.approx(D)


def test_a_standby_keeps_trying_through_errors(clock: Clock, store: MemoryLease) -> None:
    store.fail = PermissionError("forbidden")
    calls = 0

    def wait(seconds: float) -> bool:
        nonlocal calls
        calls += 1
        clock.advance(seconds)
        if calls == 3:
            store.fail = None
        return calls > 10

    b = LeaderElector(store, "b", lambda _: None, TIMINGS, clock=clock, wait=wait)
    assert b.acquire()
    assert calls == 3 and store.holder == "b"


@pytest.mark.parametrize("seed", range(20))
def test_no_write_of_the_old_leader_can_land_once_another_holds_the_lease(seed: int) -> None:
    """The timing argument of kube/lease.py, played out: a leader renews (each request taking
    a random time, some failing) until it dies or freezes at a random moment; a standby polls
    at random offsets. The last moment the old leader's fence lets a write through, plus the
    time one write may take, is before the standby holds the Lease."""
    rng = random.Random(seed)
    clock = Clock()
    store = MemoryLease(clock)
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    a.elector.try_acquire_or_renew()
    clock.advance(rng.uniform(0, P))
    b.elector.try_acquire_or_renew()
    steps = rng.randrange(3, 30)
    events = []  # (time, who)
    for i in range(steps):
        events.append((clock.now + i * P + rng.uniform(0, 0.3), "a"))
        events.append((clock.now + i * P + rng.uniform(0, P), "b"))
    last_allowed = -1.0
    for when, who in sorted(events):
        clock.now = max(clock.now, when)
        store.write_takes = rng.uniform(0, 0.5)
        if who == "a":
            store.fail = ConnectionError() if rng.random() < 0.2 else None
            with contextlib.suppress(ConnectionError):
                a.elector.try_acquire_or_renew()
            store.fail = None
        else:
            b.elector.try_acquire_or_renew()
    # a stops here (dies, or is frozen): find the last instant its fence still passes.
    t = clock.now
    while a.elector.holds():
        last_allowed = clock.now
        clock.advance(0.01)
    clock.now = t
    while not b.elector.try_acquire_or_renew():
        clock.advance(rng.uniform(0.05, P))
    taken = clock.now - store.write_takes  # the takeover was stored before its answer
    assert store.holder == "b"
    assert last_allowed + WRITE_ALLOWANCE_S < taken


@pytest.mark.parametrize(
    ("duration", "deadline", "retry", "ok"),
    [
        (10, 5, 1, True),
        (15, 10, 2, True),
        (6, 5, 1, False),  # no time left for a write after its check
        (10, 1.5, 1, False),  # one renewal only before giving up
        (10, 5, 0, False),
    ],
)
def test_lease_timings_must_leave_room_for_a_write(
    duration: float, deadline: float, retry: float, ok: bool
) -> None:
    if ok:
        LeaseTimings(duration, deadline, retry)
    else:
        with pytest.raises(ValueError):
            LeaseTimings(duration, deadline, retry)


def test_a_leader_resumed_after_a_freeze_stops_without_another_renewal(
    clock: Clock, store: MemoryLease
) -> None:
    lost: list[str] = []
    a = LeaderElector(store, "a", lost.append, TIMINGS, clock=clock, wait=lambda _: False)
    a.try_acquire_or_renew()
    clock.advance(R + 0.1)  # SIGSTOP ... SIGCONT: nobody has taken the Lease yet
    a.renew_until_lost()
    assert lost and store.writes == [(store.writes[0][0], "a")]  # the acquisition only


# ------------------------------------------------------------- the fence in the API client


@dataclass
class Response:
    status: int = 200
    data: bytes = b"{}"
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def read(self) -> bytes:
        return self.data


@dataclass
class RecordingClient:
    sent: list[str] = field(default_factory=list)

    def param_serialize(self, method: str, path: str, **_: Any) -> tuple[Any, ...]:
        return (method, path)

    def call_api(self, method: str, path: str, **_: Any) -> Response:
        self.sent.append(method)
        return Response()


def test_every_write_of_the_api_client_passes_the_fence_first_and_reads_do_not() -> None:
    allowed = True
    checks: list[str] = []

    def fence() -> None:
        checks.append("check")
        if not allowed:
            raise LeadershipLost("lost")

    api = RecordingClient()
    kube = KubeApi(api, fence=fence)  # type: ignore[arg-type]
    pdd = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x"}}
    pdd["metadata"]["namespace"] = "team-a"
    kube.apply(pdd)
    kube.patch_status("team-a", "x", {"observedGeneration": 1})
    assert kube.read_pvc("team-a", "claim") == {}
    assert api.sent == ["PATCH", "PATCH", "GET"]
    assert checks == ["check", "check"]
    allowed = False
    with pytest.raises(LeadershipLost):
        kube.annotate_pod("team-a", "p", {"a": "b"})
    with pytest.raises(LeadershipLost):
        kube.create_if_absent({"apiVersion": "v1", "kind": "Secret", "metadata": pdd["metadata"]})
    assert api.sent == ["PATCH", "PATCH", "GET"]  # nothing more was sent
