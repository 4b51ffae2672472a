from __future__ import annotations

import pytest

from helpers.factories import make_pdd
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import PDDeployment, PDDeploymentStatus, TransferStatus
from pdd_operator.planning.placement import Placement, PlacementResult
from pdd_operator.status.compute import (
    Observed,
    PodProblem,
    WorkloadState,
    compute_status,
    is_ready,
)
from pdd_operator.status.conditions import find

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def settled(n: int) -> WorkloadState:
    return WorkloadState(True, n, n, n, "r1", "r1", 2, 2)


def observed(
    prefill: WorkloadState, decode: WorkloadState, router: WorkloadState | None = None, **kw: object
) -> Observed:
    workloads = {"prefill": prefill, "decode": decode, "router": router or settled(1)}
    return Observed(
        workloads=workloads, wanted={"prefill": 2, "decode": 4, "router": 1}, revision="abc", **kw
    )  # type: ignore[arg-type]


def cond(status: PDDeploymentStatus, type_: str) -> tuple[str, str]:
    c = find(status.conditions, type_)
    assert c is not None
    return c.status, c.reason


def test_pending_pods_are_not_ready_and_progressing(pdd: PDDeployment) -> None:
    pending = WorkloadState(True, 4, 0, 4, "r1", "r1", 1, 1)
    status = compute_status(pdd, observed(settled(2), pending), T0)
    assert cond(status, "Ready") == ("False", "ReplicasNotReady")
    assert cond(status, "Progressing")[0] == "True"
    assert cond(status, "Reconciling")[0] == "True"
    assert cond(status, "Degraded") == ("False", "AsExpected")
    assert status.decodeReplicas == "0/4"
    assert status.prefillReplicas == "2/2"
    assert status.observedGeneration == 3


def test_every_condition_written_is_one_of_the_apis_types(pdd: PDDeployment) -> None:
    status = compute_status(pdd, observed(settled(2), settled(4)), T0)
    written = {c.type for c in status.conditions}
    assert {"Ready", "Progressing", "Degraded", "Reconciling", "Stalled"} <= written
    assert written <= set(condition_types.TYPES)


def test_all_ready_is_ready_and_complete(pdd: PDDeployment) -> None:
    status = compute_status(pdd, observed(settled(2), settled(4)), T0)
    assert cond(status, "Ready") == ("True", "AllReplicasReady")
    assert cond(status, "Progressing") == ("False", "Complete")
    assert cond(status, "Stalled")[0] == "False"
    assert (
        find(status.conditions, "Ready").message
        == "prefill 2/2 ready, decode 4/4 ready, router 1/1 ready"
    )  # type: ignore[union-attr]


def test_rolling_update_is_not_ready_until_every_pod_is_updated(pdd: PDDeployment) -> None:
    rolling = WorkloadState(True, 4, 4, 2, "r1", "r2", 3, 3)
    status = compute_status(pdd, observed(settled(2), rolling), T0)
    assert cond(status, "Ready") == ("False", "RolloutInProgress")
    assert cond(status, "Progressing") == ("True", "RollingOut")


def test_preflight_failure_degrades_and_stalls_with_the_fix(pdd: PDDeployment) -> None:
    problem = PodProblem(
        "llama-decode-0", "decode", "PreflightFailed", "memlock is 8 MiB; set unlimited", True
    )
    status = compute_status(
        pdd,
        observed(settled(2), WorkloadState(True, 4, 3, 4, "", "", 1, 1), pod_problems=[problem]),
        T0,
    )
    assert cond(status, "Degraded") == ("True", "PreflightFailed")
    assert cond(status, "Stalled") == ("True", "PreflightFailed")
    assert "memlock" in find(status.conditions, "Degraded").message  # type: ignore[union-attr]


def test_transition_time_moves_only_when_status_flips() -> None:
    pdd = make_pdd()
    first = compute_status(pdd, observed(settled(2), settled(4)), T0)
    again = compute_status(_with_status(pdd, first), observed(settled(2), settled(4)), T1)
    assert again == first  # nothing changed: identical status, so no write
    broken = compute_status(
        _with_status(pdd, first),
        observed(settled(2), WorkloadState(True, 4, 2, 4, "", "", 1, 1)),
        T1,
    )
    assert find(broken.conditions, "Ready").lastTransitionTime == T1  # type: ignore[union-attr]
    assert find(broken.conditions, "Degraded").lastTransitionTime == T0  # type: ignore[union-attr]


def test_placement_failure_is_a_condition(pdd: PDDeployment) -> None:
    result = PlacementResult(
        False,
        Placement(mode="required"),
        "InsufficientCapacity",
        "no nvidia.com/gpu.clique has 12 free GPUs on dma-buf-capable nodes; largest has 8",
    )
    status = compute_status(pdd, observed(settled(2), settled(4), placement=result), T0)
    assert cond(status, "Placed") == ("False", "InsufficientCapacity")
    assert "largest has 8" in status.placement.message


def test_apply_error_is_reported(pdd: PDDeployment) -> None:
    status = compute_status(
        pdd, observed(settled(2), settled(4), apply_error="could not apply children: forbidden"), T0
    )
    assert cond(status, "Ready") == ("False", "ApplyFailed")
    assert cond(status, "Stalled") == ("True", "ApplyFailed")


def _with_status(pdd: PDDeployment, status: PDDeploymentStatus) -> PDDeployment:
    return pdd.model_copy(update={"status": status})


PENDING = WorkloadState(True, 4, 0, 4, "r1", "r1", 1, 1)
ROLLING = WorkloadState(True, 4, 4, 2, "r1", "r2", 3, 3)
UNOBSERVED = WorkloadState(True, 4, 4, 4, "r1", "r1", 3, 2)  # its controller lags the spec


@pytest.mark.parametrize(
    "seen",
    [
        observed(settled(2), settled(4)),
        observed(settled(2), PENDING),
        observed(settled(2), ROLLING),
        observed(settled(2), UNOBSERVED),
        observed(settled(2), settled(4), apply_error="denied"),
        observed(settled(2), settled(4), router=WorkloadState()),
    ],
)
def test_is_ready_is_what_the_ready_condition_says(pdd: PDDeployment, seen: Observed) -> None:
    assert is_ready(seen) is (cond(compute_status(pdd, seen, T0), "Ready")[0] == "True")


def test_a_probe_asked_for_during_the_pass_is_in_the_status_it_writes(pdd: PDDeployment) -> None:
    assert compute_status(pdd, observed(settled(2), settled(4)), T1).transfer.requestedAt == ""
    asked = compute_status(pdd, observed(settled(2), settled(4), probe_requested_at=T1), T1)
    assert asked.transfer.requestedAt == T1
    # with a result of the previous probe in hand, the new request still wins
    answered = TransferStatus(path="rdma", verified=True, requestedAt=T0)
    both = observed(settled(2), settled(4), transfer=answered, probe_requested_at=T1)
    status = compute_status(pdd, both, T1)
    assert (status.transfer.path, status.transfer.requestedAt) == ("rdma", T1)
