"""The pure parts of fleet realism: pod status in stages, the fleet's objects and schedules,
and the timer thread that paces them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pdd_localcluster.fleet_activity import (
    DAEMONS,
    FleetActivity,
    daemon_pod,
    foreign_gpu_pod,
    heartbeat_patch,
    phase_offset,
)
from pdd_localcluster.podstatus import PodPlan, Stage, desired_status, status_matches
from pdd_localcluster.timers import Timers

NOW = "2026-01-01T00:00:00Z"


def pod(init: bool = True, sidecar: bool = False) -> dict[str, Any]:
    inits: list[dict[str, Any]] = [{"name": "preflight", "image": "busybox"}] if init else []
    if sidecar:
        inits.append({"name": "sidecar", "image": "pdd-sidecar", "restartPolicy": "Always"})
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "nodeName": "n1",
            "initContainers": inits,
            "containers": [{"name": "engine", "image": "vllm"}],
        },
        "status": {"phase": "Pending"},
    }


def plan(stage: Stage) -> PodPlan:
    return PodPlan("198.18.0.9", "198.19.0.1", stage=stage)


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


@pytest.mark.parametrize("init", [True, False])
def test_creating_is_pending_with_containers_being_created_and_no_pod_ip(init: bool) -> None:
    st = desired_status(pod(init), plan(Stage.CREATING), NOW)
    assert st["phase"] == "Pending"
    assert "podIP" not in st and st["hostIP"] == "198.19.0.1"
    waiting = [s["state"]["waiting"]["reason"] for s in st["containerStatuses"]]
    assert waiting == ["ContainerCreating"]
    assert conditions(st)["Ready"] == "False"


@pytest.mark.parametrize("sidecar", [True, False])
def test_started_is_running_but_not_ready(sidecar: bool) -> None:
    st = desired_status(pod(sidecar=sidecar), plan(Stage.STARTED), NOW)
    assert st["phase"] == "Running" and st["podIP"] == "198.18.0.9"
    assert conditions(st) | {"PodScheduled": "True"} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "ContainersReady": "False",
        "Ready": "False",
        "PodScheduled": "True",
    }
    main = st["containerStatuses"][0]
    assert "running" in main["state"] and main["started"] and not main["ready"]
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_ready_stage_is_the_unstaged_status() -> None:
    assert desired_status(pod(), plan(Stage.READY), NOW) == desired_status(
        pod(), PodPlan("198.18.0.9", "198.19.0.1"), NOW
    )


def test_each_stage_matches_only_its_own_status() -> None:
    """The simulator writes a stage once: its status matches its plan and no other."""
    shown = {s: {**pod(), "status": desired_status(pod(), plan(s), NOW)} for s in Stage}
    for written in Stage:
        for wanted in Stage:
            assert status_matches(shown[written], plan(wanted)) == (written == wanted)


def test_stages_do_not_apply_to_pods_that_really_run_or_fail() -> None:
    from pdd_localcluster.podstatus import InitFailure

    failing = PodPlan("198.18.0.9", "198.19.0.1", init_failure=InitFailure(3, "no"), stage=0)
    assert not failing.staged
    st = desired_status(pod(), failing, NOW)
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_heartbeat_patch_touches_only_heartbeat_times() -> None:
    conds = heartbeat_patch(NOW)["status"]["conditions"]
    assert {c["type"] for c in conds} == {"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"}
    assert all(set(c) == {"type", "lastHeartbeatTime"} for c in conds)


def test_daemon_pods_are_bound_and_tolerate_everything() -> None:
    body = daemon_pod("gpu-a-00", DAEMONS[0])
    assert body["spec"]["nodeName"] == "gpu-a-00"
    assert body["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert body["metadata"]["namespace"] == "kube-system"


def test_foreign_pods_are_unbound_and_cycle_gpu_sizes() -> None:
    bodies = [foreign_gpu_pod(i) for i in range(5)]
    assert all("nodeName" not in b["spec"] for b in bodies)
    gpus = [b["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for b in bodies]
    assert gpus == ["1", "2", "4", "8", "1"]
    assert len({b["metadata"]["name"] for b in bodies}) == 5


def test_heartbeats_spread_over_the_period() -> None:
    offsets = [phase_offset(f"gpu-{i:04d}", 10.0) for i in range(2000)]
    assert all(0 <= o < 10.0 for o in offsets)
    per_second = [sum(1 for o in offsets if s <= o < s + 1) for s in range(10)]
    assert max(per_second) < 2 * min(per_second)  # no second carries twice another's load
    assert phase_offset("gpu-0001", 10.0) == phase_offset("gpu-0001", 10.0)


def test_defaults_are_off_and_kubelet_defaults_are_the_kubelets() -> None:
    assert not FleetActivity().sends_requests
    assert FleetActivity().pod_stage_delays_s is None
    real = FleetActivity.kubelet_defaults()
    assert (real.lease_renew_s, real.node_status_report_s) == (10.0, 300.0)
    assert real.sends_requests


@pytest.mark.parametrize(
    "bad",
    [
        {"daemon_pods_per_node": len(DAEMONS) + 1},
        {"foreign_gpu_pods": -1},
        {"foreign_gpu_pod_lifetime_s": 0},
        {"lease_renew_s": 0},
    ],
)
def test_nonsense_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FleetActivity(**bad)


def test_timers_run_in_due_order_not_call_order() -> None:
    ran: list[str] = []
    done = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        timers = Timers(pool).start()
        timers.call_later(0.2, lambda: (ran.append("late"), done.set()))
        timers.call_later(0.05, lambda: ran.append("early"))
        timers.call_later(0.0, lambda: ran.append("now"))
        assert done.wait(5)
        timers.stop()
    assert ran == ["now", "early", "late"]


def test_stopped_timers_run_nothing_more() -> None:
    ran: list[int] = []
    with ThreadPoolExecutor(1) as pool:
        timers = Timers(pool).start()
        timers.call_later(0.2, lambda: ran.append(1))
        timers.stop()
        timers.call_later(0.0, lambda: ran.append(2))
        time.sleep(0.4)
    assert ran == []
