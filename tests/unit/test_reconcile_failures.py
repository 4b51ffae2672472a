"""The Reconciler against the fake cluster: the sidecar token Secret is created again when it
was deleted, a Secret of its name that is not the deployment's is refused (and left as it
is), and a StatefulSet short of pods reports its controller's FailedCreate."""

from __future__ import annotations

import copy
from typing import Any

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster, forbidden, reconciler_for
from pdd_operator.api import names
from pdd_operator.reconcile import Reconciler

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


def reconciler(cluster: FakeCluster, token_recheck_s: float = 3600.0) -> Reconciler:
    rec = reconciler_for(cluster)
    rec.token_recheck_s = token_recheck_s
    rec.conflict_retry_seconds = 3600.0
    return rec


def condition(cluster: FakeCluster, type_: str) -> tuple[str, str, str]:
    for c in cluster.stored[KEY]["status"]["conditions"]:
        if c["type"] == type_:
            return c["status"], c["reason"], c["message"]
    raise AssertionError(f"no {type_} condition")


def created_secrets(cluster: FakeCluster) -> list[tuple[str, str, str]]:
    return [w for w in cluster.writes if w[:2] == ("create", "Secret")]


async def test_a_deleted_token_secret_is_created_again_at_the_next_look() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster, token_recheck_s=0.0)
    await rec.reconcile(KEY)
    first = cluster.objects[SECRET_KEY]
    assert first["metadata"]["ownerReferences"][0]["uid"] == UID

    del cluster.objects[SECRET_KEY]  # someone deletes it; nothing watches Secrets
    await rec.reconcile(KEY)
    again = cluster.objects[SECRET_KEY]
    assert again["metadata"]["ownerReferences"][0]["uid"] == UID
    assert again["stringData"] != first["stringData"]  # a new token, never the old value


PREFILL = ("apps/v1", "StatefulSet", "llama-prefill")


async def test_a_token_secret_found_missing_is_created_before_any_engine_is_written() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster, token_recheck_s=0.0)
    await rec.reconcile(KEY)
    del cluster.objects[SECRET_KEY]
    cluster.deleted_by_hand(NS, PREFILL)  # so this pass writes an engine too
    before = len(cluster.writes)

    await rec.reconcile(KEY)
    writes = cluster.writes[before:]
    # Its pods mount the Secret: created first, nothing planted under its name is mounted.
    assert writes.index(("create", "Secret", TOKEN)) < writes.index(
        ("apply", "StatefulSet", "llama-prefill")
    )


async def test_while_the_token_secret_cannot_be_created_the_engines_are_held() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster, token_recheck_s=0.0)
    await rec.reconcile(KEY)
    del cluster.objects[SECRET_KEY]
    cluster.deleted_by_hand(NS, PREFILL)

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


async def test_the_token_secret_is_looked_at_once_per_recheck_period() -> None:
    cluster = FakeCluster(body())
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    del cluster.objects[SECRET_KEY]
    await rec.reconcile(KEY)
    assert SECRET_KEY not in cluster.objects  # not looked at again yet
    # Created at once by the first pass (a new deployment's), and not looked at since.
    assert [r for r in cluster.reads if r == ("Secret", TOKEN)] == []
    assert created_secrets(cluster) == [("create", "Secret", TOKEN)]


async def test_a_planted_token_secret_is_refused_left_alone_and_holds_the_engines() -> None:
    cluster = FakeCluster(body())
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN, "namespace": NS, "uid": "planted", "resourceVersion": "3"},
        "stringData": {"token": "known"},
    }
    cluster.objects[SECRET_KEY] = copy.deepcopy(planted)
    await reconciler(cluster).reconcile(KEY)

    assert cluster.objects[SECRET_KEY] == planted
    # Tried once (a new deployment's Secret is created without a look first), refused as
    # taken, then looked at to name its owner.
    assert created_secrets(cluster) == [("create", "Secret", TOKEN)]
    assert ("Secret", TOKEN) in cluster.reads
    assert not [w for w in cluster.writes if w[1] == "StatefulSet"]
    status, reason, message = condition(cluster, "Stalled")
    assert (status, reason) == ("True", "TokenSecretConflict")
    assert f"{TOKEN} exists and this PDDeployment does not own it (owned by no owner)" in message
    assert condition(cluster, "Ready")[:2] == ("False", "TokenSecretConflict")


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
