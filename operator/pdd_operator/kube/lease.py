"""Leader election on a `coordination.k8s.io/v1` Lease, and the fence that keeps a replica
that lost the Lease from writing.

Replicas compete for one Lease: the one whose identity it names leads (runs kopf and
reconciles) and renews it every retry period; the others read it every retry period as
standbys and take it over when no renewal was seen for the lease duration. Every write is
optimistic (the resourceVersion read is the precondition), so of two standbys racing for an
expired Lease one wins. The leader's writes are fenced: `LeaderElector.fence` runs before each
of them (kube/client.py) and stops the process once the last renewal is older than the renew
deadline, by the local monotonic clock.

Not kopf's peering: its peers announce themselves in a KopfPeering object and pause when they
see a peer of higher priority, with a 60 s lifetime; replicas of one Deployment share a
priority, and at equal priority all of them pause. Nothing fences a peer that was frozen: on
resume it writes until its own watch tells it about the others. Not the client library's
`kubernetes.leaderelection` either: it measures with the wall clock, talks through the
library's global configuration, and has no fence.

The timing the fence rests on. Let t be the moment, on the leader's monotonic clock, just
before it sent the last renewal that succeeded. A standby counts the lease duration D from
the moment it *received* a Lease showing that renewal: after the API server stored it, so
after t. It cannot take the Lease over before t + D. The leader checks before every write
that its clock says less than t + R (R, the renew deadline, < D); a write that passes the
check reaches the API server by t + R + W, W being the time from the check to the API server
storing the write (milliseconds: the request is built before the check, and the operator's
client sends a write once per check: kube/client.py). So with D > R + W no write of the old
leader lands after a new one holds the Lease: D = 10 s and R = 5 s leave W 5 s. A process
that was frozen (SIGSTOP, a paused VM, a long stop-the-world) checks on resume: its monotonic
clock ran on meanwhile, so the check fails at once and it stops before its first write. Only
the rates of the two nodes' clocks enter (they differ by parts per million), never their
readings. What no check in the client can close: a freeze between the check and the send (a
few bytecodes), and a write the API server takes longer than W to store; refusing those would
take a fencing token on the server's side, which Kubernetes does not have.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from pdd_operator.kube.client import KubeApi, api_error_message
from pdd_operator.kube.resources import LEASE

log = logging.getLogger(__name__)

# A standby takes over within D + one retry period of the leader's last renewal, and then
# needs kopf's start-up: about 12 s after a node vanished (tests/integration/
# test_leader_election.py measures it). kube-controller-manager's 15/10/2 s would make that
# ~18 s.
LEASE_DURATION_S = 10.0
RENEW_DEADLINE_S = 5.0
RETRY_PERIOD_S = 1.0
# What D - R must leave at least for W (above), whatever the timings are set to.
WRITE_ALLOWANCE_S = 2.0


class LeadershipLost(RuntimeError):
    """This process does not hold the Lease (any more): it must not write."""


class LeaseConflict(Exception):
    """Someone else created or wrote the Lease first (409)."""


@dataclass(frozen=True)
class LeaseTimings:
    duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if self.retry_period_s <= 0:
            raise ValueError("the retry period must be above 0")
        if self.renew_deadline_s < 2 * self.retry_period_s:
            raise ValueError("the renew deadline must leave room for two renewals")
        if self.duration_s < self.renew_deadline_s + WRITE_ALLOWANCE_S:
            raise ValueError(
                f"the lease duration must exceed the renew deadline by {WRITE_ALLOWANCE_S:g}s "
                "(the time one write may take after its fence check)"
            )

    @property
    def request_timeout_s(self) -> float:
        """A Lease request that hangs is given up in time for another within the deadline."""
        return self.renew_deadline_s / 2


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease as read or written: who holds it, for how long, and the whole object (what a
    replace starts from, resourceVersion included)."""

    holder: str
    duration_s: float
    transitions: int
    resource_version: str
    body: Mapping[str, Any]

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=float(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
            body=lease,
        )


class LeaseStore(Protocol):
    """Where the Lease lives: the API server (KubeLeaseStore), or a dict in unit tests."""

    where: str

    def read(self) -> LeaseRecord | None: ...

    def create(self, spec: dict[str, Any]) -> LeaseRecord:
        """Raises LeaseConflict when it exists."""
        ...

    def replace(self, current: LeaseRecord, spec: dict[str, Any]) -> LeaseRecord:
        """Raises LeaseConflict when it changed since `current` was read."""
        ...


class KubeLeaseStore:
    """The Lease `namespace/name` on the API server, through a KubeApi of its own: renewals
    must not queue behind the reconciler's requests for a connection."""

    def __init__(self, kube: KubeApi, namespace: str, name: str, timeout_s: float) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s
        self.where = f"{namespace}/{name}"

    def read(self) -> LeaseRecord | None:
        lease = self.kube.read_lease(self.namespace, self.name, self.timeout_s)
        return LeaseRecord.of(lease) if lease is not None else None

    def create(self, spec: dict[str, Any]) -> LeaseRecord:
        lease = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        return LeaseRecord.of(
            self._conflicts(lambda: self.kube.create_lease(lease, self.timeout_s))
        )

    def replace(self, current: LeaseRecord, spec: dict[str, Any]) -> LeaseRecord:
        lease = {**current.body, "spec": spec}
        return LeaseRecord.of(
            self._conflicts(lambda: self.kube.replace_lease(lease, self.timeout_s))
        )

    @staticmethod
    def _conflicts(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call()
        except ApiException as err:
            if err.status == 409:
                raise LeaseConflict(api_error_message(err)) from None
            raise


def micro_time() -> str:
    """Now as a Lease's MicroTime. For people and other tools only: the election itself
    never compares one node's wall clock with another's."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's side of the election. `acquire` waits as a standby; `start_renewing`
    keeps the Lease in a thread of its own; `fence` is what every write calls first;
    `release` gives the Lease up after the operator stopped.

    `on_lost(reason)` is called once leadership is gone and must stop every write of the
    process: the operator exits (leadership.py), so that the Deployment starts it again as a
    standby. `clock` is monotonic; `wait(seconds)` sleeps and answers whether to stop."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        on_lost: Callable[[str], None],
        timings: LeaseTimings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        wall_clock: Callable[[], str] = micro_time,
    ) -> None:
        self.store = store
        self.identity = identity
        self.timings = timings or LeaseTimings()
        self._on_lost = on_lost
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._wall_clock = wall_clock
        self._lock = threading.Lock()  # one attempt at a time (the renewer and release)
        self._record: LeaseRecord | None = None  # the last Lease read or written
        self._observed_at = -math.inf  # when that version was first seen (a standby's clock)
        self._renewed_at: float | None = None  # before the last write that made it ours
        self._lost = ""  # why leadership ended; "" while it has not
        self._renewer: threading.Thread | None = None
        self._last_failure = ""
        self._waiting_for = ""
        self.last_attempt_at = -math.inf  # the standby's health: its loop is still trying

    # -------------------------------------------------------------------------- the fence

    def holds(self) -> bool:
        """Whether this process may write now: its last renewal is younger than the renew
        deadline, by this process's clock, and nothing said the Lease is someone else's."""
        renewed = self._renewed_at
        return (
            not self._lost
            and renewed is not None
            and self._clock() - renewed < self.timings.renew_deadline_s
        )

    def fence(self) -> None:
        """Before every write: raises LeadershipLost (after `on_lost`) unless this process
        holds the Lease."""
        if self.holds():
            return
        renewed = self._renewed_at
        age = "never renewed" if renewed is None else f"renewed {self._clock() - renewed:.1f}s ago"
        self._lose(self._lost or f"the Lease {self.store.where} was {age}")

    # ------------------------------------------------------------------------ one attempt

    def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease: True when this process holds it after."""
        with self._lock:
            sent = self._clock()
            self.last_attempt_at = sent
            if self._renewed_at is not None and self._record is not None and not self._lost:
                try:  # the leader writes over its own last write: one request per renewal
                    self._wrote(sent, self.store.replace(self._record, self._renewal()))
                    return True
                except LeaseConflict:
                    pass  # written since: read it and see whose it is
            current = self.store.read()
            seen = self._clock()
            if current is None:
                try:
                    self._wrote(sent, self.store.create(self._taken(None)))
                except LeaseConflict:
                    return False
                return True
            if self._record is None or current.resource_version != self._record.resource_version:
                self._record, self._observed_at = current, seen
            if current.holder != self.identity:
                if self._renewed_at is not None:
                    self._lose(f"the Lease {self.store.where} is held by {current.holder!r} now")
                expires = self._observed_at + (current.duration_s or self.timings.duration_s)
                if current.holder and seen < expires:
                    self._note_standby(current.holder)
                    return False
            spec = self._renewal() if current.holder == self.identity else self._taken(current)
            try:
                self._wrote(sent, self.store.replace(current, spec))
            except LeaseConflict:
                return False
            return True

    def _wrote(self, sent: float, record: LeaseRecord) -> None:
        if self._renewed_at is None:
            log.info(
                "leading: this replica (%s) holds the Lease %s", self.identity, self.store.where
            )
        self._record, self._observed_at, self._renewed_at = record, self._clock(), sent
        self._last_failure = ""

    def _taken(self, current: LeaseRecord | None) -> dict[str, Any]:
        now = self._wall_clock()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.timings.duration_s),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": current.transitions + 1 if current is not None else 0,
        }

    def _renewal(self) -> dict[str, Any]:
        assert self._record is not None
        spec = dict(self._record.body.get("spec") or {})
        spec["renewTime"] = self._wall_clock()
        spec["leaseDurationSeconds"] = math.ceil(self.timings.duration_s)
        return spec

    def _lose(self, reason: str) -> None:
        self._lost = reason
        self._on_lost(reason)
        raise LeadershipLost(reason)

    # ------------------------------------------------------------------------------ loops

    def acquire(self) -> bool:
        """Wait as a standby until this process holds the Lease (True), or until stopped."""
        while True:
            try:
                if self.try_acquire_or_renew():
                    return True
            except LeadershipLost:
                raise
            except Exception as err:  # the API server unreachable, RBAC: said, and retried
                self._note_failure(err)
            if self._wait(self._next_attempt_in()):
                return False

    def _next_attempt_in(self) -> float:
        """A retry period, or less when the holder's Lease expires sooner: a standby takes
        over at the moment it may."""
        record, retry = self._record, self.timings.retry_period_s
        if record is None or not record.holder or record.holder == self.identity:
            return retry
        expires = self._observed_at + (record.duration_s or self.timings.duration_s)
        return max(0.0, min(retry, expires - self._clock()))

    def renew_until_lost(self) -> None:
        """The leader's loop: renew every retry period until the renew deadline passes
        without a renewal, or the Lease is someone else's; then `on_lost`."""
        while True:
            started = self._clock()
            try:
                # Past the deadline (no renewal went through, or this process was frozen):
                # the process stops; a renewal now would not make its writes safe again.
                self.fence()
                self.try_acquire_or_renew()
                self.fence()
            except LeadershipLost:
                return
            except Exception as err:  # the fence's clock decides, not one failed request
                self._note_failure(err)
            if self._wait(max(0.0, started + self.timings.retry_period_s - self._clock())):
                return

    def stop(self) -> None:
        """End a standby's wait: `acquire` returns False at once (the pod is being deleted)."""
        self._stop.set()

    def start_renewing(self) -> None:
        self._renewer = threading.Thread(
            target=self.renew_until_lost, name="pdd-lease-renewer", daemon=True
        )
        self._renewer.start()

    def release(self) -> None:
        """Give the Lease up once the operator stopped writing, so that a standby takes over
        at once rather than after the lease duration. Writes are refused from here on."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.timings.request_timeout_s * 2)
        with self._lock:
            record, held = self._record, self.holds()
            self._lost = self._lost or "released"
            if not held or record is None:
                return
            spec = dict(record.body.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=self._wall_clock())
            try:
                self.store.replace(record, spec)
                log.info("released the Lease %s", self.store.where)
            except Exception as err:  # a standby then takes over when it expires
                log.warning("could not release the Lease %s: %s", self.store.where, err)

    def _note_standby(self, holder: str) -> None:
        if holder != self._waiting_for:
            self._waiting_for = holder
            log.info(
                "standby: the Lease %s is held by %s; taking over if it is not renewed for %gs",
                self.store.where,
                holder,
                self.timings.duration_s,
            )

    def _note_failure(self, err: Exception) -> None:
        """Said once per distinct failure, not once a second."""
        message = api_error_message(err)
        if message != self._last_failure:
            self._last_failure = message
            log.warning("the Lease %s could not be read or written: %s", self.store.where, message)
