"""The Reconciler and the model's prerequisites, against the in-memory cluster of
helpers.fake_cluster: the engine StatefulSets wait for a missing claim, everything else is
applied, another pass comes by itself, and running engines are never taken away. A missing
Secret is never looked up: the engine pods' kubelets report it, and the engines run."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from helpers.factories import BASE_BODY
from helpers.fake_cluster import FakeCluster
from pdd_operator.reconcile import Reconciler
from pdd_operator.rendering.context import OperatorSettings
from pdd_operator.status.compute import PodProblem
from pdd_operator.status.model import CONFIG_ERROR
from pdd_operator.status.observe import PodSummary

NS = "team-a"
KEY = (NS, "llama")
STATEFULSETS = {("StatefulSet", "llama-prefill"), ("StatefulSet", "llama-decode")}
TOKEN_SOURCE = {"huggingFace": {"tokenSecretRef": {"name": "hf-token"}}}


def body(source: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(BASE_BODY)
    result["metadata"].update(uid="uid-llama", resourceVersion="1")
    result["spec"]["topology"] = {"placement": "none"}
    result["spec"]["model"] = {**result["spec"]["model"], "source": source}
    return result


def reconciler(cluster: FakeCluster, retry: tuple[float, float] = (60.0, 60.0)) -> Reconciler:
    return Reconciler(cluster, cluster, OperatorSettings(), cluster.emit, model_retry=retry)


def applied(cluster: FakeCluster) -> set[tuple[str, str]]:
    return {(kind, name) for verb, kind, name in cluster.writes if verb == "apply"}


def condition(cluster: FakeCluster, type_: str) -> tuple[str, str, str]:
    found = next(c for c in cluster.stored[KEY]["status"]["conditions"] if c["type"] == type_)
    return found["status"], found["reason"], found["message"]


def kubelet_says(cluster: FakeCluster, message: str | None) -> None:
    """The engine pods as their kubelets report them (a test double of the kubelet: a
    container that cannot resolve its env waits in CreateContainerConfigError)."""
    problem = None
    if message is not None:
        problem = PodProblem(
            "llama-prefill-0", "prefill", CONFIG_ERROR, f"container engine: {message}"
        )
    pod = PodSummary("llama-prefill-0", "uid-p0", "prefill", "node-a", False, "", problem)
    cluster.pods_of[KEY] = [pod]


SECRET_MISSING = 'secret "hf-token" not found'


async def test_a_secret_the_pods_report_missing_says_what_to_create_and_holds_nothing() -> None:
    cluster = FakeCluster(body(TOKEN_SOURCE))
    kubelet_says(cluster, SECRET_MISSING)
    await reconciler(cluster).reconcile(KEY)

    assert applied(cluster) >= STATEFULSETS  # its pods are what tells
    assert ("Deployment", "llama-router") in applied(cluster)
    status, reason, message = condition(cluster, "ModelReady")
    assert (status, reason) == ("False", "ModelSecretMissing")
    assert "create secret generic hf-token" in message
    assert condition(cluster, "Ready")[:2] == ("False", "ModelSecretMissing")
    assert ("Warning", "ModelSecretMissing", message) in cluster.events


async def test_no_secret_is_ever_read() -> None:
    cluster = FakeCluster(body(TOKEN_SOURCE))
    kubelet_says(cluster, SECRET_MISSING)
    await reconciler(cluster).reconcile(KEY)
    assert [r for r in cluster.reads if r[0] == "Secret"] == []


async def test_a_key_the_secret_lacks_is_named() -> None:
    cluster = FakeCluster(body(TOKEN_SOURCE))
    kubelet_says(cluster, "couldn't find key HF_TOKEN in Secret team-a/hf-token")
    await reconciler(cluster).reconcile(KEY)
    status, reason, message = condition(cluster, "ModelReady")
    assert (status, reason) == ("False", "ModelSecretKeyMissing")
    assert "has no key HF_TOKEN" in message


async def test_another_secrets_report_is_not_the_models() -> None:
    cluster = FakeCluster(body(TOKEN_SOURCE))
    kubelet_says(cluster, 'secret "hf-token-old" not found')
    await reconciler(cluster).reconcile(KEY)
    assert condition(cluster, "ModelReady")[:2] == ("True", "ModelAvailable")


async def test_the_condition_clears_once_the_pods_start() -> None:
    cluster = FakeCluster(body(TOKEN_SOURCE))
    rec = reconciler(cluster)
    kubelet_says(cluster, SECRET_MISSING)
    await rec.reconcile(KEY)
    kubelet_says(cluster, None)  # created: the kubelet starts the container
    await rec.reconcile(KEY)
    assert condition(cluster, "ModelReady")[:2] == ("True", "ModelAvailable")
    assert any(e[:2] == ("Normal", "ModelAvailable") for e in cluster.events)


async def test_a_missing_prerequisite_brings_another_pass_by_itself() -> None:
    """Nothing watches Secrets: the reconciler asks again, soon, without any event."""
    cluster = FakeCluster(body({"pvc": {"claimName": "llama-70b"}}))
    rec = reconciler(cluster, retry=(0.01, 0.05))
    await rec.reconcile(KEY)
    assert condition(cluster, "ModelReady")[1] == "ModelPVCMissing"
    cluster.pvcs[(NS, "llama-70b")] = {
        "spec": {"accessModes": ["ReadOnlyMany"]},
        "status": {"phase": "Bound", "accessModes": ["ReadOnlyMany"]},
    }
    for _ in range(200):
        if condition(cluster, "ModelReady")[0] == "True":
            break
        await asyncio.sleep(0.01)
    assert condition(cluster, "ModelReady")[:2] == ("True", "ModelAvailable")
    assert applied(cluster) >= STATEFULSETS


async def test_a_secret_reported_missing_holds_no_change_of_the_engines() -> None:
    cluster = FakeCluster(body(TOKEN_SOURCE))
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    kubelet_says(cluster, SECRET_MISSING)
    cluster.update_spec(KEY, {"prefill": {"replicas": 3}})
    writes = len(cluster.writes)
    await rec.reconcile(KEY)
    verbs = {(verb, kind) for verb, kind, _ in cluster.writes[writes:]}
    assert ("apply", "StatefulSet") in verbs and ("delete", "StatefulSet") not in verbs
    assert condition(cluster, "ModelReady")[1] == "ModelSecretMissing"


async def test_a_failed_lookup_does_not_hold_the_engines() -> None:
    cluster = FakeCluster(body({"huggingFace": {"cache": {"claimName": "hf"}}}))
    cluster.read_error = RuntimeError("connection refused")
    await reconciler(cluster).reconcile(KEY)
    assert applied(cluster) >= STATEFULSETS
    assert condition(cluster, "ModelReady")[:2] == ("Unknown", "ModelCheckFailed")


async def test_the_default_source_looks_nothing_up() -> None:
    cluster = FakeCluster(body({"huggingFace": {}}))
    await reconciler(cluster).reconcile(KEY)
    # The model's look-ups are (kind, namespace, name); the owner look-up of the operator's
    # own sidecar token Secret is (kind, name) and not the model's.
    model_reads = [r for r in cluster.reads if len(r) == 3]
    assert [r for r in model_reads if r[0] in ("Secret", "PersistentVolumeClaim")] == []
    assert applied(cluster) >= STATEFULSETS


async def test_a_missing_secret_is_awaited_and_the_wait_survives_a_restart() -> None:
    """An ExternalSecret may create it seconds later: Reconciling, not Stalled, and the time
    the wait began is in status, so an operator restarted meanwhile counts from it too."""
    cluster = FakeCluster(body(TOKEN_SOURCE))
    kubelet_says(cluster, SECRET_MISSING)
    await reconciler(cluster).reconcile(KEY)
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")
    status, reason, message = condition(cluster, "Reconciling")
    assert (status, reason) == ("True", "ModelSecretMissing")
    assert message.startswith("waiting for Secret hf-token (missing since ")
    since = cluster.stored[KEY]["status"]["waitingSince"]
    assert since

    cluster.deliver_pdd_watch()
    await reconciler(cluster).reconcile(KEY)  # a new operator process
    assert cluster.stored[KEY]["status"]["waitingSince"] == since


async def test_a_secret_missing_past_the_grace_period_is_stalled_until_it_exists() -> None:
    old = copy.deepcopy(body(TOKEN_SOURCE))
    old["status"] = {"observedGeneration": 3, "waitingSince": "2026-01-01T00:00:00Z"}
    cluster = FakeCluster(old)
    kubelet_says(cluster, SECRET_MISSING)
    rec = reconciler(cluster)
    await rec.reconcile(KEY)
    assert condition(cluster, "Stalled")[:2] == ("True", "ModelSecretMissing")
    assert condition(cluster, "Reconciling")[0] == "False"

    kubelet_says(cluster, None)  # the fix: the engines start, nothing is stalled
    cluster.deliver_pdd_watch()
    await rec.reconcile(KEY)
    assert condition(cluster, "Stalled")[:2] == ("False", "NotStalled")
    assert cluster.stored[KEY]["status"]["waitingSince"] == ""
    assert applied(cluster) >= STATEFULSETS
