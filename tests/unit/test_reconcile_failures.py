"""The Reconciler against the fake cluster: the sidecar token Secret, which the operator may
create but never read, is created after the children its pods run against and before the
workloads, and again when a pod's kubelet reports it cannot mount it; one that existed while
the deployment had no children is refused (and left as it is), by a restarted operator too;
and a StatefulSet short of pods reports its controller's FailedCreate."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, forbidden, reconciler_for
from pdd_operator.api import names
from pdd_operator.reconcile import Reconciler
from pdd_operator.status.token import MountFailure

NS = "team-a"
KEY = (NS, "llama")
UID = "uid-llama"
TOKEN = names.token_secret_name("llama", UID)
SECRET_KEY = (NS, "v1", "Secret", TOKEN)


def body() -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(name="llama", uid=UID, resourceVersion="1")
    result["spec"]["topology"] = {"placement": "none"}
    return result


def reconciler(cluster: FakeCluster) -> Reconciler:
    rec = reconciler_for(cluster)
    rec.conflict_retry_seconds = 3600.0
    return rec


def condition(cluster: FakeCluster, type_: str) -> tuple[str, str, str]:
    for c in cluster.stored[KEY]["status"]["conditions"]:
        if c["type"] == type_:
            return c["status"], c["reason"], c["message"]
    raise AssertionError(f"no {type_} condition")


def created_secrets(cluster: FakeCluster) -> list[tuple[str, str, str]]:
    return [w for w in cluster.writes if w[:2] == ("create", "Secret")]


def kubelet_cannot_mount(cluster: FakeCluster, pod: str, when: str, count: int = 1) -> None:
    """A FailedMount report of the token Secret (a test double of a kubelet's Event)."""
    message = f'MountVolume.SetUp failed for volume "sidecar-token" : secret "{TOKEN}" not found'
    report = MountFailure(pod, when, message, f"event-{pod}/{count}/{when}")
    reports = cluster.mount_reports.setdefault((NS, TOKEN), [])
    reports[:] = [r for r in reports if r.pod != pod] + [report]


async def test_a_deleted_token_secret_is_created_again_when_a_pod_cannot_mount_it() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    first = cluster.objects[SECRET_KEY]
    assert first["metadata"]["ownerReferences"][0]["uid"] == UID

    del cluster.objects[SECRET_KEY]  # someone deletes it; the operator cannot see that
    await rec.reconcile(KEY)
    assert SECRET_KEY not in cluster.objects
    assert created_secrets(cluster) == [("create", "Secret", TOKEN)]  # no request per pass

    kubelet_cannot_mount(cluster, "llama-prefill-0", "2026-12-05T10:00:00Z")
    await rec.reconcile(KEY)
    again = cluster.objects[SECRET_KEY]
    assert again["metadata"]["ownerReferences"][0]["uid"] == UID
    assert again["stringData"] != first["stringData"]  # a new token, never the old value
    recreated = [e for e in cluster.events if e[1] == "TokenSecretRecreated"]
    assert recreated and recreated[0][0] == "Warning"
    assert "pod llama-prefill-0 could not mount it" in recreated[0][2]

    await rec.reconcile(KEY)  # the same report is answered once
    assert len(created_secrets(cluster)) == 2
    kubelet_cannot_mount(cluster, "llama-prefill-0", "2026-12-05T10:00:00Z", count=2)
    await rec.reconcile(KEY)  # a new report: created again, or found (409) and kept
    assert len(created_secrets(cluster)) == 3
    assert cluster.objects[SECRET_KEY] == again


PREFILL = ("apps/v1", "StatefulSet", "llama-prefill")


async def test_a_token_secret_reported_missing_is_created_before_any_engine_is_written() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    del cluster.objects[SECRET_KEY]
    cluster.deleted_by_hand(NS, PREFILL)  # so this pass writes an engine too
    kubelet_cannot_mount(cluster, "llama-decode-0", "2026-12-05T10:00:00Z")
    before = len(cluster.writes)

    await rec.reconcile(KEY)
    writes = cluster.writes[before:]
    # Its pods mount the Secret: created first, nothing planted under its name is mounted.
    assert writes.index(("create", "Secret", TOKEN)) < writes.index(
        ("apply", "StatefulSet", "llama-prefill")
    )


async def test_while_the_token_secret_cannot_be_created_the_engines_are_held() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    del cluster.objects[SECRET_KEY]
    cluster.deleted_by_hand(NS, PREFILL)
    kubelet_cannot_mount(cluster, "llama-decode-0", "2026-12-05T10:00:00Z")

    def refuse(obj: dict[str, Any]) -> bool:
        raise forbidden("secrets is forbidden: quota exceeded")

    cluster.create_if_absent = refuse  # type: ignore[method-assign]
    before = len(cluster.writes)
    await rec.reconcile(KEY)

    assert not [w for w in cluster.writes[before:] if w[1] == "StatefulSet"]
    status, reason, message = condition(cluster, "Stalled")
    assert (status, reason) == ("True", "ApplyFailed")
    assert "could not create the sidecar token Secret" in message
    assert "quota exceeded" in message


async def test_an_existing_token_secret_is_ours_after_a_restart_once_there_are_children() -> None:
    cluster = FakeCluster(body())
    await reconciler(cluster).reconcile(KEY)
    token = copy.deepcopy(cluster.objects[SECRET_KEY])

    await reconciler(cluster).reconcile(KEY)  # a new operator process: the create answers 409
    assert cluster.objects[SECRET_KEY] == token
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")
    assert [r for r in cluster.reads if r[0] == "Secret"] == []  # never read


async def test_the_token_secret_is_created_after_what_the_pods_run_against_before_them() -> None:
    """Its maker is told by the children beside it (reconcile/token.py): a first pass applies
    the Services, ConfigMaps and accounts, creates the Secret, then applies the workloads."""
    cluster = FakeCluster(body())
    await reconciler(cluster).reconcile(KEY)
    order = [(verb, kind) for verb, kind, _ in cluster.writes if verb in ("apply", "create")]
    token_at = order.index(("create", "Secret"))
    kinds_before = {kind for _, kind in order[:token_at]}
    assert {"Service", "ServiceAccount", "Role", "RoleBinding"} <= kinds_before
    assert not kinds_before & {"StatefulSet", "Deployment"}
    assert {"StatefulSet", "Deployment"} <= {kind for _, kind in order[token_at:]}


async def test_an_operator_killed_after_creating_the_token_leaves_its_successor_no_conflict() -> (
    None
):
    """The first operator is killed right after it created the Secret (here: every write
    after the create fails); a new process finds the Secret (409) beside the children."""
    cluster = FakeCluster(body())
    original_apply, original_create = cluster.apply, cluster.create_if_absent
    killed = []

    def create_then_die(obj: dict[str, Any]) -> bool:
        created = original_create(obj)
        killed.append(True)
        return created

    def apply_unless_dead(obj: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if killed:
            raise ConnectionError("the operator was killed")
        return original_apply(obj, **kwargs)

    cluster.create_if_absent = create_then_die  # type: ignore[method-assign]
    cluster.apply = apply_unless_dead  # type: ignore[method-assign]
    await reconciler(cluster).reconcile(KEY)
    assert SECRET_KEY in cluster.objects
    assert (NS, "apps/v1", "StatefulSet", "llama-prefill") not in cluster.objects

    cluster.create_if_absent = original_create  # type: ignore[method-assign]
    cluster.apply = original_apply  # type: ignore[method-assign]
    await reconciler(cluster).reconcile(KEY)
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")
    assert (NS, "apps/v1", "StatefulSet", "llama-prefill") in cluster.objects


async def test_a_planted_token_secret_is_refused_left_alone_and_holds_the_engines() -> None:
    cluster = FakeCluster(body())
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN, "namespace": NS, "uid": "planted", "resourceVersion": "3"},
        "stringData": {"token": "known"},
    }
    cluster.objects[SECRET_KEY] = copy.deepcopy(planted)
    rec = reconciler(cluster)
    await rec.reconcile(KEY)

    assert cluster.objects[SECRET_KEY] == planted
    assert created_secrets(cluster) == [("create", "Secret", TOKEN)]  # answered 409
    assert [r for r in cluster.reads if r[0] == "Secret"] == []  # never read
    assert not [w for w in cluster.writes if w[1] == "StatefulSet"]
    status, reason, message = condition(cluster, "Stalled")
    assert (status, reason) == ("True", "TokenSecretConflict")
    assert f"{TOKEN} existed before this PDDeployment's first engine pod" in message
    assert condition(cluster, "Ready")[:2] == ("False", "TokenSecretConflict")

    await rec.reconcile(KEY)  # its other children exist now: still not taken for ours
    assert condition(cluster, "Stalled")[:2] == ("True", "TokenSecretConflict")
    await reconciler(cluster).reconcile(KEY)  # nor by a new process: the status says so
    assert condition(cluster, "Stalled")[:2] == ("True", "TokenSecretConflict")
    del cluster.objects[SECRET_KEY]  # the user deletes it: the operator makes its own
    await rec.reconcile(KEY)
    assert cluster.objects[SECRET_KEY]["metadata"]["ownerReferences"][0]["uid"] == UID
    assert [w for w in cluster.writes if w[1] == "StatefulSet"]


async def test_a_refused_statefulset_reports_its_controllers_answer() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    prefill = cluster.objects[(NS, "apps/v1", "StatefulSet", "llama-prefill")]
    cluster.object_events[prefill["metadata"]["uid"]] = [
        {
            "reason": "FailedCreate",
            "message": "create Pod llama-prefill-0 in StatefulSet llama-prefill failed error: "
            'pods "llama-prefill-0" is forbidden: exceeded quota: gpus',
            "lastTimestamp": "2026-01-01T00:00:05Z",
        }
    ]
    await rec.reconcile(KEY)
    status, reason, message = condition(cluster, "Degraded")
    assert (status, reason) == ("True", "PodsRefused")
    assert message == (
        'pods of llama-prefill cannot be created: pods "llama-prefill-0" is forbidden: '
        "exceeded quota: gpus"
    )

    cluster.workloads_ready(NS)  # the quota was raised: every pod exists
    await rec.reconcile(KEY)
    assert condition(cluster, "Degraded")[:2] == ("False", "AsExpected")


async def test_a_planted_token_secret_stays_refused_when_a_taken_name_blocks_too() -> None:
    """The status tells the token's conflict first whatever else blocks the deployment: a
    restarted operator reads it there, and must not take the planted Secret for its own once
    the other name is free."""
    cluster = FakeCluster(body())
    cluster.objects[SECRET_KEY] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN, "namespace": NS, "uid": "planted", "resourceVersion": "3"},
    }
    taken = (NS, "networking.k8s.io/v1", "NetworkPolicy", "llama-router")
    cluster.objects[taken] = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "llama-router", "namespace": NS, "uid": "theirs"},
    }
    await reconciler(cluster).reconcile(KEY)
    status, reason, message = condition(cluster, "Stalled")
    assert (status, reason) == ("True", "TokenSecretConflict")
    assert "NetworkPolicy llama-router" in message  # the other trouble is told as well

    del cluster.objects[taken]
    await reconciler(cluster).reconcile(KEY)  # a new process
    assert condition(cluster, "Stalled")[:2] == ("True", "TokenSecretConflict")
    assert not [w for w in cluster.writes if w[1] == "StatefulSet"]


async def test_no_token_secret_is_created_while_the_children_before_it_cannot_be_written() -> None:
    """A Secret without children beside it would be taken for someone else's after a
    restart: it waits for a pass that could write them."""
    cluster = FakeCluster(body())
    cluster.apply_error = forbidden("denied by a webhook")
    await reconciler(cluster).reconcile(KEY)
    assert SECRET_KEY not in cluster.objects
    assert condition(cluster, "Stalled")[:2] == ("True", "ApplyFailed")

    cluster.apply_error = None
    await reconciler(cluster).reconcile(KEY)  # a new process, once the webhook admits them
    assert cluster.objects[SECRET_KEY]["metadata"]["ownerReferences"][0]["uid"] == UID
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")


async def test_a_planted_token_secret_is_logged_once_while_it_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The conflict is a log line when found, not one per pass: the status keeps saying it."""
    cluster = FakeCluster(body())
    cluster.objects[SECRET_KEY] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN, "namespace": NS, "uid": "planted", "resourceVersion": "3"},
    }
    rec = reconciler(cluster)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            await rec.reconcile(KEY)
    told = [r for r in caplog.records if f"{TOKEN} existed before" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in told]
    assert condition(cluster, "Stalled")[:2] == ("True", "TokenSecretConflict")
