"""A cuda_ipc lane measured between pods that share the host's PID namespace was measured to
the check's peer on this pod's own GPUs: the verdict says so, since the other role's pod holds
GPUs this pod cannot see (docs/topology.md, "KV lanes on one node")."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.status.observe import PodSummary
from pdd_operator.status.transfer import transfer_outcome

CAVEAT = "whether cuda_ipc reaches the other pod's GPUs, which this pod cannot see, is not measured"


def prober(result: dict[str, Any]) -> PodSummary:
    return PodSummary(
        name="llama-prefill-0", uid="u", role="prefill", node="n", ready=True,
        revision="r1", problem=None, probe_result=result,
    )  # fmt: skip


def result(boundary: str, lanes: list[str], link: str = "gpu") -> dict[str, Any]:
    transport = lanes[0].split("/")[0]
    return {"transport": transport, "gbps": 250.0, "expected_gbps": 200.0, "verified": True,
            "measured_by": "preflight", "link": link, "operation": "WRITE",
            "peer_boundary": boundary, "lanes": lanes,
            "started_at": "2026-12-01T02:59:00Z"}  # fmt: skip


@pytest.mark.parametrize("boundary", ["host-pid", "host-pid-ipc"])
def test_cuda_ipc_between_pods_sharing_a_pid_namespace_is_named_as_measured_on_own_gpus(
    boundary: str,
) -> None:
    outcome = transfer_outcome(make_pdd(), prober(result(boundary, ["cuda_ipc/cuda"])))
    assert outcome is not None
    assert CAVEAT in outcome.status.message, outcome.status.message


@pytest.mark.parametrize(
    ("boundary", "lanes", "link"),
    [
        ("pod", ["tcp/lo"], "gpu"),  # separate pods: the lane is the one measured
        ("host-pid", ["tcp/lo"], "gpu"),  # no cuda_ipc: nothing to qualify
        ("host-pid-ipc", ["cma/memory"], "host"),  # host memory has no GPU to reach
    ],
)
def test_other_lanes_carry_no_such_note(boundary: str, lanes: list[str], link: str) -> None:
    outcome = transfer_outcome(make_pdd(), prober(result(boundary, lanes, link)))
    assert outcome is not None
    assert CAVEAT not in outcome.status.message, outcome.status.message
