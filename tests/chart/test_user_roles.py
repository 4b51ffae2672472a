"""Who may use the API, on the real API server: the chart's edit and view ClusterRoles are
aggregated (by the controller-manager's clusterrole-aggregation controller) into the built-in
admin/edit and view roles, so a namespace's editor may create PDDeployments there and nowhere
else, a viewer may only read them, nobody but the operator writes their status, and someone
bound to nothing may do nothing. Shown both ways: SubjectAccessReview answers (the admin's
view) and the user's own requests through impersonation (what the user sees)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from helpers.factories import pdd_body
from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane

from .support import apply, ensure_namespace, manifest_documents, wait_crd_established

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
TEAM, OTHER = "roles-team", "roles-other"
EDITOR, VIEWER, STRANGER = "alice@example.com", "bob@example.com", "carol@example.com"


def _bind(api: client.ApiClient, user: str, cluster_role: str) -> None:
    binding = {
        "metadata": {"name": f"{cluster_role}-{user.split('@')[0]}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    try:
        client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(TEAM, binding)
    except ApiException as err:
        if err.status != 409:
            raise


def _aggregated(api: client.ApiClient, cluster_role: str) -> bool:
    role = client.RbacAuthorizationV1Api(api).read_cluster_role(cluster_role)
    return any(GROUP in (rule.api_groups or []) for rule in role.rules or [])


@pytest.fixture(scope="module")
def roles(api_client: client.ApiClient, dynamic: DynamicClient) -> None:
    for doc in manifest_documents():
        if doc["kind"] == "CustomResourceDefinition" or doc["metadata"]["name"].endswith(
            ("-edit", "-view")
        ):
            apply(dynamic, doc)
    wait_crd_established(api_client, f"{PLURAL}.{GROUP}")
    for name in (TEAM, OTHER):
        ensure_namespace(api_client, name)
    _bind(api_client, EDITOR, "edit")
    _bind(api_client, VIEWER, "view")
    for built_in in ("admin", "edit", "view"):
        wait_for(lambda r=built_in: _aggregated(api_client, r), 30, what=f"{built_in} aggregated")


def _allowed(
    api: client.ApiClient, user: str, verb: str, namespace: str, subresource: str = ""
) -> bool:
    review = {
        "spec": {
            "user": user,
            "resourceAttributes": {
                "group": GROUP,
                "resource": PLURAL,
                "subresource": subresource,
                "verb": verb,
                "namespace": namespace,
            },
        }
    }
    answer = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(answer.status.allowed)


# (user, verb, namespace, subresource, allowed)
REVIEWS = [
    (EDITOR, "create", TEAM, "", True),
    (EDITOR, "patch", TEAM, "", True),
    (EDITOR, "delete", TEAM, "", True),
    (EDITOR, "create", OTHER, "", False),
    (EDITOR, "patch", TEAM, "status", False),
    (VIEWER, "list", TEAM, "", True),
    (VIEWER, "get", TEAM, "status", True),
    (VIEWER, "create", TEAM, "", False),
    (VIEWER, "delete", TEAM, "", False),
    (STRANGER, "get", TEAM, "", False),
]


@pytest.mark.usefixtures("roles")
@pytest.mark.parametrize(("user", "verb", "namespace", "subresource", "allowed"), REVIEWS)
def test_subject_access_review_answers(
    api_client: client.ApiClient,
    user: str,
    verb: str,
    namespace: str,
    subresource: str,
    allowed: bool,
) -> None:
    assert _allowed(api_client, user, verb, namespace, subresource) is allowed


@pytest.fixture
def as_user(control_plane: LocalControlPlane) -> Iterator[object]:
    opened: list[client.ApiClient] = []

    def open_as(user: str) -> client.CustomObjectsApi:
        api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        opened.append(api)
        return client.CustomObjectsApi(api)

    yield open_as
    for api in opened:
        api.close()


def _create(objects: client.CustomObjectsApi, namespace: str) -> None:
    body = pdd_body("roles", namespace)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")


@pytest.mark.usefixtures("roles")
def test_an_editor_creates_in_its_namespace_only(as_user: object) -> None:
    editor = as_user(EDITOR)  # type: ignore[operator]
    _create(editor, TEAM)
    with pytest.raises(ApiException) as refused:
        _create(editor, OTHER)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert f'User "{EDITOR}" cannot create resource "{PLURAL}"' in message
    assert f'in the namespace "{OTHER}"' in message


@pytest.mark.usefixtures("roles")
def test_a_viewer_reads_but_cannot_create(as_user: object) -> None:
    viewer = as_user(VIEWER)  # type: ignore[operator]
    viewer.list_namespaced_custom_object(GROUP, VERSION, TEAM, PLURAL)
    with pytest.raises(ApiException) as refused:
        _create(viewer, TEAM)
    assert refused.value.status == 403
