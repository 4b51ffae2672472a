"""Why the KV took the slow lane, in the words status gives, per boundary between the pods
(pdd_contract.probe_result): each cause names the setting that fixes it."""

from __future__ import annotations

import pytest

from pdd_contract.probe_result import REASON_TCP, ProbeResult, classify_probe


def tcp_result(boundary: str, link: str, operation: str = "WRITE") -> ProbeResult:
    return ProbeResult(
        path="DRAM->DRAM", transport="tcp", gbps=0.5, verified=True, link=link,
        operation=operation, peer_boundary=boundary, lanes=["tcp/lo"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("boundary", "link", "words"),
    [
        ("pod", "gpu", "separate pods without a shared PID namespace"),
        ("pod", "host", "separate pods without a shared PID namespace"),
        # Host memory between two hostPID pods: the IPC namespace is what stops cma.
        ("host-pid", "host", "set hostIPC in both podTemplates"),
        # GPU memory between them: cuda_ipc needs only the PID namespace, so the IPC
        # namespace is not the cause and the message does not send the user there.
        ("host-pid", "gpu", "check the RDMA resource"),
    ],
)
def test_the_cause_names_the_boundary_that_stopped_the_fast_lane(
    boundary: str, link: str, words: str
) -> None:
    ok, reason, message = classify_probe(
        tcp_result(boundary, link), expected_link_gbps=50, min_fraction=0.5
    )
    assert (ok, reason) == (False, REASON_TCP)
    assert words in message, message
