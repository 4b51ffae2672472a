"""Least privilege, proved on the real API server with `manifests/` applied (docs/security.md,
"Least privilege").

The attacker's view: the operator's and the topology agent's own credentials (TokenRequest
tokens, as their pods get them, the agent's bound to a pod on a node) and impersonation try
writes beyond what each component needs, and the API server refuses them naming the rule.
The admin's view: SubjectAccessReviews answer what each ServiceAccount may do (the operator,
the agent, and a PDDeployment's router and sidecar accounts as the operator renders them), and
a server-side dry run as the operator shows what the admission policy adds to RBAC. And the
engine container, which runs model code, gets no ServiceAccount credential at all: the API
server's own ServiceAccount admission leaves it out of a rendered pod.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from helpers.factories import make_pdd
from helpers.waits import wait_for
from pdd_contract.labels import ANNOTATION_PROBE_PEER, ANNOTATION_PROBE_REQUEST, LABEL_GPUDIRECT
from pdd_localcluster import LocalControlPlane
from pdd_operator.api import names
from pdd_operator.rendering.access import SERVICE_ACCOUNT_DIR
from pdd_operator.rendering.context import RenderContext
from pdd_operator.rendering.roles import render_pod_template
from pdd_operator.rendering.router import render_router_access
from pdd_operator.rendering.sidecar import render_sidecar_access

from .support import access, apply, ensure_namespace, manifest_documents, wait_crd_established

OPERATOR_NS, OPERATOR_SA, AGENT_SA = "pdd-system", "pdd-operator", "pdd-operator-topology-agent"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
AGENT_USER = f"system:serviceaccount:{OPERATOR_NS}:{AGENT_SA}"
APP_NS = "lp-app"
NODE_A, NODE_B = "lp-node-a", "lp-node-b"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
POD_RULE = "pdd-operator-operator-pods: the operator may write only pods labelled"
POD_FIELDS_RULE = "may change only the pdd.dev/probe-request and pdd.dev/probe-peer annotations"
OWN_NODE_RULE = "may write only its own Node"
NO_CLAIM_RULE = "topology agent names no node"
NODE_FIELDS_RULE = "may change only pdd.dev/ labels and annotations"
# The labels a PDDeployment's pods carry (api/names.common_labels).
PDD_POD_LABELS = names.common_labels("llama", "prefill")
PDD = make_pdd(name="llama", namespace=APP_NS)
ROUTER_USER = f"system:serviceaccount:{APP_NS}:{names.router_account_name(PDD.name)}"
SIDECAR_USER = f"system:serviceaccount:{APP_NS}:{names.sidecar_account_name(PDD.name)}"
PROBER_POD = names.prober_pod_name(PDD.name)

Api = client.ApiClient


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster(
    api_client: Api, dynamic: DynamicClient, control_plane: LocalControlPlane
) -> Iterator[None]:
    """`manifests/` applied, two Nodes, a PDDeployment's pod and a stranger's pod in the app
    namespace, one in kube-system, the router's and sidecar's rendered accounts; once the
    API server enforces the policies (its admission plugin loads them asynchronously)."""
    for doc in manifest_documents():
        apply(dynamic, doc)
        if doc["kind"] == "CustomResourceDefinition":
            wait_crd_established(api_client, doc["metadata"]["name"])
    core = client.CoreV1Api(api_client)
    ensure_namespace(api_client, APP_NS)
    for node in (NODE_A, NODE_B):
        core.create_node({"metadata": {"name": node, "labels": {LABEL_GPUDIRECT: "none"}}})
    _create_pod(core, APP_NS, PROBER_POD, PDD_POD_LABELS)
    _create_pod(core, APP_NS, "stranger", {"app": "stranger"})
    _create_pod(core, "kube-system", "coredns-x", {"k8s-app": "kube-dns"})
    for doc in [*render_router_access(PDD), *render_sidecar_access(PDD)]:
        doc = copy.deepcopy(doc)
        doc["metadata"].pop("ownerReferences", None)  # no PDDeployment of that uid here
        apply(dynamic, doc)
    # The admission plugin loads each policy and its binding on its own: wait for both.
    operator = impersonating(control_plane, OPERATOR_USER)
    wait_for(
        lambda: POD_RULE in refusal(lambda: annotate(operator, "kube-system", "coredns-x")),
        timeout=60,
        what="the operator-pods policy to be enforced",
    )
    agent = impersonating(control_plane, AGENT_USER)
    wait_for(
        lambda: NO_CLAIM_RULE in refusal(lambda: label_node(agent, NODE_A, dry_run="All")),
        timeout=60,
        what="the topology agent's node policy to be enforced",
    )
    yield
    for node in (NODE_A, NODE_B):
        core.delete_node(node)
    for namespace, pod in (
        (APP_NS, PROBER_POD),
        (APP_NS, "stranger"),
        ("kube-system", "coredns-x"),
    ):
        core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)


def _create_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    labels: dict[str, str],
    node: str = "",
    account: str = "",
) -> dict[str, Any]:
    """A pod that never runs (no scheduler or kubelet here): what the writes are aimed at."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    if node:
        spec["nodeName"] = node
    if account:
        spec["serviceAccountName"] = account
    body = {"metadata": {"name": name, "labels": labels}, "spec": spec}
    return dict(core.create_namespaced_pod(namespace, body).to_dict())


def token_client(control_plane: LocalControlPlane, token: str) -> Api:
    """A client that authenticates with `token` only, as a process in a pod does."""
    configuration = client.Configuration()
    configuration.host = control_plane.server
    configuration.ssl_ca_cert = str(control_plane.ca_file)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def impersonating(control_plane: LocalControlPlane, user: str, node: str = "") -> Api:
    """The admin's client acting as `user`, with the node claim `node` when given: what a
    request authenticated as that ServiceAccount (bound to a pod on `node`) looks like."""
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    if node:
        api.set_default_header(f"Impersonate-Extra-{NODE_CLAIM.replace('/', '%2F')}", node)
    return api


@pytest.fixture(scope="module")
def operator_api(cluster: None, api_client: Api, control_plane: LocalControlPlane) -> Api:
    """The operator's own credential: a TokenRequest token of its ServiceAccount."""
    token = client.CoreV1Api(api_client).create_namespaced_service_account_token(
        OPERATOR_SA, OPERATOR_NS, {"spec": {"expirationSeconds": 3600}}
    )
    return token_client(control_plane, token.status.token)


@pytest.fixture(scope="module")
def agent_api(cluster: None, api_client: Api, control_plane: LocalControlPlane) -> Iterator[Api]:
    """The agent's credential as the kubelet mounts it: a token bound to the agent's pod on
    NODE_A, which the API server turns into the node-name claim."""
    core = client.CoreV1Api(api_client)
    pod = _create_pod(core, OPERATOR_NS, "agent-on-a", {}, node=NODE_A, account=AGENT_SA)
    bound = {"kind": "Pod", "apiVersion": "v1", "name": "agent-on-a", "uid": pod["metadata"]["uid"]}
    request = {"spec": {"expirationSeconds": 3600, "boundObjectRef": bound}}
    token = core.create_namespaced_service_account_token(AGENT_SA, OPERATOR_NS, request)
    yield token_client(control_plane, token.status.token)
    core.delete_namespaced_pod("agent-on-a", OPERATOR_NS, grace_period_seconds=0)


@pytest.fixture(scope="module")
def unbound_agent_api(cluster: None, api_client: Api, control_plane: LocalControlPlane) -> Api:
    """A token of the agent's ServiceAccount bound to no pod, hence to no node (a leaked
    long-lived token, or one minted by whoever may create tokens for it)."""
    token = client.CoreV1Api(api_client).create_namespaced_service_account_token(
        AGENT_SA, OPERATOR_NS, {"spec": {"expirationSeconds": 3600}}
    )
    return token_client(control_plane, token.status.token)


# ----------------------------------------------------------------------------------- writes


def annotate(
    api: Api, namespace: str, pod: str, key: str = ANNOTATION_PROBE_REQUEST, **kw: Any
) -> Any:
    body = {"metadata": {"annotations": {key: uuid.uuid4().hex}}}
    return client.CoreV1Api(api).patch_namespaced_pod(pod, namespace, body, **kw)


def patch_pod(api: Api, namespace: str, pod: str, body: dict[str, Any]) -> Any:
    return client.CoreV1Api(api).patch_namespaced_pod(pod, namespace, body)


def label_node(
    api: Api, node: str, key: str = LABEL_GPUDIRECT, value: str = "dmabuf", **kw: Any
) -> Any:
    return patch_node(api, node, {"metadata": {"labels": {key: value}}}, **kw)


def patch_node(api: Api, node: str, body: dict[str, Any], **kw: Any) -> Any:
    return client.CoreV1Api(api).patch_node(
        node, body, _content_type="application/merge-patch+json", **kw
    )


def refusal(call: Callable[[], Any]) -> str:
    """The API server's 403 message for the call, "" where it went through."""
    try:
        call()
    except ApiException as err:
        assert err.status == 403, f"{err.status}: {err.body}"
        return str(err.body)
    return ""


# ------------------------------------------------------------------ the operator: its pods only


def test_operator_stamps_the_probe_request_on_a_deployments_pod(
    operator_api: Api, api_client: Api
) -> None:
    stamped = annotate(operator_api, APP_NS, PROBER_POD)
    value = stamped.metadata.annotations[ANNOTATION_PROBE_REQUEST]
    live = client.CoreV1Api(api_client).read_namespaced_pod(PROBER_POD, APP_NS)
    assert live.metadata.annotations[ANNOTATION_PROBE_REQUEST] == value


def test_operator_names_a_ranks_probe_peer_on_a_deployments_pod(
    operator_api: Api, api_client: Api
) -> None:
    # Where instances span nodes each prefill rank is asked with the decode pod to measure.
    stamped = annotate(operator_api, APP_NS, PROBER_POD, key=ANNOTATION_PROBE_PEER)
    value = stamped.metadata.annotations[ANNOTATION_PROBE_PEER]
    live = client.CoreV1Api(api_client).read_namespaced_pod(PROBER_POD, APP_NS)
    assert live.metadata.annotations[ANNOTATION_PROBE_PEER] == value


@pytest.mark.parametrize(("namespace", "pod"), [(APP_NS, "stranger"), ("kube-system", "coredns-x")])
def test_operator_may_not_patch_a_pod_it_does_not_manage(
    operator_api: Api, namespace: str, pod: str
) -> None:
    message = refusal(lambda: annotate(operator_api, namespace, pod))
    assert POD_RULE in message and f"{namespace}/{pod} is not one of them" in message, message


@pytest.mark.parametrize(
    ("case", "body"),
    [
        ("other annotation", {"metadata": {"annotations": {"pdd.dev/probe-result": "{}"}}}),
        ("drop a label", {"metadata": {"labels": {"pdd.dev/role": None}}}),
        ("add a label", {"metadata": {"labels": {"evil": "1"}}}),
        ("image", {"spec": {"containers": [{"name": "main", "image": "evil:1"}]}}),
        ("finalizer", {"metadata": {"finalizers": ["example.com/stuck"]}}),
    ],
)
def test_operator_may_change_only_the_probe_request_on_its_pod(
    operator_api: Api, case: str, body: dict[str, Any]
) -> None:
    message = refusal(lambda: patch_pod(operator_api, APP_NS, PROBER_POD, body))
    assert POD_FIELDS_RULE in message, f"{case}: {message}"


def test_operator_may_not_evict_its_pods(operator_api: Api) -> None:
    core = client.CoreV1Api(operator_api)
    eviction = {"metadata": {"name": PROBER_POD, "namespace": APP_NS}}
    assert refusal(lambda: core.create_namespaced_pod_eviction(PROBER_POD, APP_NS, eviction))


@pytest.mark.parametrize(("namespace", "pod"), [(APP_NS, "stranger"), ("kube-system", "coredns-x")])
def test_operator_may_not_delete_a_pod_it_does_not_manage(
    operator_api: Api, namespace: str, pod: str
) -> None:
    """RBAC lets it delete pods (an instance's ranks go together); the policy keeps that to
    a PDDeployment's pods. The server-side dry run deletes nothing either way."""
    core = client.CoreV1Api(operator_api)
    message = refusal(lambda: core.delete_namespaced_pod(pod, namespace, dry_run="All"))
    assert POD_RULE in message and f"{namespace}/{pod} is not one of them" in message, message


def test_operator_may_delete_a_deployments_pod(operator_api: Api) -> None:
    core = client.CoreV1Api(operator_api)
    assert refusal(lambda: core.delete_namespaced_pod(PROBER_POD, APP_NS, dry_run="All")) == ""


def test_the_policy_binds_the_operator_only(api_client: Api, cluster: None) -> None:
    """The admin (and every other identity) is not evaluated: its writes go through."""
    assert refusal(lambda: annotate(api_client, "kube-system", "coredns-x", key="team")) == ""


# ------------------------------------------------------------------- the agent: its own Node


def test_agent_labels_its_own_node(agent_api: Api, api_client: Api) -> None:
    label_node(agent_api, NODE_A, value="dmabuf")
    node = client.CoreV1Api(api_client).read_node(NODE_A)
    assert node.metadata.labels[LABEL_GPUDIRECT] == "dmabuf"


def test_agent_drops_the_retired_annotation_of_its_own_node(
    agent_api: Api, api_client: Api
) -> None:
    patch_node(api_client, NODE_A, {"metadata": {"annotations": {"pdd.dev/topology": "{}"}}})
    patch_node(agent_api, NODE_A, {"metadata": {"annotations": {"pdd.dev/topology": None}}})
    node = client.CoreV1Api(api_client).read_node(NODE_A)
    assert "pdd.dev/topology" not in (node.metadata.annotations or {})


def test_agent_may_not_write_another_node(agent_api: Api) -> None:
    message = refusal(lambda: label_node(agent_api, NODE_B))
    assert f"agent on node {NODE_A} {OWN_NODE_RULE}, not {NODE_B}" in message, message


@pytest.mark.parametrize(
    ("case", "body"),
    [
        ("role label", {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
        ("annotation", {"metadata": {"annotations": {"example.com/x": "1"}}}),
        ("unschedulable", {"spec": {"unschedulable": True}}),
        ("taint", {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
    ],
)
def test_agent_may_change_only_pdd_metadata_of_its_node(
    agent_api: Api, case: str, body: dict[str, Any]
) -> None:
    message = refusal(lambda: patch_node(agent_api, NODE_A, body))
    assert NODE_FIELDS_RULE in message, f"{case}: {message}"


def test_agent_may_not_delete_its_node_or_write_its_status(agent_api: Api) -> None:
    core = client.CoreV1Api(agent_api)
    assert refusal(lambda: core.delete_node(NODE_A))
    status = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert refusal(lambda: core.patch_node_status(NODE_A, status))


def test_an_agent_token_bound_to_no_node_writes_no_node(unbound_agent_api: Api) -> None:
    message = refusal(lambda: label_node(unbound_agent_api, NODE_A))
    assert NO_CLAIM_RULE in message, message


@pytest.mark.usefixtures("cluster")
def test_the_node_claim_decides_which_node(control_plane: LocalControlPlane) -> None:
    """Impersonated with the claim of NODE_B: NODE_B is its own, NODE_A is not; without a claim
    nothing. (Forging the claim takes impersonation, which neither account has: see the access
    reviews below.)"""
    on_b = impersonating(control_plane, AGENT_USER, node=NODE_B)
    assert refusal(lambda: label_node(on_b, NODE_B, value="peermem")) == ""
    assert OWN_NODE_RULE in refusal(lambda: label_node(on_b, NODE_A))
    no_claim = impersonating(control_plane, AGENT_USER)
    assert NO_CLAIM_RULE in refusal(lambda: label_node(no_claim, NODE_B))


# ------------------------------------------------------------------------- the admin's view


@pytest.mark.usefixtures("cluster")
def test_a_server_dry_run_as_the_operator_shows_the_policy(
    control_plane: LocalControlPlane, api_client: Api
) -> None:
    """`kubectl patch pod ... --as=system:serviceaccount:pdd-system:pdd-operator
    --dry-run=server`: RBAC alone allows the patch in kube-system (the access review says so),
    the policy refuses it; on a PDDeployment's pod it passes, and a dry run writes nothing."""
    assert access(api_client, "patch", "pods", "kube-system", user=OPERATOR_USER)
    as_operator = impersonating(control_plane, OPERATOR_USER)
    refused = refusal(lambda: annotate(as_operator, "kube-system", "coredns-x", dry_run="All"))
    assert POD_RULE in refused, refused
    before = client.CoreV1Api(api_client).read_namespaced_pod(PROBER_POD, APP_NS)
    dry = annotate(as_operator, APP_NS, PROBER_POD, dry_run="All")
    after = client.CoreV1Api(api_client).read_namespaced_pod(PROBER_POD, APP_NS)
    assert dry.metadata.annotations[ANNOTATION_PROBE_REQUEST] != (
        (after.metadata.annotations or {}).get(ANNOTATION_PROBE_REQUEST)
    )
    assert after.metadata.resource_version == before.metadata.resource_version


AUTH = "authentication.k8s.io"
# (user, verb, resource, subresource, namespace, name, group, allowed)
REVIEWS: list[tuple[str, str, str, str, str, str, str, bool]] = [
    # The operator: pods read and patched (narrowed by the policy), nothing more on pods.
    (OPERATOR_USER, "patch", "pods", "", APP_NS, "", "", True),
    (OPERATOR_USER, "update", "pods", "status", APP_NS, "", "", False),
    (OPERATOR_USER, "delete", "pods", "", APP_NS, "", "", True),
    (OPERATOR_USER, "deletecollection", "pods", "", APP_NS, "", "", False),
    (OPERATOR_USER, "create", "pods", "eviction", APP_NS, "", "", False),
    (OPERATOR_USER, "create", "pods", "exec", APP_NS, "", "", False),
    (OPERATOR_USER, "create", "secrets", "", APP_NS, "", "", True),  # the sidecar token
    *[
        (user, verb, "secrets", "", namespace, "", "", False)
        for user in (OPERATOR_USER, AGENT_USER, ROUTER_USER, SIDECAR_USER)
        for verb in ("get", "list", "watch")
        for namespace in (APP_NS, OPERATOR_NS, "kube-system", "")
    ],
    # It creates its sidecars' accounts but cannot mint their tokens or act as them.
    (OPERATOR_USER, "create", "serviceaccounts", "token", APP_NS, "", "", False),
    (OPERATOR_USER, "impersonate", "serviceaccounts", "", APP_NS, "", "", False),
    (OPERATOR_USER, "impersonate", "userextras", NODE_CLAIM, "", "", AUTH, False),
    # The agent: get and patch Nodes (narrowed to its own by the policy), nothing else.
    (AGENT_USER, "get", "nodes", "", "", NODE_A, "", True),
    (AGENT_USER, "patch", "nodes", "", "", NODE_B, "", True),
    (AGENT_USER, "update", "nodes", "status", "", NODE_A, "", False),
    (AGENT_USER, "list", "nodes", "", "", "", "", False),
    (AGENT_USER, "delete", "nodes", "", "", NODE_A, "", False),
    (AGENT_USER, "impersonate", "userextras", NODE_CLAIM, "", "", AUTH, False),
    (AGENT_USER, "create", "serviceaccounts", "token", OPERATOR_NS, AGENT_SA, "", False),
    (AGENT_USER, "get", "pods", "", OPERATOR_NS, "", "", False),
    # The router: discovers its namespace's pods; no write, no Secret, no other namespace.
    (ROUTER_USER, "watch", "pods", "", APP_NS, "", "", True),
    (ROUTER_USER, "list", "pods", "", "kube-system", "", "", False),
    (ROUTER_USER, "patch", "pods", "", APP_NS, "", "", False),
    (ROUTER_USER, "get", "nodes", "", "", "", "", False),
    # The sidecar: discovers peers, writes the probe result on the prober pod only.
    (SIDECAR_USER, "list", "pods", "", APP_NS, "", "", True),
    (SIDECAR_USER, "patch", "pods", "", APP_NS, PROBER_POD, "", True),
    (
        SIDECAR_USER,
        "patch",
        "pods",
        "",
        APP_NS,
        f"{names.role_name(PDD.name, 'decode')}-0",
        "",
        False,
    ),
    (SIDECAR_USER, "patch", "pods", "", APP_NS, "stranger", "", False),
    (SIDECAR_USER, "list", "pods", "", "kube-system", "", "", False),
]


@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize(
    ("user", "verb", "resource", "subresource", "namespace", "name", "group", "allowed"),
    REVIEWS,
    ids=[
        f"{u.rsplit(':', 1)[1]}-{'' if a else 'not-'}{v}-{r}{'/' + s if s else ''}"
        f"{'-' + ns if ns else ''}{'-' + n if n else ''}"
        for u, v, r, s, ns, n, _, a in REVIEWS
    ],
)
def test_access_review(
    api_client: Api,
    user: str,
    verb: str,
    resource: str,
    subresource: str,
    namespace: str,
    name: str,
    group: str,
    allowed: bool,
) -> None:
    answer = access(
        api_client,
        verb,
        resource,
        namespace,
        user=user,
        group=group,
        subresource=subresource,
        name=name,
    )
    assert answer is allowed


# ---------------------------------------------------------- the engine: no credential at all


def admitted_pod(api: Api, template: dict[str, Any]) -> dict[str, Any]:
    """The pod the API server would store for this template (a server-side dry run: every
    admission plugin runs, the ServiceAccount one that mounts tokens included)."""
    body = {"metadata": {"name": f"render-{uuid.uuid4().hex[:6]}", **template["metadata"]}}
    body["spec"] = template["spec"]
    pod = client.CoreV1Api(api).create_namespaced_pod(APP_NS, body, dry_run="All")
    return dict(api.sanitize_for_serialization(pod))


def credential_mounts(pod: dict[str, Any], container: str) -> list[str]:
    """The volumes mounted at the ServiceAccount directory of that container."""
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    mounts = next(c for c in containers if c["name"] == container).get("volumeMounts", [])
    return [m["name"] for m in mounts if m["mountPath"] == SERVICE_ACCOUNT_DIR]


@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_only_the_sidecar_of_an_engine_pod_holds_a_service_account_token(
    api_client: Api, role: str
) -> None:
    pod = admitted_pod(api_client, render_pod_template(PDD, role, RenderContext()))
    assert pod["spec"]["serviceAccountName"] == names.sidecar_account_name(PDD.name)
    assert credential_mounts(pod, "engine") == []
    assert credential_mounts(pod, "preflight") == []
    [volume] = credential_mounts(pod, "nixl-sidecar")
    sources = next(v for v in pod["spec"]["volumes"] if v["name"] == volume)["projected"]
    assert any("serviceAccountToken" in s for s in sources["sources"])
    # The engine keeps the sidecar's HTTP token (not an API credential).
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    assert any(m["mountPath"] == "/var/run/pdd/token" for m in engine["volumeMounts"])


@pytest.mark.usefixtures("cluster")
def test_without_the_opt_out_the_api_server_would_mount_a_token_into_the_engine(
    api_client: Api,
) -> None:
    """The control: the same template with automounting left on gets the API server's
    token volume in every container, the engine included."""
    template = render_pod_template(PDD, "prefill", RenderContext())
    del template["spec"]["automountServiceAccountToken"]
    pod = admitted_pod(api_client, template)
    assert credential_mounts(pod, "engine") != []
