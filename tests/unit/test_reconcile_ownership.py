"""Status is the operator's: a transfer verdict written by someone else is put back from the
prober pod's result; against the in-memory cluster of helpers.fake_cluster."""

from __future__ import annotations

from typing import Any

from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.api import names
from pdd_operator.status.observe import PodSummary
from unit.test_reconciler import KEY, NS, body, settle

FORGED = {
    "transfer": {"measuredGBps": 999.0, "verified": True, "transport": "nvlink", "message": "ok"},
    "conditions": [
        {
            "type": "KVTransferVerified",
            "status": "True",
            "reason": "TransferVerified",
            "message": "999 GB/s",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 3,
        }
    ],
}


def forge(cluster: FakeCluster, status: dict[str, Any]) -> None:
    """Someone patches /status; the watch delivers it (a new version: a pass runs)."""
    stored = cluster.stored[KEY]
    stored["status"] = {**stored["status"], **status}
    stored["metadata"]["resourceVersion"] = cluster.next_version()
    cluster.deliver_pdd_watch()


def prober_with(result: dict[str, Any] | None, request: str = "") -> PodSummary:
    name = names.prober_pod_name("llama")
    return PodSummary(name, "u0", "prefill", "gpu-0", True, "r", None, request, result)


def transfer_condition(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [
        c for c in cluster.stored[KEY]["status"]["conditions"] if c["type"] == "KVTransferVerified"
    ]


async def test_a_forged_transfer_verdict_is_replaced_by_not_verified_yet() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    forge(cluster, FORGED)
    await settle(cluster, rec)

    transfer = cluster.stored[KEY]["status"]["transfer"]
    assert (transfer["measuredGBps"], transfer["verified"]) == (0.0, False)
    assert transfer["message"].startswith("not verified yet")
    assert transfer_condition(cluster) == []


async def test_a_forged_transfer_verdict_is_replaced_by_the_prober_pods_result() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    request = "2026-11-29T09:00:00Z"
    result = {"request_id": request, "verified": True, "transport": "tcp", "gbps": 0.5}
    # A newer request is pending on the pod: its result still answers the one before.
    cluster.pods_of[KEY] = [prober_with(result, "2026-11-29T10:00:00Z")]
    await settle(cluster, rec)
    # The pod's answer is to an older request than the pending one: it is still the latest
    # measurement, and the status says what it says, not what was forged.
    later = {**FORGED["transfer"], "requestedAt": "2026-11-29T10:00:00Z"}
    forge(cluster, {**FORGED, "transfer": later})
    await settle(cluster, rec)

    transfer = cluster.stored[KEY]["status"]["transfer"]
    assert (transfer["measuredGBps"], transfer["verified"]) == (0.5, False)
    [verdict] = transfer_condition(cluster)
    assert (verdict["status"], verdict["reason"]) == ("False", "TCPFallback")


async def test_a_forged_request_time_in_the_future_does_not_hold_probes_back() -> None:
    cluster = FakeCluster(body())
    rec = reconciler_for(cluster)
    cluster.pods_of[KEY] = [prober_with(None)]
    await settle(cluster, rec)
    cluster.workloads_ready(NS)
    await settle(cluster, rec)
    asked = cluster.pods_of[KEY][0].probe_request
    assert asked

    forge(cluster, {"transfer": {"requestedAt": "2999-01-01T00:00:00Z"}})
    cluster.pods_of[KEY] = [prober_with(None)]  # a new prober pod: nothing asked of it yet
    await settle(cluster, rec)
    assert cluster.pods_of[KEY][0].probe_request
    assert cluster.stored[KEY]["status"]["transfer"]["requestedAt"] != "2999-01-01T00:00:00Z"
