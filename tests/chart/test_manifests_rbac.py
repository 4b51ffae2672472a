"""`manifests/` on the real API server, and the operator's RBAC proven both ways.

Sufficient: after `kubectl apply -k manifests/` (server-side apply of the same files), the real
operator process, authenticated with a TokenRequest token of the `pdd-system/pdd-operator`
ServiceAccount (what its pod gets), reconciles a PDDeployment: StatefulSets, Services, the
router, the sidecars' Role/RoleBinding (RBAC refuses to grant what the granter lacks), the token
Secret (create only) and the status write, with no request refused.

Tight: with the same token, reading, listing and watching Secrets is refused (403) cluster-wide
and in a namespace (the operator only creates Secrets), and an access review lists what else it
must not do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from helpers.factories import pdd_body
from helpers.operator_proc import OperatorProcess
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane

from .support import (
    access,
    apply,
    ensure_namespace,
    exists,
    manifest_documents,
    service_account_kubeconfig,
    wait_crd_established,
)

OPERATOR_NS, OPERATOR_SA, AGENT_SA = "pdd-system", "pdd-operator", "pdd-operator-topology-agent"
LEASE = "pdd-operator-leader"  # the leader election's, in OPERATOR_NS
APP_NS = "rbac-proof"
GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"


@pytest.fixture(scope="module")
def applied_manifests(api_client: client.ApiClient, dynamic: DynamicClient) -> list[dict[str, Any]]:
    docs = manifest_documents()
    for doc in docs:
        apply(dynamic, doc)
        if doc["kind"] == "CustomResourceDefinition":
            wait_crd_established(api_client, doc["metadata"]["name"])
    return docs


@pytest.fixture(scope="module")
def operator_kubeconfig(
    applied_manifests: list[dict[str, Any]],
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    path = tmp_path_factory.mktemp("operator-sa") / "kubeconfig"
    return service_account_kubeconfig(control_plane, api_client, OPERATOR_NS, OPERATOR_SA, path)


@pytest.fixture(scope="module")
def operator_api(operator_kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(operator_kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="module")
def operator(
    applied_manifests: list[dict[str, Any]],
    operator_kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The operator with the leader election the manifests' Deployment configures: it must
    win its Lease with the Role the manifests grant before it reconciles anything."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    env = election_env(applied_manifests)
    proc = OperatorProcess(operator_kubeconfig, log, resync_seconds=5.0, extra_env=env).start()
    yield proc
    proc.kill()


def election_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The Deployment's --leader-election-* flags, as the variables OperatorProcess passes."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--leader"))
    return {
        "PDD_LEADER_ELECTION_LEASE": flags["leader-election-lease"],
        "PDD_LEADER_ELECTION_NAMESPACE": flags["leader-election-namespace"],
    }


def test_every_manifest_object_is_stored(
    applied_manifests: list[dict[str, Any]], dynamic: DynamicClient
) -> None:
    kinds = {d["kind"] for d in applied_manifests}
    assert {"Namespace", "CustomResourceDefinition", "Deployment", "DaemonSet"} <= kinds
    for doc in applied_manifests:
        assert exists(dynamic, doc), f"{doc['kind']}/{doc['metadata']['name']}"


def test_operator_with_its_service_account_reconciles(
    operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    ensure_namespace(api_client, APP_NS)
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, APP_NS, PLURAL, small_pddeployment("llama")
    )
    # One reconcile pass applies every child, creates the token Secret, then writes status:
    # once status says generation 1 was observed, the pass is complete.
    try:
        wait_for(
            lambda: observed_generation(api_client, "llama") == 1,
            timeout=60,
            what="status.observedGeneration of rbac-proof/llama",
        )
    except AssertionError as err:
        pytest.fail(f"{err}\noperator log:\n{operator.tail()}")
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    for role in ("prefill", "decode"):
        sts = apps.read_namespaced_stateful_set(f"llama-{role}", APP_NS)
        assert sts.metadata.owner_references[0].kind == "PDDeployment"
    apps.read_namespaced_deployment("llama-router", APP_NS)
    core.read_namespaced_service("llama-prefill", APP_NS)
    # Granting pod discovery to the sidecars needs the operator to hold it itself.
    roles = client.RbacAuthorizationV1Api(api_client).list_namespaced_role(APP_NS).items
    assert any(
        "pods" in rule.resources and "watch" in rule.verbs and not rule.resource_names
        for role in roles
        for rule in role.rules
    )
    # The token Secret: created (the operator may create Secrets and get one by name).
    secrets = core.list_namespaced_secret(APP_NS).items
    assert [s for s in secrets if s.metadata.owner_references], "no token Secret created"
    # Condition transitions become Events (kopf posts them in the background).
    wait_for(
        lambda: [
            e
            for e in core.list_namespaced_event(APP_NS).items
            if e.involved_object.kind == "PDDeployment" and e.involved_object.name == "llama"
        ],
        timeout=30,
        what="an Event about rbac-proof/llama",
    )
    assert "Forbidden" not in operator.tail(200_000), operator.tail()
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(LEASE, OPERATOR_NS)
    assert lease.spec.holder_identity, "the operator reconciled without holding its Lease"


def test_operator_with_its_service_account_checks_the_model_source(
    operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """The lookup of the model's cache claim is allowed: a missing one is reported as missing
    (a 404), not as a check that failed (a 403). The token Secret is not looked up at all."""
    ensure_namespace(api_client, APP_NS)
    source = {"huggingFace": {"tokenSecretRef": {"name": "hf-token"}, "cache": {"claimName": "hf"}}}
    body = small_pddeployment("gated")
    body["spec"]["model"]["source"] = source
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, APP_NS, PLURAL, body
    )
    try:
        wait_for(
            lambda: model_ready_reason(api_client, "gated") == "ModelPVCMissing",
            timeout=60,
            what="ModelReady ModelPVCMissing of rbac-proof/gated",
        )
    except AssertionError as err:
        pytest.fail(f"{err}\noperator log:\n{operator.tail()}")
    assert "Forbidden" not in operator.tail(200_000), operator.tail()


def model_ready_reason(api: client.ApiClient, name: str) -> str:
    body = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, APP_NS, PLURAL, name
    )
    conditions = body.get("status", {}).get("conditions", [])
    return next((c["reason"] for c in conditions if c["type"] == "ModelReady"), "")


def test_operator_identity_cannot_list_or_watch_secrets(
    operator_api: client.ApiClient, api_client: client.ApiClient
) -> None:
    ensure_namespace(api_client, APP_NS)
    core = client.CoreV1Api(operator_api)
    refused = [
        lambda: core.list_secret_for_all_namespaces(),
        lambda: core.list_namespaced_secret(APP_NS),
        lambda: core.list_namespaced_secret(OPERATOR_NS),
        lambda: core.list_namespaced_secret(APP_NS, watch=True, timeout_seconds=1),
    ]
    for call in refused:
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403, err.value
    # Not even a lookup by name: a missing Secret is a 403 as much as an existing one.
    for name in ("no-such-secret", "hf-token"):
        with pytest.raises(ApiException) as err:
            core.read_namespaced_secret(name, APP_NS)
        assert err.value.status == 403, err.value
    # Sanity: the same credentials work for what the operator is granted.
    assert core.list_node().items is not None


OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
AGENT_USER = f"system:serviceaccount:{OPERATOR_NS}:{AGENT_SA}"
# (user, verb, group, resource, subresource, namespace, allowed)
ACCESS = [
    (OPERATOR_USER, "create", "", "secrets", "", APP_NS, True),
    (OPERATOR_USER, "patch", GROUP, PLURAL, "status", APP_NS, True),
    (OPERATOR_USER, "patch", "apps", "statefulsets", "", APP_NS, True),
    (OPERATOR_USER, "create", "rbac.authorization.k8s.io", "rolebindings", "", APP_NS, True),
    (OPERATOR_USER, "watch", "", "nodes", "", "", True),
    (OPERATOR_USER, "list", "apps", "replicasets", "", "", True),  # router pods' owner chain
    (OPERATOR_USER, "watch", "apps", "replicasets", "", APP_NS, True),
    # Secrets: created (the sidecar token), never read, listed or watched.
    (OPERATOR_USER, "get", "", "secrets", "", APP_NS, False),
    (OPERATOR_USER, "get", "", "secrets", "", "kube-system", False),
    (OPERATOR_USER, "list", "", "secrets", "", "", False),
    (OPERATOR_USER, "list", "", "secrets", "", APP_NS, False),
    (OPERATOR_USER, "watch", "", "secrets", "", APP_NS, False),
    (OPERATOR_USER, "watch", "", "secrets", "", "", False),
    (OPERATOR_USER, "get", "", "persistentvolumeclaims", "", APP_NS, True),
    (OPERATOR_USER, "list", "", "persistentvolumeclaims", "", APP_NS, False),
    (OPERATOR_USER, "watch", "", "persistentvolumeclaims", "", APP_NS, False),
    (OPERATOR_USER, "patch", "", "persistentvolumeclaims", "", APP_NS, False),
    (OPERATOR_USER, "update", "", "secrets", "", APP_NS, False),
    # Events: the StatefulSets' (FailedCreate of pods refused) and the pods' FailedMount.
    (OPERATOR_USER, "list", "", "events", "", APP_NS, True),
    (OPERATOR_USER, "watch", "", "events", "", APP_NS, True),
    (OPERATOR_USER, "delete", "", "events", "", APP_NS, False),
    (OPERATOR_USER, "patch", GROUP, PLURAL, "", APP_NS, False),  # spec belongs to GitOps
    (OPERATOR_USER, "delete", GROUP, PLURAL, "", APP_NS, False),
    (OPERATOR_USER, "create", "", "pods", "", APP_NS, False),
    (OPERATOR_USER, "delete", "", "pods", "", APP_NS, True),  # an instance's ranks together
    (OPERATOR_USER, "deletecollection", "", "pods", "", APP_NS, False),
    (OPERATOR_USER, "exec", "", "pods", "exec", APP_NS, False),
    (OPERATOR_USER, "patch", "", "nodes", "", "", False),
    (OPERATOR_USER, "list", "", "configmaps", "", APP_NS, False),
    (OPERATOR_USER, "get", "apps", "replicasets", "", APP_NS, False),
    (OPERATOR_USER, "delete", "apps", "replicasets", "", APP_NS, False),
    (OPERATOR_USER, "create", "rbac.authorization.k8s.io", "clusterrolebindings", "", "", False),
    (OPERATOR_USER, "escalate", "rbac.authorization.k8s.io", "roles", "", APP_NS, False),
    (OPERATOR_USER, "bind", "rbac.authorization.k8s.io", "clusterroles", "", "", False),
    (OPERATOR_USER, "impersonate", "", "users", "", "", False),
    (OPERATOR_USER, "delete", "apiextensions.k8s.io", "customresourcedefinitions", "", "", False),
    # Leader election: its one Lease in its own namespace (a create names no object yet).
    (OPERATOR_USER, "create", "coordination.k8s.io", "leases", "", OPERATOR_NS, True),
    (OPERATOR_USER, "create", "coordination.k8s.io", "leases", "", APP_NS, False),
    (OPERATOR_USER, "list", "coordination.k8s.io", "leases", "", OPERATOR_NS, False),
    (OPERATOR_USER, "delete", "coordination.k8s.io", "leases", "", OPERATOR_NS, False),
    (AGENT_USER, "get", "", "nodes", "", "", True),
    (AGENT_USER, "patch", "", "nodes", "", "", True),
    (AGENT_USER, "list", "", "nodes", "", "", False),
    (AGENT_USER, "delete", "", "nodes", "", "", False),
    (AGENT_USER, "get", "", "secrets", "", APP_NS, False),
    (AGENT_USER, "list", "", "pods", "", "", False),
]


@pytest.mark.parametrize(
    ("user", "verb", "group", "resource", "subresource", "namespace", "allowed"),
    ACCESS,
    ids=[f"{u.rsplit(':', 1)[1]}-{v}-{r}{'/' + s if s else ''}" for u, v, _, r, s, _, _ in ACCESS],
)
def test_access_review(
    applied_manifests: list[dict[str, Any]],
    api_client: client.ApiClient,
    user: str,
    verb: str,
    group: str,
    resource: str,
    subresource: str,
    namespace: str,
    allowed: bool,
) -> None:
    answer = access(
        api_client, verb, resource, namespace, user=user, group=group, subresource=subresource
    )
    assert answer is allowed


# (verb, name, allowed): get and update only the operator's own Lease.
LEASE_ACCESS = [
    ("get", LEASE, True),
    ("update", LEASE, True),
    ("update", "kube-controller-manager", False),
    ("get", "someone-elses-lease", False),
]


@pytest.mark.parametrize(("verb", "name", "allowed"), LEASE_ACCESS)
def test_lease_access_review(
    applied_manifests: list[dict[str, Any]],
    api_client: client.ApiClient,
    verb: str,
    name: str,
    allowed: bool,
) -> None:
    answer = access(
        api_client,
        verb,
        "leases",
        OPERATOR_NS,
        user=OPERATOR_USER,
        group="coordination.k8s.io",
        name=name,
    )
    assert answer is allowed


def small_pddeployment(name: str) -> dict[str, Any]:
    return pdd_body(
        name,
        APP_NS,
        prefill={"replicas": 1, "gpusPerInstance": 1},
        decode={"replicas": 1, "gpusPerInstance": 1},
        topology={"placement": "none"},
    )


def observed_generation(api: client.ApiClient, name: str) -> int:
    body = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, APP_NS, PLURAL, name
    )
    return int(body.get("status", {}).get("observedGeneration", 0))
