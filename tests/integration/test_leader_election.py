"""High availability: two real operator processes elect one leader on a Lease of the real
API server (kube/lease.py, leadership.py), and the standby takes over when the leader goes.

Each replica runs as its own user, so the API server's audit log says which one sent each
write. The leader is killed (SIGKILL: its node vanished) and, later, frozen (SIGSTOP: a
paused VM, a stalled node); the standby must hold the Lease and have reconciled a change
made at that moment within 15 s, and the frozen leader, resumed (SIGCONT) with a change in
front of it that nobody reconciled yet, must exit without one write. Every deployment
converges in the end, and a leader stopped with SIGTERM hands the Lease back. Without the
election (one replica, or two that both reconcile) the Lease never names a holder and the
first wait fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import pdd_body
from helpers.operator_proc import (
    OPERATOR_USER,
    SECOND_OPERATOR_USER,
    OperatorProcess,
    install_crd,
)
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane
from pdd_operator.leadership import EXIT_LEADERSHIP_LOST

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
LEASE = "pdd-operator-leader"
DEPLOYMENTS = ("alpha", "beta")
TAKEOVER_LIMIT_S = 15.0


class Replica:
    """One operator process with leader election on, as its own user."""

    def __init__(self, proc: OperatorProcess, user: str) -> None:
        self.proc = proc
        self.user = user

    @property
    def identity(self) -> str:
        found = re.search(r"waiting for the Lease \S+ as (\S+)", self.proc.tail(200_000))
        return found.group(1) if found else ""

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.pid, sig)


@pytest.fixture
def start_replica(
    control_plane: LocalControlPlane, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> Iterator[Any]:
    install_crd(api_client)
    started: list[Replica] = []
    env = {"PDD_LEADER_ELECTION_LEASE": LEASE, "PDD_LEADER_ELECTION_NAMESPACE": namespace}

    def start(user: str) -> Replica:
        log = tmp_path / f"operator-{len(started)}.log"
        proc = OperatorProcess(control_plane.kubeconfig_for(user), log, 2.0, extra_env=env)
        replica = Replica(proc.start(), user)
        started.append(replica)
        wait_for(lambda: replica.identity, timeout=30, what=f"{log.name} to stand by")
        return replica

    yield start
    for replica in started:
        if replica.proc.proc is not None and replica.proc.proc.poll() is None:
            replica.signal(signal.SIGCONT)
        replica.proc.kill(signal.SIGKILL)


def test_a_standby_takes_over_and_a_resumed_leader_writes_nothing(
    start_replica: Any,
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    coordination = client.CoordinationV1Api(api_client)
    crs = client.CustomObjectsApi(api_client)

    def holder() -> str:
        lease = coordination.read_namespaced_lease(LEASE, namespace)
        return str(lease.spec.holder_identity or "")

    first = start_replica(OPERATOR_USER)
    wait_for(lambda: holder() == first.identity, timeout=30, what="the first replica to lead")
    second = start_replica(SECOND_OPERATOR_USER)
    for name in DEPLOYMENTS:
        crs.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, small(name, namespace)
        )
    converged(api_client, namespace, decode=1)
    # A standby reads the Lease and nothing else is written by it.
    assert writes(control_plane, SECOND_OPERATOR_USER, namespace) == []

    # The leader's node vanishes: no release, no last word.
    killed_at = time.monotonic()
    first.signal(signal.SIGKILL)
    scale_decode(crs, namespace, 2)
    wait_for(lambda: holder() == second.identity, timeout=30, what="the standby to take over")
    lease_after_kill = time.monotonic() - killed_at
    converged(api_client, namespace, decode=2)
    reconciled_after_kill = time.monotonic() - killed_at

    # The Deployment starts the killed one again; it waits as a standby.
    third = start_replica(OPERATOR_USER)
    frozen_at, frozen_wall = time.monotonic(), time.time()
    second.signal(signal.SIGSTOP)
    scale_decode(crs, namespace, 3)
    wait_for(lambda: holder() == third.identity, timeout=30, what="the standby to take over")
    lease_after_freeze = time.monotonic() - frozen_at
    converged(api_client, namespace, decode=3)
    reconciled_after_freeze = time.monotonic() - frozen_at

    # The frozen leader comes back with a change in front of it that the new leader has not
    # reconciled yet (the new leader is paused for that moment): without the fence it would
    # write. It must exit instead, before any write.
    third.signal(signal.SIGSTOP)
    try:
        scale_decode(crs, namespace, 1)
        second.signal(signal.SIGCONT)
        assert second.proc.proc is not None
        code = second.proc.proc.wait(timeout=20)
    finally:
        third.signal(signal.SIGCONT)
    assert code == EXIT_LEADERSHIP_LOST, second.proc.tail()
    assert "lost the leadership" in second.proc.tail()
    # Nothing lost: the new leader reconciles what came in meanwhile.
    converged(api_client, namespace, decode=1)
    assert holder() == third.identity

    took_over = lease_taken(control_plane, OPERATOR_USER, namespace, after=frozen_wall)
    second_writes = writes(control_plane, SECOND_OPERATOR_USER, namespace)
    assert [w for w in second_writes if w["resource"] != "leases"], "the second never led"
    late = [w for w in second_writes if w["at"] >= took_over and not refused_lease_write(w)]
    assert late == [], f"writes of the old leader after it lost the Lease: {late}"

    # A leader stopped on purpose (a rollout, a drain) releases the Lease on its way out, so
    # that a standby need not wait out the lease duration.
    third.proc.kill(signal.SIGTERM)
    assert third.proc.proc is not None and third.proc.proc.returncode == 0, third.proc.tail()
    assert holder() == ""

    with capsys.disabled():
        print(
            f"\nleader election: SIGKILL: Lease taken after {lease_after_kill:.1f}s, change "
            f"reconciled after {reconciled_after_kill:.1f}s; SIGSTOP: Lease taken after "
            f"{lease_after_freeze:.1f}s, change reconciled after {reconciled_after_freeze:.1f}s"
        )
    assert reconciled_after_kill < TAKEOVER_LIMIT_S
    assert reconciled_after_freeze < TAKEOVER_LIMIT_S


def small(name: str, namespace: str) -> dict[str, Any]:
    return pdd_body(
        name,
        namespace,
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 1, "gpusPerInstance": 1},
        topology={"placement": "none"},
        router={"enabled": False},
    )


def scale_decode(crs: client.CustomObjectsApi, namespace: str, replicas: int) -> None:
    for name in DEPLOYMENTS:
        patch = {"spec": {"decode": {"replicas": replicas}}}
        crs.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)


def converged(api: client.ApiClient, namespace: str, decode: int) -> None:
    """Every deployment's decode StatefulSet at `decode` replicas and its status written for
    its current generation."""
    apps, crs = client.AppsV1Api(api), client.CustomObjectsApi(api)

    def done() -> bool:
        for name in DEPLOYMENTS:
            body = crs.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            status = body.get("status") or {}
            if status.get("observedGeneration") != body["metadata"]["generation"]:
                return False
            sts = apps.read_namespaced_stateful_set(f"{name}-decode", namespace)
            if sts.spec.replicas != decode:
                return False
        return True

    wait_for(done, timeout=60, interval=0.1, what=f"every deployment at decode={decode}")


def writes(plane: LocalControlPlane, user: str, namespace: str) -> list[dict[str, Any]]:
    """The user's writes in the namespace, as the API server's audit log has them."""
    found = []
    with plane.audit_log.open(encoding="utf-8") as fh:
        for line in fh:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if (
                event.get("stage") == "ResponseComplete"
                and (event.get("user") or {}).get("username") == user
                and event.get("verb") in ("create", "update", "patch", "delete")
                and ref.get("namespace") == namespace
            ):
                found.append(
                    {
                        "verb": event["verb"],
                        "resource": ref.get("resource", ""),
                        "name": ref.get("name", ""),
                        "code": (event.get("responseStatus") or {}).get("code", 0),
                        "at": _timestamp(event["requestReceivedTimestamp"]),
                    }
                )
    return found


def lease_taken(plane: LocalControlPlane, user: str, namespace: str, after: float) -> float:
    """When the API server received the user's first successful write of the Lease after
    `after` (a standby writes the Lease only to take it over)."""
    taken = [
        w["at"]
        for w in writes(plane, user, namespace)
        if w["resource"] == "leases" and w["code"] < 300 and w["at"] > after
    ]
    assert taken, f"{user} never took the Lease over"
    return min(taken)


def refused_lease_write(write: dict[str, Any]) -> bool:
    """A renewal already on its way when the process froze, refused for its stale version
    (409): the optimistic write that makes the Lease safe, not a write the fence must stop."""
    return write["resource"] == "leases" and write["code"] == 409


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_standby_stops_at_once_when_its_pod_is_deleted(start_replica: Any) -> None:
    """SIGTERM (the pod deleted, or rolled by an upgrade) ends a standby cleanly within a
    second, whatever signal disposition its parent passed on: before, a standby whose parent
    ignored SIGTERM waited for the SIGKILL at the end of the grace period."""
    start_replica(OPERATOR_USER)
    standby = start_replica(SECOND_OPERATOR_USER)
    assert standby.proc.proc is not None
    wait_for(lambda: "is held by" in standby.proc.tail(), 30, what="the second to stand by")
    standby.signal(signal.SIGTERM)
    assert standby.proc.proc.wait(timeout=5) == 0
    assert "stopped (SIGTERM or SIGINT) before it led" in standby.proc.tail()
