"""The chart against the real API server: every rendered object passes a server-side dry-run,
and `helm install` / `helm upgrade` / `helm uninstall` really create, change and remove them
(the CRD stays: Helm never deletes CRDs from crds/, so PDDeployments survive an uninstall)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from .support import CHART, Helm, apply, ensure_namespace, exists, kinds
from .test_chart_lint import VALUE_SETS

CRD_NAME = "pddeployments.pdd.dev"
RELEASE, NAMESPACE = "pdd", "pdd-helm"
# The upgrade changes something in every kind of object the chart renders.
UPGRADE_VALUES = [
    "--set", "agent.enabled=false",
    "--set", "watchNamespaces={team-a}",
    "--set", "logLevel=debug",
    "--set", "resyncSeconds=60",
    "--set", "image.tag=0.1.1",
    "--set", "metrics.service.enabled=false",
]  # fmt: skip


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendered_objects_pass_server_side_dry_run(
    helm: Helm, api_client: client.ApiClient, dynamic: DynamicClient, values: list[str]
) -> None:
    namespace = "pdd-dryrun"
    docs = helm.template("--include-crds", *values, namespace=namespace)
    for ns in [namespace, "team-a", "team-b"]:
        ensure_namespace(api_client, ns)
    for doc in docs:
        if doc["kind"] in ("ServiceMonitor", "PodMonitor"):
            continue  # no Prometheus Operator CRD here; rendered only where it exists
        # dryRun=All: admission, schema validation and defaulting run; nothing is stored.
        accepted = apply(dynamic, doc, dry_run=True)
        assert accepted["metadata"]["name"] == doc["metadata"]["name"]
    stored = [d for d in docs if d["kind"] != "CustomResourceDefinition" and exists(dynamic, d)]
    assert not stored, "a dry-run stored objects"


# Values the schema refuses (test_chart_lint.REJECTED), rendered without it, and the kind of
# object the API server then refuses: what the schema spares a user in the middle of an upgrade.
UNCHECKED: dict[str, tuple[list[str], str]] = {
    "Deny with Warn": (
        ["--set", "podTemplatePolicy.validationActions={Deny,Warn}"],
        "ValidatingAdmissionPolicyBinding",
    ),
    "a name with capitals": (["--set", "nameOverride=Bad_Name"], "Deployment"),
    "a full name with a dot": (["--set", "fullnameOverride=pdd.operator"], "Service"),
    "a full name starting with a digit": (["--set", "fullnameOverride=1pdd"], "Service"),
}


@pytest.mark.parametrize(("values", "kind"), UNCHECKED.values(), ids=UNCHECKED.keys())
def test_what_the_schema_refuses_the_api_server_refuses(
    helm: Helm, api_client: client.ApiClient, dynamic: DynamicClient, values: list[str], kind: str
) -> None:
    namespace = "pdd-unchecked"
    ensure_namespace(api_client, namespace)
    docs = helm.template("--skip-schema-validation", *values, namespace=namespace)
    refused = {}
    for doc in docs:
        try:
            apply(dynamic, doc, dry_run=True)
        except ApiException as err:
            refused[doc["kind"]] = (err.status, err.reason)
    assert refused.get(kind) == (422, "Unprocessable Entity"), refused


def test_install_upgrade_uninstall(
    cluster_helm: Helm, api_client: client.ApiClient, dynamic: DynamicClient
) -> None:
    _delete_crd(api_client)  # so that this test sees the chart itself create it
    ensure_namespace(api_client, "team-a")  # upgrade's watchNamespaces: Roles go there

    install = cluster_helm.run(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace"
    )
    # NOTES.txt rendered with this release's names.
    assert "rollout status deployment/pdd-pdd-operator" in install.stdout, install.stdout
    installed = _release_objects(cluster_helm)
    assert {"Deployment", "DaemonSet", "Service", "ClusterRole"} <= set(kinds(installed))
    for obj in installed:
        assert exists(dynamic, obj), f"{obj['kind']}/{obj['metadata']['name']} missing"
    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(CRD_NAME)
    assert crd.spec.versions[0].name == "v1alpha1"
    deployment = _deployment(api_client)
    assert deployment.spec.strategy.type == "RollingUpdate"
    assert deployment.spec.replicas == 2
    assert deployment.spec.template.spec.service_account_name == "pdd-pdd-operator"

    cluster_helm.run("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, *UPGRADE_VALUES)
    upgraded = _release_objects(cluster_helm)
    for obj in upgraded:
        assert exists(dynamic, obj), f"{obj['kind']}/{obj['metadata']['name']} missing"
    removed = [o for o in installed if _key(o) not in {_key(u) for u in upgraded}]
    assert {"DaemonSet", "Service"} <= set(kinds(removed))
    for obj in removed:
        assert not exists(dynamic, obj), f"{obj['kind']}/{obj['metadata']['name']} not removed"
    container = _deployment(api_client).spec.template.spec.containers[0]
    assert container.image == "ghcr.io/pdd-dev/pdd-operator:0.1.1"
    assert {"--namespace=team-a", "--verbose", "--resync-seconds=60"} <= set(container.args)
    role = client.RbacAuthorizationV1Api(api_client).read_namespaced_role(
        "pdd-pdd-operator", "team-a"
    )
    assert any("pddeployments" in rule.resources for rule in role.rules)
    status = yaml.safe_load(
        cluster_helm.run("status", RELEASE, "-n", NAMESPACE, "-o", "yaml").stdout
    )
    assert status["info"]["status"] == "deployed" and status["version"] == 2

    cluster_helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "60s")
    left = [o for o in upgraded if exists(dynamic, o)]
    assert not left, [f"{o['kind']}/{o['metadata']['name']}" for o in left]
    # Helm never deletes CRDs from crds/: deleting one would delete every PDDeployment.
    client.ApiextensionsV1Api(api_client).read_custom_resource_definition(CRD_NAME)


def _release_objects(helm: Helm) -> list[dict[str, Any]]:
    manifest = helm.run("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def _deployment(api: client.ApiClient) -> client.V1Deployment:
    return client.AppsV1Api(api).read_namespaced_deployment("pdd-pdd-operator", NAMESPACE)


def _key(obj: dict[str, Any]) -> tuple[str, str, str | None]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


def _delete_crd(api: client.ApiClient, timeout: float = 30) -> None:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.delete_custom_resource_definition(CRD_NAME)
    except ApiException as err:
        if err.status == 404:
            return
        raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ext.read_custom_resource_definition(CRD_NAME)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        time.sleep(0.2)
    raise AssertionError(f"CRD {CRD_NAME} still there after {timeout}s")
