"""Stalled only where waiting cannot help, on the real API server: an apply that fails because
an admission webhook cannot be called (kube-apiserver answers 500 InternalError, "failed
calling webhook") is Reconciling=True (ApplyRetrying) with the server's words, never Stalled;
the operator tries again by itself, with backoff, and the deployment comes up once the webhook
is gone, without anyone touching the PDDeployment."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.factories import small_pdd_body
from helpers.operator_proc import OperatorProcess, install_crd
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NAME = "hook"
# Longer than a pass whose requests all fail takes (kube.client retries each a few times).
PASS_S = 5.0


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """An operator whose periodic resync is minutes away (the other modules' runs every 2 s):
    a pass that comes in this test's time is one the operator asked for by itself."""
    install_crd(api_client)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = OperatorProcess(kubeconfig, log, resync_seconds=600.0).start()
    yield proc
    proc.kill()


def conditions(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    body = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, NAME
    )
    return {c["type"]: c for c in body.get("status", {}).get("conditions", [])}


def unreachable_webhook(name: str, namespace: str) -> dict[str, Any]:
    """A webhook on Services of one namespace, at a loopback port nothing listens on, that
    must answer (failurePolicy Fail): every create or change of a Service there fails."""
    return {
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "unreachable.pdd.dev",
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["services"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 1,
            }
        ],
    }


def failed_passes(operator: OperatorProcess) -> int:
    return operator.tail(1_000_000).count(f"/{NAME}: could not apply children")


def services(api: client.ApiClient, namespace: str) -> list[str]:
    return [s.metadata.name for s in client.CoreV1Api(api).list_namespaced_service(namespace).items]


def test_a_webhook_that_cannot_be_called_is_retried_not_stalled(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    admission = client.AdmissionregistrationV1Api(api_client)
    webhook = f"unreachable-{namespace}"
    admission.create_validating_webhook_configuration(unreachable_webhook(webhook, namespace))
    try:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, small_pdd_body(NAME, namespace)
        )

        def retrying() -> dict[str, dict[str, Any]] | None:
            found = conditions(api_client, namespace)
            reconciling = found.get("Reconciling", {})
            ok = (reconciling.get("status"), reconciling.get("reason")) == ("True", "ApplyRetrying")
            return found if ok else None

        found = wait_for(retrying, 60, what="Reconciling=True ApplyRetrying")
        assert 'failed calling webhook "unreachable.pdd.dev"' in found["Reconciling"]["message"]
        assert (found["Stalled"]["status"], found["Stalled"]["reason"]) == ("False", "NotStalled")
        assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", "ApplyRetrying")
        assert services(api_client, namespace) == []
        # The passes that events asked for (the creation, kopf's own annotations) are over
        # before the webhook goes: each has retried its requests within it (a few seconds).
        wait_for(lambda: failed_passes(operator) >= 2, 30, what="two failed passes")
        time.sleep(PASS_S)
        assert services(api_client, namespace) == []
    finally:
        admission.delete_validating_webhook_configuration(webhook)

    # Nobody touches the PDDeployment, and the resync is minutes away: the operator's own
    # retry applies the Services.
    wait_for(lambda: services(api_client, namespace), 60, what="the Services applied")

    def recovered() -> dict[str, dict[str, Any]] | None:
        found = conditions(api_client, namespace)
        return found if found["Reconciling"]["reason"] != "ApplyRetrying" else None

    found = wait_for(recovered, 60, what="Reconciling no longer ApplyRetrying")
    assert found["Stalled"]["status"] == "False"
    assert found["Ready"]["reason"] != "ApplyRetrying"
