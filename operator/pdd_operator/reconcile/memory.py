"""What the operator remembers between passes: one record per deployment, created on its
first pass and dropped when it is gone, and the fleet-wide reservation ledger (the domains
each deployment placed or grew into, which the others' placements leave alone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdd_operator.api.names import DeploymentKey
from pdd_operator.planning.reservations import ReservationLedger
from pdd_operator.planning.slices import Slice
from pdd_operator.status.corrections import Correction
from pdd_operator.status.observe import ChildKey
from pdd_operator.status.own_writes import OwnWrite

if TYPE_CHECKING:
    from pdd_operator.reconcile.children import Rendered
    from pdd_operator.reconcile.token import TokenCheck


@dataclass
class DeploymentRecord:
    """One deployment's memory: its last render (the children's fingerprints and what they
    were rendered from), what is known of its token Secret, the slices it grew into beyond
    its home domain (status.slices says the same once written; this holds between the pass
    that opens one and that write), how often its model was found missing in a row, the
    last drift correction of each child (status.corrections), and its last status write
    (status.own_writes: its watch echo asks no pass)."""

    rendered: Rendered | None = None
    token: TokenCheck | None = None
    slices: tuple[Slice, ...] | None = None
    model_attempts: int = 0
    corrections: dict[ChildKey, Correction] = field(default_factory=dict)
    status_write: OwnWrite | None = None


class Memory:
    def __init__(self) -> None:
        self._records: dict[DeploymentKey, DeploymentRecord] = {}
        self.reservations = ReservationLedger()

    def record(self, key: DeploymentKey) -> DeploymentRecord:
        """The deployment's record; a new one on its first pass in this process."""
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = DeploymentRecord()
        return record

    def find(self, key: DeploymentKey) -> DeploymentRecord | None:
        """The deployment's record where it has one (a watch event's check makes none)."""
        return self._records.get(key)

    def forget(self, key: DeploymentKey) -> None:
        """The deployment is gone: its record, and its GPUs are nobody's reservation."""
        self._records.pop(key, None)
        self.reservations.release(key)

    def keys(self) -> set[DeploymentKey]:
        """The deployments with a record. Called from the metrics server's thread: set()
        copies the keys in C, under the GIL, so a pass adding one meanwhile cannot break it."""
        return set(self._records)
