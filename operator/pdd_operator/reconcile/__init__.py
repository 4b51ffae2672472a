"""One idempotent reconcile for a PDDeployment: plan -> render -> apply -> prune -> status.

Every trigger (the object changed, a child changed, a pod changed, the periodic resync, the
operator restarted) calls the same `Reconciler.reconcile`. It reads only the operator's
in-memory indexes (watch-fed caches), writes only what differs from them, and writes status
only when it changed, so a resync of an unchanged PDDeployment makes no API write at all.

"Differs" includes a child changed by hand (scaled, an env var removed, deleted): the index
keeps a digest of the live values of the fields the operator owns (status.drift), and a child
whose digest is not the render's is applied again, which takes those fields back
(status.corrections).

A pass is a pipeline of parts, a module each: `plan` (pure: counts, slices, placement, the
render context), `children` (around `prerequisites`: model, `token`, gang scheduler),
`scalers`, `restarts`, `status_writer`; `reconciler` runs them in order and schedules what
they ask for; `memory` holds one record per deployment and the reservation ledger; `ports` is what
they read and write through.
"""

from pdd_operator.reconcile.children import CONFLICT_RETRY_MAX_SECONDS, REFERENCED_FIRST
from pdd_operator.reconcile.ports import ApiWriter, ClusterView, EventSink
from pdd_operator.reconcile.prerequisites import (
    CONFLICT_RETRY_SECONDS,
    GANG_API_RECHECK_S,
    MODEL_RETRY_FIRST_S,
    MODEL_RETRY_MAX_S,
)
from pdd_operator.reconcile.reconciler import (
    TRANSIENT_RETRY_FIRST_S,
    TRANSIENT_RETRY_MAX_S,
    Reconciler,
)
from pdd_operator.rendering.children import WORKLOAD_KINDS

__all__ = [
    "CONFLICT_RETRY_MAX_SECONDS",
    "CONFLICT_RETRY_SECONDS",
    "GANG_API_RECHECK_S",
    "MODEL_RETRY_FIRST_S",
    "MODEL_RETRY_MAX_S",
    "REFERENCED_FIRST",
    "TRANSIENT_RETRY_FIRST_S",
    "TRANSIENT_RETRY_MAX_S",
    "WORKLOAD_KINDS",
    "ApiWriter",
    "ClusterView",
    "EventSink",
    "Reconciler",
]
