"""The echo of the operator's own apply, recognised on a real API server: the metadata-only
answer to a server-side apply carries the resourceVersion that the object's watch event then
shows, so that event asks for no pass, and someone else's later change does."""

from __future__ import annotations

from kubernetes import client

from pdd_operator.kube.client import KubeApi
from pdd_operator.kube.resources import kind_of
from pdd_operator.status.own_writes import OwnObjectWrites


def test_the_watch_brings_back_the_version_a_metadata_only_apply_returned(
    api_client: client.ApiClient, namespace: str
) -> None:
    kube = KubeApi(api_client, "pdd-operator-test")
    accounts = kind_of("v1", "ServiceAccount")
    path = accounts.path(namespace)
    since = str(kube.list_page(path, 1)["metadata"]["resourceVersion"])
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "echo", "namespace": namespace, "labels": {"a": "1"}},
    }
    answer = kube.apply(account, want_result=False)
    assert set(answer) <= {"apiVersion", "kind", "metadata"}  # no body beyond its metadata
    applies = OwnObjectWrites()
    applies.expect(accounts.plural, answer)

    client.CoreV1Api(api_client).patch_namespaced_service_account(
        "echo", namespace, {"metadata": {"labels": {"b": "2"}}}
    )
    echoes = []
    for event in kube.watch(path, since, 5):
        if event["type"] != "BOOKMARK" and event["object"]["metadata"]["name"] == "echo":
            echoes.append(applies.is_echo(accounts.plural, event["type"], event["object"]))
        if len(echoes) == 2:
            break
    assert echoes == [True, False]  # our apply, then someone else's label
