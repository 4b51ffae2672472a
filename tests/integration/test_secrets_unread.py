"""The operator reads no Secret, on running pods: the local cluster's PodRuntime mounts Secret
volumes and resolves env references as a kubelet does, in the kubelet's words, and posts its
FailedMount Events; the engine is the reference engine (the one test double: no GPU here).

- The sidecar token Secret deleted: the first pod that cannot mount it has it back within
  seconds (the time is printed), status says what is wrong while it cannot be created, the
  running pods take the new token from their refreshed volume, and the deployment serves again.
- The model's token Secret missing: what the engine pods report is ModelReady=False
  ModelSecretMissing with the command that fixes it; once it exists, the pods start.
- Meanwhile the operator's user never asked the API server for a Secret (its audit log).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from helpers.operator_proc import OPERATOR_USER, OperatorProcess, operator_on
from helpers.running_pods import OwnNodes, ready_router_url, refengine_pdd, running_nodes
from helpers.traffic import complete
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator
from pdd_localcluster.runtime import PodRuntime
from pdd_operator.api import names

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NODES = OwnNodes("pdd.test/secrets-unread", ("unread-0",))


@pytest.fixture(scope="module")
def operator(
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    node_sim: NodeSimulator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """With the chart's resync period (300 s): nothing but a pod's report can bring a deleted
    token Secret back within seconds (before, a pass looked at it once per resync)."""
    log_dir = tmp_path_factory.mktemp("operator")
    with operator_on(control_plane, api_client, log_dir, resync_seconds=300.0) as proc:
        yield proc


@pytest.fixture(scope="module")
def runtime(
    control_plane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRuntime]:
    state = tmp_path_factory.mktemp("secrets-unread")
    with running_nodes(control_plane, state, NODES, "127.91") as rt:
        yield rt


def status(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return dict(obj.get("status", {}))


def condition(api: client.ApiClient, ns: str, name: str, type_: str) -> dict[str, Any]:
    found = status(api, ns, name).get("conditions", [])
    return next((c for c in found if c["type"] == type_), {})


def ready(api: client.ApiClient, ns: str, name: str) -> bool:
    return condition(api, ns, name, "Ready").get("status") == "True"


def serves(core: client.CoreV1Api, ns: str, name: str) -> bool:
    """A request through the router answered, its KV pulled from the prefill and verified."""
    try:
        url = ready_router_url(core, ns, name)
    except LookupError:
        return False
    answer = complete(url, "tiny", "an unread secret " * 20, timeout=20)
    return bool(answer.ok and answer.served.get("kv_verified") and answer.kv_bytes > 0)


def failed_mounts(core: client.CoreV1Api, ns: str, secret: str) -> list[Any]:
    events = core.list_namespaced_event(ns, field_selector="reason=FailedMount").items
    return [e for e in events if f'secret "{secret}" not found' in (e.message or "")]


def secret_exists(core: client.CoreV1Api, ns: str, name: str) -> bool:
    return any(s.metadata.name == name for s in core.list_namespaced_secret(ns).items)


def engine_pod(core: client.CoreV1Api, ns: str, name: str, role: str) -> str:
    selector = f"pdd.dev/deployment={name},pdd.dev/role={role}"
    return str(core.list_namespaced_pod(ns, label_selector=selector).items[0].metadata.name)


def test_a_deleted_token_secret_is_back_within_seconds_of_the_first_pod_that_cannot_mount_it(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    objects = client.CustomObjectsApi(api_client)
    created = objects.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, refengine_pdd("unread", "vllm", NODES, replicas=1)
    )
    token = names.token_secret_name("unread", created["metadata"]["uid"])
    wait_for(lambda: ready(api_client, namespace, "unread"), 240, what="Ready")
    assert wait_for(lambda: serves(core, namespace, "unread"), 60, what="a first request")

    # While the Secret cannot be created (a quota of no more Secrets), status says why.
    core.delete_namespaced_secret(token, namespace)
    quota = {"metadata": {"name": "no-secrets"}, "spec": {"hard": {"secrets": "0"}}}
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: core.read_namespaced_resource_quota("no-secrets", namespace).status.hard,
        30,
        what="the quota in force",
    )
    core.delete_namespaced_pod(engine_pod(core, namespace, "unread", "decode"), namespace)
    held = wait_for(
        lambda: (
            (c := condition(api_client, namespace, "unread", "Stalled")).get("reason")
            == "ApplyFailed"
            and c
        ),
        60,
        what="Stalled: the token Secret cannot be created",
    )
    assert "could not create the sidecar token Secret" in held["message"], held
    assert "exceeded quota" in held["message"], held
    assert f"{token} again (deleted: pod " in held["message"], held
    core.delete_namespaced_resource_quota("no-secrets", namespace)
    wait_for(lambda: secret_exists(core, namespace, token), 60, what="the token Secret again")
    wait_for(lambda: ready(api_client, namespace, "unread"), 120, what="Ready again")
    assert wait_for(lambda: serves(core, namespace, "unread"), 60, what="a request again")

    # Nothing in the way: how long from the first report to the Secret being there again.
    core.delete_namespaced_secret(token, namespace)
    core.delete_namespaced_pod(engine_pod(core, namespace, "unread", "prefill"), namespace)
    before = {e.metadata.uid for e in failed_mounts(core, namespace, token)}
    wait_for(
        lambda: {e.metadata.uid for e in failed_mounts(core, namespace, token)} - before,
        60,
        interval=0.05,
        what="a FailedMount of the token Secret",
    )
    reported = time.monotonic()
    wait_for(lambda: secret_exists(core, namespace, token), 30, interval=0.05, what="the Secret")
    took = time.monotonic() - reported
    print(f"\ntoken Secret created again {took:.2f} s after the first FailedMount was listed")
    assert took < 10, took
    recreated = [
        e
        for e in core.list_namespaced_event(namespace).items
        if e.reason == "TokenSecretRecreated" and token in (e.message or "")
    ]
    assert recreated, "no TokenSecretRecreated event"
    wait_for(lambda: ready(api_client, namespace, "unread"), 120, what="Ready at last")
    assert wait_for(lambda: serves(core, namespace, "unread"), 60, what="a last request")


def test_a_missing_model_secret_is_what_the_engine_pods_report(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    body = refengine_pdd("gated", "vllm", NODES, replicas=1)
    source = {"huggingFace": {"tokenSecretRef": {"name": "hf-token"}}}
    body["spec"]["model"]["source"] = source
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    missing = wait_for(
        lambda: (
            (c := condition(api_client, namespace, "gated", "ModelReady")).get("reason")
            == "ModelSecretMissing"
            and c
        ),
        120,
        what="ModelReady ModelSecretMissing",
    )
    assert missing["status"] == "False"
    assert f"kubectl -n {namespace} create secret generic hf-token" in missing["message"]
    reconciling = condition(api_client, namespace, "gated", "Reconciling")
    assert reconciling["message"].startswith("waiting for Secret hf-token"), reconciling

    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "hf-token"}, "stringData": {"HF_TOKEN": "hf_fake"}}
    )
    wait_for(lambda: ready(api_client, namespace, "gated"), 180, what="Ready")
    assert condition(api_client, namespace, "gated", "ModelReady")["status"] == "True"
    assert "hf_fake" not in operator.tail(2_000_000)


def test_the_operator_never_asked_for_a_secret(
    control_plane: LocalControlPlane, operator: OperatorProcess
) -> None:
    """After the two tests above (and whatever ran before in this session): no get, list or
    watch of Secrets by the operator's user in the API server's audit log."""
    reads = control_plane.reads_by(OPERATOR_USER, "secrets", ("get", "list", "watch"))
    assert reads == [], reads
