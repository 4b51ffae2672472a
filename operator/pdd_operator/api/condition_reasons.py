"""The reasons a PDDeployment's conditions and the operator's events carry: one spelling each,
for the status code, its events and the tests (the condition types they go with are in
condition_types).

Only the reasons the operator itself gives are here. The sidecar's probe verdicts are
pdd_contract's (probe_result), re-exported for KVTransferVerified; the reasons Kubernetes gives
(a pod's CrashLoopBackOff, ImagePullBackOff or Unschedulable, a StatefulSet's FailedCreate,
a kubelet's FailedMount) are passed on or read as the cluster spells them, and are not ours."""

from __future__ import annotations

from pdd_contract.probe_result import REASON_CORRUPT as REASON_CORRUPT
from pdd_contract.probe_result import REASON_FAILED as REASON_FAILED
from pdd_contract.probe_result import REASON_SLOW as REASON_SLOW
from pdd_contract.probe_result import REASON_TCP as REASON_TCP
from pdd_contract.probe_result import REASON_VERIFIED as REASON_VERIFIED

# Ready: whether every wanted pod serves the current spec.
ALL_REPLICAS_READY = "AllReplicasReady"
REPLICAS_NOT_READY = "ReplicasNotReady"
ROLLOUT_IN_PROGRESS = "RolloutInProgress"

# Progressing and Reconciling: what the roles' workloads are doing.
COMPLETE = "Complete"
ROLLING_OUT = "RollingOut"
SCALING = "Scaling"

# Degraded: nothing wrong, or a problem the operator found itself (a pod's own, from Kubernetes,
# keeps Kubernetes' reason).
AS_EXPECTED = "AsExpected"
PODS_REFUSED = "PodsRefused"
PREFLIGHT_FAILED = "PreflightFailed"
TOKEN_SECRET_MISSING = "TokenSecretMissing"

# Stalled: nothing is stuck (when something is, Stalled takes that condition's reason).
NOT_STALLED = "NotStalled"

# A write of the children refused (Ready, Degraded, Stalled) or retried (Ready, Progressing).
APPLY_FAILED = "ApplyFailed"
APPLY_RETRYING = "ApplyRetrying"
NAME_CONFLICT = "NameConflict"
TOKEN_SECRET_CONFLICT = "TokenSecretConflict"

# A spec this operator cannot read: Ready, Progressing, Reconciling and Stalled, and its event.
INVALID_SPEC = "InvalidSpec"

# ModelReady: whether the objects spec.model.source refers to are there.
MODEL_AVAILABLE = "ModelAvailable"
MODEL_CHECK_FAILED = "ModelCheckFailed"
MODEL_SECRET_MISSING = "ModelSecretMissing"
MODEL_SECRET_KEY_MISSING = "ModelSecretKeyMissing"
MODEL_PVC_MISSING = "ModelPVCMissing"
MODEL_PVC_LOST = "ModelPVCLost"
MODEL_PVC_ACCESS_MODE = "ModelPVCAccessMode"

# ParallelismSupported: whether each role's layout splits the model's heads and experts evenly.
FITS_MODEL = "FitsModel"
MODEL_SHAPE_UNKNOWN = "ModelShapeUnknown"
MODEL_SHAPE_INCOMPLETE = "ModelShapeIncomplete"
ATTENTION_HEADS_NOT_DIVISIBLE = "AttentionHeadsNotDivisible"
KV_HEADS_NOT_DIVISIBLE = "KVHeadsNotDivisible"
EXPERTS_NOT_DIVISIBLE = "ExpertsNotDivisible"

# GangScheduling: whether the gang scheduler spec.scheduling.gang names is served.
GANG_SCHEDULER_AVAILABLE = "GangSchedulerAvailable"
GANG_SCHEDULER_UNAVAILABLE = "GangSchedulerUnavailable"

# Placed: the planner's decision (planning.placement).
PLACED = "Placed"
PLACEMENT_DISABLED = "PlacementDisabled"
NO_ELIGIBLE_NODES = "NoEligibleNodes"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
NO_TOPOLOGY_LABELS = "NoTopologyLabels"

# KVTransferVerified: the probe's verdict (REASON_* above), or a rank's path where instances span
# nodes.
RANK_PATH_DEGRADED = "RankPathDegraded"

# EngineVersionSupported: whether the operator knows the engine release it renders for.
SUPPORTED = "Supported"
VERSION_UNKNOWN = "VersionUnknown"
VERSION_NOT_SUPPORTED = "VersionNotSupported"

# KVCacheOffloaded: whether the prefill engines got spec.kvCache.offload's CPU tier.
OFFLOAD_RENDERED = "OffloadRendered"
OFFLOAD_NOT_RENDERED = "OffloadNotRendered"

# KVAwareRouting: whether the prefill engines publish the KV events kv_aware routes by.
KV_EVENTS_PUBLISHED = "KVEventsPublished"
KV_EVENTS_NOT_PUBLISHED = "KVEventsNotPublished"

# ScaledToZero: whether an autoscaled deployment's roles are both at 0 pods.
SCALED_TO_ZERO = "ScaledToZero"
SERVING = "Serving"

# ScalingHeld: whether decode's scale-up waits for the KV path.
KV_PATH_DEGRADED = "KVPathDegraded"
NOT_HELD = "NotHeld"

# The operator's own events (the others take the reason of the condition that changed).
READY = "Ready"
NOT_READY = "NotReady"
DRIFT_CORRECTED = "DriftCorrected"
TOKEN_SECRET_RECREATED = "TokenSecretRecreated"
INSTANCE_RESTARTED = "InstanceRestarted"
INSTANCE_REPLACED = "InstanceReplaced"

# The probe's verdicts, as pdd_contract spells them.
PROBE_REASONS = (REASON_VERIFIED, REASON_FAILED, REASON_CORRUPT, REASON_TCP, REASON_SLOW)

REASONS = (
    ALL_REPLICAS_READY,
    REPLICAS_NOT_READY,
    ROLLOUT_IN_PROGRESS,
    COMPLETE,
    ROLLING_OUT,
    SCALING,
    AS_EXPECTED,
    PODS_REFUSED,
    PREFLIGHT_FAILED,
    TOKEN_SECRET_MISSING,
    NOT_STALLED,
    APPLY_FAILED,
    APPLY_RETRYING,
    NAME_CONFLICT,
    TOKEN_SECRET_CONFLICT,
    INVALID_SPEC,
    MODEL_AVAILABLE,
    MODEL_CHECK_FAILED,
    MODEL_SECRET_MISSING,
    MODEL_SECRET_KEY_MISSING,
    MODEL_PVC_MISSING,
    MODEL_PVC_LOST,
    MODEL_PVC_ACCESS_MODE,
    FITS_MODEL,
    MODEL_SHAPE_UNKNOWN,
    MODEL_SHAPE_INCOMPLETE,
    ATTENTION_HEADS_NOT_DIVISIBLE,
    KV_HEADS_NOT_DIVISIBLE,
    EXPERTS_NOT_DIVISIBLE,
    GANG_SCHEDULER_AVAILABLE,
    GANG_SCHEDULER_UNAVAILABLE,
    PLACED,
    PLACEMENT_DISABLED,
    NO_ELIGIBLE_NODES,
    WAITING_FOR_CAPACITY,
    INSUFFICIENT_CAPACITY,
    NO_TOPOLOGY_LABELS,
    RANK_PATH_DEGRADED,
    SUPPORTED,
    VERSION_UNKNOWN,
    VERSION_NOT_SUPPORTED,
    OFFLOAD_RENDERED,
    OFFLOAD_NOT_RENDERED,
    KV_EVENTS_PUBLISHED,
    KV_EVENTS_NOT_PUBLISHED,
    SCALED_TO_ZERO,
    SERVING,
    KV_PATH_DEGRADED,
    NOT_HELD,
    READY,
    NOT_READY,
    DRIFT_CORRECTED,
    TOKEN_SECRET_RECREATED,
    INSTANCE_RESTARTED,
    INSTANCE_REPLACED,
    *PROBE_REASONS,
)
