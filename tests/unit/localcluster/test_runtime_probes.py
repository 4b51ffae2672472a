"""Probe scheduling and verdicts, and the status of a pod whose containers run."""

from __future__ import annotations

from typing import Any

import pytest

from pdd_localcluster.podstatus import ContainerRun, PodPlan, PodRun, desired_status, status_matches
from pdd_localcluster.runtime.images import lookup, repository
from pdd_localcluster.runtime.probes import ProbeTracker, resolve_port


def tracker(kind: str = "readinessProbe", **spec: Any) -> ProbeTracker:
    container = {kind: {"httpGet": {"port": 80}, **spec}}
    return ProbeTracker.for_container(container, started_at=100.0)[kind]


def test_first_run_after_the_initial_delay_then_every_period() -> None:
    t = tracker(initialDelaySeconds=5, periodSeconds=2)
    assert not t.due(104.9) and t.due(105.0)
    t.record(True, 105.0)
    assert not t.due(106.9) and t.due(107.0)


def test_readiness_starts_failed_and_flips_on_thresholds() -> None:
    t = tracker(successThreshold=2, failureThreshold=3)
    assert t.passing is False
    assert t.record(True, 0) is False  # one success of two
    assert t.record(True, 0) is True
    assert t.record(False, 0) is True and t.record(False, 0) is True
    assert t.record(False, 0) is False  # the third failure in a row


def test_liveness_and_startup_start_unknown() -> None:
    assert tracker("livenessProbe").passing is None
    assert tracker("startupProbe").passing is None


def test_a_period_cap_shortens_slow_probes_only() -> None:
    c = {"readinessProbe": {"periodSeconds": 10}, "livenessProbe": {"periodSeconds": 1}}
    ts = ProbeTracker.for_container(c, 0.0, max_period=2.0)
    assert ts["readinessProbe"].spec["periodSeconds"] == 2.0
    assert ts["livenessProbe"].spec["periodSeconds"] == 1


def test_named_and_numbered_ports() -> None:
    c = {"ports": [{"name": "http", "containerPort": 8000}]}
    assert resolve_port("http", c) == 8000
    assert resolve_port(9000, c) == 9000
    assert resolve_port("9001", c) == 9001
    with pytest.raises(ValueError, match="no port named"):
        resolve_port("grpc", c)


@pytest.mark.parametrize(
    ("image", "repo", "known"),
    [
        ("ghcr.io/pdd-dev/pdd-sidecar:0.1.0", "ghcr.io/pdd-dev/pdd-sidecar", True),
        ("ghcr.io/pdd-dev/pdd-router@sha256:abc", "ghcr.io/pdd-dev/pdd-router", True),
        ("localhost:5000/pdd-sidecar", "localhost:5000/pdd-sidecar", False),
        ("vllm/vllm-openai:v0.11.0", "vllm/vllm-openai", False),
    ],
)
def test_image_repositories(image: str, repo: str, known: bool) -> None:
    assert repository(image) == repo
    assert (lookup(image) is not None) == known


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("ghcr.io/pdd-dev/pdd-refengine:vllm-0.33.0", "vllm-0.33.0"),
        ("ghcr.io/pdd-dev/pdd-refengine:sglang-0.5.4@sha256:" + "a" * 64, "sglang-0.5.4"),
        ("ghcr.io/pdd-dev/pdd-refengine", ""),
    ],
)
def test_the_reference_engine_image_tells_its_programs_its_tag(image: str, tag: str) -> None:
    fs = lookup(image)
    assert fs is not None
    assert fs.env(image)["PDD_REFENGINE_IMAGE_TAG"] == tag
    assert "PDD_REFENGINE_IMAGE_TAG" not in lookup("ghcr.io/pdd-dev/pdd-sidecar:1").env(image)  # type: ignore[union-attr]


POD: dict[str, Any] = {
    "metadata": {"uid": "u"},
    "spec": {
        "initContainers": [{"name": "init", "image": "i"}],
        "containers": [{"name": "a", "image": "ia"}, {"name": "b", "image": "ib"}],
    },
    "status": {},
}
DONE = ContainerRun("init", "terminated", "Completed", started_at="t0", finished_at="t1")


def status_for(*mains: ContainerRun, inits: tuple[ContainerRun, ...] = (DONE,)) -> dict[str, Any]:
    plan = PodPlan("127.86.0.1", "198.19.0.1", run=PodRun(inits, mains))
    return desired_status(POD, plan, "now")


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_ready_follows_every_containers_readiness() -> None:
    a = ContainerRun("a", "running", started_at="t", ready=True, started=True)
    b = ContainerRun("b", "running", started_at="t", ready=False, started=True)
    s = status_for(a, b)
    assert s["phase"] == "Running"
    c = conditions(s)
    assert (c["Initialized"], c["ContainersReady"], c["Ready"]) == ("True", "False", "False")
    s = status_for(a, ContainerRun("b", "running", started_at="t", ready=True, started=True))
    assert conditions(s)["Ready"] == "True"
    assert [c["ready"] for c in s["containerStatuses"]] == [True, True]


def test_a_restarting_container_shows_its_count_and_last_state() -> None:
    b = ContainerRun(
        "b",
        "waiting",
        "CrashLoopBackOff",
        "back-off",
        restart_count=3,
        last_exit=(3, "Error", "t0", "t1"),
    )
    a = ContainerRun("a", "running", started_at="t", ready=True, started=True)
    st = status_for(a, b)["containerStatuses"][1]
    assert st["restartCount"] == 3
    assert st["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
    assert st["lastState"]["terminated"]["exitCode"] == 3


def test_phase_pending_during_init_and_final_once_all_ended() -> None:
    init_running = ContainerRun("init", "running", started_at="t")
    waiting = ContainerRun("a", "waiting", "PodInitializing")
    s = status_for(waiting, waiting, inits=(init_running,))
    assert s["phase"] == "Pending" and conditions(s)["Initialized"] == "False"
    ok = ContainerRun("a", "terminated", "Completed")
    bad = ContainerRun("b", "terminated", "Error", exit_code=1)
    assert status_for(ok, ok)["phase"] == "Succeeded"
    assert status_for(ok, bad)["phase"] == "Failed"


def test_status_matches_sees_readiness_and_restart_changes() -> None:
    a = ContainerRun("a", "running", started_at="t", ready=True, started=True)
    b = ContainerRun("b", "running", started_at="t", ready=True, started=True)
    plan = PodPlan("127.86.0.1", "198.19.0.1", run=PodRun((DONE,), (a, b)))
    pod = {**POD, "status": desired_status(POD, plan, "then")}
    assert status_matches(pod, plan)
    unready = PodPlan(
        "127.86.0.1",
        "198.19.0.1",
        run=PodRun((DONE,), (a, ContainerRun("b", "running", ready=False))),
    )
    assert not status_matches(pod, unready)
    restarted = PodPlan(
        "127.86.0.1",
        "198.19.0.1",
        run=PodRun(
            (DONE,), (a, ContainerRun("b", "running", ready=True, started=True, restart_count=1))
        ),
    )
    assert not status_matches(pod, restarted)
