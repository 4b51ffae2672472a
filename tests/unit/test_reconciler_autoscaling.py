"""The Reconciler's side of autoscaling, against the in-memory cluster of helpers.fake_cluster:
the scale targets it creates, the counts it runs from their asks, what it writes back, and
that a scaling step changes no pod template and never the PDDeployment's spec."""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, reconciler_for
from pdd_operator.api.v1alpha1 import API_VERSION, SCALER_KIND
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.planning import autoscaling
from pdd_operator.reconcile import Reconciler
from pdd_operator.status.observe import PodSummary

NS = "team-a"
KEY = (NS, "llama")

DECODE_LEADS = {
    "decode": {"minReplicas": 0, "maxReplicas": 16},
    "prefill": {"minReplicas": 1, "maxReplicas": 8},
    "follower": "prefill",
    "ratio": {"prefill": 1, "decode": 2},
}


def body(**spec: Any) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(name="llama", uid="uid-llama", resourceVersion="1")
    result["spec"]["topology"] = {"placement": "none"}
    result["spec"].update(spec)
    return result


async def settle(cluster: FakeCluster, rec: Reconciler) -> None:
    """Passes until one writes nothing (the fake's index follows every write at once)."""
    for _ in range(5):
        before = len(cluster.writes)
        await rec.reconcile(KEY)
        if len(cluster.writes) == before:
            return
    raise AssertionError(f"still writing: {cluster.writes[-5:]}")


def condition(cluster: FakeCluster, type_: str) -> tuple[str, str]:
    conditions = cluster.stored[KEY]["status"]["conditions"]
    found = next(c for c in conditions if c["type"] == type_)
    return found["status"], found["reason"]


def statefulset(cluster: FakeCluster, role: str) -> dict[str, Any]:
    return cluster.child(NS, ("apps/v1", "StatefulSet", f"llama-{role}"))


def scaler(cluster: FakeCluster, role: str) -> dict[str, Any]:
    return cluster.objects[(NS, API_VERSION, SCALER_KIND, f"llama-{role}")]


def replicas(cluster: FakeCluster) -> dict[str, int]:
    return {r: statefulset(cluster, r)["spec"]["replicas"] for r in ("prefill", "decode")}


async def test_the_leader_gets_a_scale_target_at_its_spec_count_and_the_follower_none() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    await settle(cluster, reconciler_for(cluster))

    decode = scaler(cluster, "decode")
    assert decode["spec"] == {"deployment": "llama", "role": "decode", "replicas": 4}
    assert decode["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    assert decode["status"] == {
        "replicas": 4,
        "readyReplicas": 0,
        "selector": "pdd.dev/deployment=llama,pdd.dev/role=decode",
        "message": "",
    }
    assert (NS, API_VERSION, SCALER_KIND, "llama-prefill") not in cluster.objects
    assert replicas(cluster) == {"prefill": 2, "decode": 4}
    assert condition(cluster, "ScaledToZero") == ("False", "Serving")


async def test_a_scale_step_changes_counts_only_and_the_follower_keeps_the_ratio() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    templates = {r: statefulset(cluster, r)["spec"]["template"] for r in ("prefill", "decode")}
    spec_before = cluster.stored[KEY]["spec"]

    cluster.scale(NS, "llama-decode", 7)  # the HPA's write to /scale
    await settle(cluster, rec)

    assert replicas(cluster) == {"prefill": 4, "decode": 7}  # ceil(7 / 2)
    assert scaler(cluster, "decode")["status"]["replicas"] == 7
    # No pod template changed (no pod restarts) and the PDDeployment's spec is untouched.
    assert {r: statefulset(cluster, r)["spec"]["template"] for r in templates} == templates
    assert cluster.stored[KEY]["spec"] == spec_before
    assert cluster.stored[KEY]["status"]["decode"]["desired"] == 7


async def test_an_ask_beyond_the_bounds_is_clamped_and_the_target_says_why() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.scale(NS, "llama-decode", 40)
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 8, "decode": 16}
    assert scaler(cluster, "decode")["status"]["message"] == (
        "asked for 40, runs 16: spec.autoscaling maxReplicas is 16"
    )


async def test_scale_to_zero_and_back() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    rec = reconciler_for(cluster)
    await settle(cluster, rec)

    cluster.scale(NS, "llama-decode", 0)
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 0, "decode": 0}
    assert condition(cluster, "ScaledToZero") == ("True", "ScaledToZero")
    assert ("Normal", "ScaledToZero") in {(t, r) for t, r, _ in cluster.events}

    cluster.scale(NS, "llama-decode", 1)
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 1, "decode": 1}
    assert condition(cluster, "ScaledToZero") == ("False", "Serving")


async def test_removing_autoscaling_deletes_the_targets_and_returns_to_the_spec_counts() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.scale(NS, "llama-decode", 6)
    await settle(cluster, rec)

    cluster.update_spec(KEY, {"autoscaling": None})
    await settle(cluster, rec)
    assert (NS, API_VERSION, SCALER_KIND, "llama-decode") not in cluster.objects
    assert replicas(cluster) == {"prefill": 2, "decode": 4}
    assert not any(c["type"] == "ScaledToZero" for c in cluster.stored[KEY]["status"]["conditions"])


async def test_an_unchanged_scale_target_costs_no_write() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    before = len(cluster.writes)
    await rec.reconcile(KEY)
    assert cluster.writes[before:] == []


async def test_a_scale_target_name_held_by_another_object_is_reported_and_left_alone() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    foreign = {
        "apiVersion": API_VERSION,
        "kind": SCALER_KIND,
        "metadata": {"name": "llama-decode", "namespace": NS, "uid": "someone-elses"},
        "spec": {"deployment": "other", "role": "decode", "replicas": 9},
    }
    cluster.objects[(NS, API_VERSION, SCALER_KIND, "llama-decode")] = copy.deepcopy(foreign)
    await reconciler_for(cluster).reconcile(KEY)

    assert condition(cluster, "Stalled") == ("True", "NameConflict")
    message = next(
        c["message"] for c in cluster.stored[KEY]["status"]["conditions"] if c["type"] == "Stalled"
    )
    assert "the name of the decode scale target is taken" in message
    assert cluster.objects[(NS, API_VERSION, SCALER_KIND, "llama-decode")] == foreign
    assert replicas(cluster) == {"prefill": 2, "decode": 4}  # its starting counts, not 9


# The prober pod's sidecar answers (status.transfer): a verified RDMA path, and the same path
# fallen back to TCP. Not ready: the pass asks it for no new probe.
PROBER = PodSummary(
    name="llama-prefill-0", uid="u0", role="prefill", node="gpu-a-00",
    ready=False, revision="r1", problem=None,
)  # fmt: skip
VERIFIED = {"path": "VRAM->VRAM", "transport": "rdma", "gbps": 46.2, "expected_gbps": 50.0,
            "verified": True, "started_at": "2026-11-29T09:00:00Z"}  # fmt: skip
FELL_BACK = {**VERIFIED, "transport": "tcp", "gbps": 0.5}


def probe_answers(cluster: FakeCluster, result: dict[str, Any]) -> None:
    cluster.pods_of[KEY] = [replace(PROBER, probe_result=result)]


def held(cluster: FakeCluster) -> tuple[str, str, str]:
    conditions = cluster.stored[KEY]["status"]["conditions"]
    found = next(c for c in conditions if c["type"] == "ScalingHeld")
    return found["status"], found["reason"], found["message"]


async def test_a_degraded_kv_path_holds_decode_scale_ups_until_a_probe_verifies_it() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    rec = reconciler_for(cluster)
    probe_answers(cluster, VERIFIED)
    await settle(cluster, rec)
    assert held(cluster) == ("False", "NotHeld", "")

    probe_answers(cluster, FELL_BACK)
    cluster.scale(NS, "llama-decode", 8)
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 2, "decode": 4}  # what ran before the ask
    status, reason, message = held(cluster)
    assert (status, reason) == ("True", "KVPathDegraded")
    assert message.startswith(
        "decode scale-up from 4 to 8 held: the KV transfer path is degraded "
        "(KVTransferVerified=False, TCPFallback: 0.5 GB/s measured, 50 GB/s expected)"
    )
    assert scaler(cluster, "decode")["status"]["message"].startswith("asked for 8, runs 4: ")
    assert ("Warning", "KVPathDegraded") in {(t, r) for t, r, _ in cluster.events}

    cluster.scale(NS, "llama-decode", 2)  # scaling down is never held
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 1, "decode": 2}
    assert held(cluster)[:2] == ("False", "NotHeld")

    cluster.scale(NS, "llama-decode", 8)
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 1, "decode": 2}
    probe_answers(cluster, VERIFIED)  # the path is fixed: the held ask goes through
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 4, "decode": 8}
    assert held(cluster)[:2] == ("False", "NotHeld")
    assert scaler(cluster, "decode")["status"]["message"] == ""


async def test_the_guard_switched_off_scales_over_a_degraded_path() -> None:
    cluster = FakeCluster(body(autoscaling={**DECODE_LEADS, "kvTransferGuard": False}))
    rec = reconciler_for(cluster)
    probe_answers(cluster, FELL_BACK)
    await settle(cluster, rec)
    cluster.scale(NS, "llama-decode", 8)
    await settle(cluster, rec)
    assert replicas(cluster) == {"prefill": 4, "decode": 8}
    assert held(cluster)[:2] == ("False", "NotHeld")


async def test_the_transfer_gauges_follow_the_latest_probe_and_go_with_the_deployment() -> None:
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    metrics = OperatorMetrics(CollectorRegistry())
    rec = reconciler_for(cluster, metrics)
    await settle(cluster, rec)

    def series() -> dict[tuple[str, str], float]:
        return {
            (sample.name, sample.labels["path"]): sample.value
            for family in metrics.registry.collect()
            if family.name.startswith("pdd_kv_transfer")
            for sample in family.samples
            if sample.labels["deployment"] == "llama" and sample.labels["namespace"] == NS
        }

    assert series() == {}  # no probe answered yet: nothing to trust
    probe_answers(cluster, VERIFIED)
    await settle(cluster, rec)
    assert series() == {
        ("pdd_kv_transfer_gbps", "VRAM->VRAM"): 46.2,
        ("pdd_kv_transfer_verified", "VRAM->VRAM"): 1.0,
    }
    probe_answers(cluster, {**FELL_BACK, "path": "DRAM->DRAM"})  # one series, not two
    await settle(cluster, rec)
    assert series() == {
        ("pdd_kv_transfer_gbps", "DRAM->DRAM"): 0.5,
        ("pdd_kv_transfer_verified", "DRAM->DRAM"): 0.0,
    }

    cluster.delete_deployment(KEY)
    await rec.reconcile(KEY)
    assert series() == {}


async def test_where_instances_span_nodes_a_degraded_rank_holds_decode_scale_ups() -> None:
    # Every prefill rank answers for its own path; the first instance's leader (the one
    # prober of single-node deployments) is fine, its rank 1 fell back to TCP.
    two_nodes = {"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}
    cluster = FakeCluster(
        body(autoscaling=DECODE_LEADS, prefill=dict(two_nodes), decode=dict(two_nodes))
    )
    rec = reconciler_for(cluster)
    cluster.pods_of[KEY] = [
        replace(PROBER, name="llama-prefill-0-0", probe_result=VERIFIED),
        replace(PROBER, name="llama-prefill-0-1", uid="u1", probe_result=FELL_BACK),
    ]
    await settle(cluster, rec)
    assert condition(cluster, "KVTransferVerified") == ("False", "RankPathDegraded")
    cluster.scale(NS, "llama-decode", 8)
    await settle(cluster, rec)
    status, reason, message = held(cluster)
    assert (status, reason) == ("True", "KVPathDegraded")
    assert " to 8 held: the KV transfer path is degraded (KVTransferVerified=False, " in message
    assert "RankPathDegraded: 0.5 GB/s measured, 50 GB/s expected)" in message
    assert instances(cluster, "decode") < 8


def instances(cluster: FakeCluster, role: str) -> int:
    """Instances of a role whose instances span nodes: one StatefulSet each."""
    return sum(
        1
        for key in cluster.objects
        if key[2] == "StatefulSet" and str(key[3]).startswith(f"llama-{role}-")
    )


async def pods_ready_just_now(cluster: FakeCluster) -> None:
    """The deployment's children written, then every StatefulSet pod turned Ready this instant,
    and a pass."""
    rec = reconciler_for(cluster)
    await settle(cluster, rec)
    cluster.workloads_ready(NS)
    now = time.time()
    for key, pods in cluster.workload_pods.items():
        cluster.workload_pods[key] = [replace(pod, ready_since=now) for pod in pods]
    await rec.reconcile(KEY)


async def test_a_pod_counts_as_ready_once_the_router_can_have_found_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An autoscaled deployment's router is Ready without workers and registers a pod a moment
    after it turns Ready: the pod counts (and the deployment is Ready) only DISCOVERY_GRACE_S
    later, and a pass then comes by itself."""
    monkeypatch.setattr(autoscaling, "DISCOVERY_GRACE_S", 0.5)
    cluster = FakeCluster(body(autoscaling=DECODE_LEADS))
    await pods_ready_just_now(cluster)
    assert condition(cluster, "Ready") == ("False", "ReplicasNotReady")
    assert cluster.stored[KEY]["status"]["decodeReplicas"] == "0/4"

    await asyncio.sleep(0.8)  # no event: the pass the grace asked for
    assert condition(cluster, "Ready") == ("True", "AllReplicasReady")
    assert cluster.stored[KEY]["status"]["decodeReplicas"] == "4/4"


async def test_without_autoscaling_a_ready_pod_counts_at_once() -> None:
    cluster = FakeCluster(body())
    await pods_ready_just_now(cluster)
    assert condition(cluster, "Ready") == ("True", "AllReplicasReady")
