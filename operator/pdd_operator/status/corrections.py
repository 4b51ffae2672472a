"""Drift corrections: children applied again because someone changed a field the operator owns.

The operator's index holds a digest of each child's live owned fields (status.drift); a child
whose digest is not the render's has drifted and is applied again. Each correction is recorded
in the deployment's record (reconcile.memory) so that neither a copy the index still holds
from before it, nor the server's own spelling of what it applied, counts as drift a second
time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pdd_operator.status.observe import ChildKey, ChildSummary


@dataclass(frozen=True)
class Correction:
    """A child this operator applied again because its owned fields had drifted.

    resourceVersions are opaque (only equality means anything, see status.own_writes): the
    drifted copy the pass read is known to predate the correction, so an index still holding
    it is not corrected again; any other version is the correction, a later change or one
    never seen, and is judged by its digest."""

    wanted: str  # the render's owned-fields digest it was put back to
    result: str  # the digest of the object that apply returned
    version: str  # that object's resourceVersion
    read: str  # the resourceVersion of the drifted copy the pass read


def drifted(seen: ChildSummary, wanted: str, correction: Correction | None) -> bool:
    """Whether someone else changed a field the operator owns in this child.

    The index holds a digest of the live owned fields, not the object, so the check costs no
    memory per child beyond that digest, and no API call. An empty digest (the operator's
    field manager owns nothing there, e.g. a child left by another manager) counts as drift:
    one apply takes the fields over."""
    if seen.owned_fingerprint == wanted:
        return False
    if correction is not None and correction.wanted == wanted:
        if seen.owned_fingerprint == correction.result:
            return False  # what the last correction produced: the server's own spelling
        if seen.resource_version == correction.read:
            return False  # the index still holds the copy that correction answered
    return True


def recorded(corrections: dict[ChildKey, Correction], child: ChildKey, done: Correction) -> bool:
    """Remember a correction in a deployment's ``corrections`` (its record's); whether it
    changed the child. An apply that returned the version the last correction produced
    changed nothing: the pass read a drifted copy written before that correction and delivered
    after it (a status update of a scaled StatefulSet), and that correction already told the
    user."""
    previous = corrections.get(child)
    corrections[child] = done
    return previous is None or previous.version != done.version


def keep_wanted(corrections: dict[ChildKey, Correction], owned: Mapping[ChildKey, str]) -> None:
    """Forget the corrections toward digests the render no longer wants: a child rendered
    anew since says nothing about the new render."""
    for child in [c for c, done in corrections.items() if done.wanted != owned.get(c)]:
        del corrections[child]
