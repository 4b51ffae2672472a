"""The chart without a cluster: `helm lint` of several value sets, values.schema.json refusing
wrong values by name, and what `helm template` renders (RBAC tightness, hardening, toggles)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pdd_operator.api.v1alpha1 import DEFAULT_ROUTER_IMAGE

from .support import CHART, ROOT, Helm, kinds

# Value sets every test here renders; the cluster tests apply the same ones.
VALUE_SETS: dict[str, list[str]] = {
    "default": [],
    "agent-disabled": ["--set", "agent.enabled=false"],
    "servicemonitor": [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
    ],
    "monitoring": [
        "--set",
        "metrics.podMonitors.enabled=true",
        "--set",
        "metrics.dashboards.enabled=true",
        "--set",
        "metrics.scraperNamespaces={monitoring}",
        "--set",
        "metrics.scraperPodLabels.app\\.kubernetes\\.io/name=prometheus",
    ],
    "watch-namespaces": ["--set", "watchNamespaces={team-a,team-b}", "--set", "logLevel=debug"],
    "custom-image": [
        "--set",
        "image.repository=registry.example.com/pdd/operator",
        "--set",
        "image.digest=sha256:" + "a" * 64,
        "--set",
        "imagePullSecrets[0].name=regcred",
        "--set",
        "resyncSeconds=60",
    ],
    # The edges of what the schema lets through: every object the chart derives from them is
    # still one the API server takes (test_chart_install.py's dry-run).
    "warn-and-audit": ["--set", "podTemplatePolicy.validationActions={Warn,Audit}"],
    "deny-and-audit": ["--set", "podTemplatePolicy.validationActions={Deny,Audit}"],
    "longest-fullname": ["--set", "fullnameOverride=p" + "-0" * 31],
    "longest-name": ["--set", "nameOverride=" + "n" * 63],
    "one-replica": ["--set", "replicaCount=1"],
}

# Each wrong value and the field the error must name (a user fixes what the message names).
REJECTED: list[tuple[list[str], str]] = [
    (["--set", "logLevel=verbose"], "/logLevel"),
    (["--set", "resyncSeconds=often"], "/resyncSeconds"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "metrics.port=70000"], "/metrics/port"),
    (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
    (["--set", "agent.enabled=yes"], "/agent/enabled"),
    (["--set", "image.digest=sha256:short"], "/image/digest"),
    (
        ["--set", "podTemplatePolicy.validationActions={Block}"],
        "/podTemplatePolicy/validationActions/0",
    ),
    (["--set", "replicas=2"], "replicas"),  # unknown key (it is replicaCount): no silent typo
    (["--set", "metrics.scraperNamespaces={Monitoring}"], "/metrics/scraperNamespaces/0"),
    (["--set", "metrics.podMonitors.enabled=yes"], "/metrics/podMonitors/enabled"),
    (["--set", "replicaCount=0"], "/replicaCount"),
    # What the API server would refuse in the middle of an install or upgrade
    # (test_chart_install.py sends each of these to it, unchecked): Deny with Warn ...
    (
        ["--set", "podTemplatePolicy.validationActions={Deny,Warn}"],
        "/podTemplatePolicy/validationActions/1",
    ),
    (
        ["--set", "podTemplatePolicy.validationActions={Warn,Audit,Deny}"],
        "/podTemplatePolicy/validationActions/0",
    ),
    # ... and names that are not DNS labels (the metrics Service's must start with a letter).
    (["--set", "nameOverride=Bad_Name"], "/nameOverride"),
    (["--set", "fullnameOverride=pdd.operator"], "/fullnameOverride"),
    (["--set", "fullnameOverride=1pdd"], "/fullnameOverride"),
]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, (kind, kinds(docs))
    return found[0]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lint_passes(helm: Helm, values: list[str]) -> None:
    result = helm.run("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(("values", "field"), REJECTED, ids=[f for _, f in REJECTED])
def test_schema_rejects_wrong_values_by_name(helm: Helm, values: list[str], field: str) -> None:
    lint = helm.run("lint", str(CHART), *values, check=False)
    assert lint.returncode != 0
    assert field in lint.stdout + lint.stderr, lint.stdout
    # install/template validate the same schema: nothing is rendered from bad values.
    template = helm.run("template", "x", str(CHART), *values, check=False)
    assert template.returncode != 0
    assert field in template.stderr


@pytest.mark.parametrize(
    ("version", "renders"),
    [("1.29.9", False), ("1.30.0", True), ("v1.30.2-eks-1a2b3c", True), ("1.35.4", True)],
)
def test_the_chart_says_which_kubernetes_it_needs(helm: Helm, version: str, renders: bool) -> None:
    """ValidatingAdmissionPolicy v1 (the access and podTemplate policies) is served from 1.30
    on: an older cluster is refused before anything is installed, with the reason."""
    result = helm.run("template", "x", str(CHART), "--kube-version", version, check=False)
    assert (result.returncode == 0) is renders, result.stderr
    if not renders:
        assert "chart requires kubeVersion: >=1.30.0-0" in result.stderr


def test_metrics_and_liveness_ports_must_differ(helm: Helm) -> None:
    # A rule across two fields: the template refuses it (JSON schema cannot compare values).
    result = helm.run("template", "x", str(CHART), "--set", "metrics.port=8080", check=False)
    assert result.returncode != 0
    assert "metrics.port and livenessProbe.port must differ" in result.stderr


def test_default_render(helm: Helm) -> None:
    docs = helm.template("--skip-tests")
    assert sorted(kinds(docs)) == sorted(
        [
            "ServiceAccount",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",  # the users' edit role
            "ClusterRole",  # the users' view role
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Role",  # the leader election's Lease
            "RoleBinding",
            "PodDisruptionBudget",
            "Service",
            "DaemonSet",
            "Deployment",
            # The podTemplate policy, the KV-lane warning, the operator's pods, the name
            # guard, the agent's Node.
            *["ValidatingAdmissionPolicy"] * 5,
            *["ValidatingAdmissionPolicyBinding"] * 5,
        ]
    )
    assert all(d["metadata"].get("namespace") in (None, "pdd-system") for d in docs)
    deployment = one(docs, "Deployment")
    # A leader and a standby; the rollout keeps a ready standby throughout.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pdd-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/pdd-dev/pdd-operator:0.1.0"
    assert container["args"][0] == "run"
    assert "--sidecar-image=ghcr.io/pdd-dev/pdd-sidecar:0.1.0" in container["args"]
    assert not any(a.startswith("--namespace") for a in container["args"])
    # The operator is told the name guard's name, the policy the chart renders next to it.
    assert "--name-guard-policy=pdd-operator-child-names" in container["args"]
    guard = [d for d in docs if d["metadata"]["name"] == "pdd-operator-child-names"]
    assert sorted(kinds(guard)) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    # kopf's liveness endpoint is where the probe looks.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in container["args"]
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # A read-only root filesystem needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    service = one(docs, "Service")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"][0]["port"] == ports["metrics"]


def images_of(docs: list[dict[str, Any]]) -> list[str]:
    """Every image the chart's own pods run (the operator, the agent, the helm test)."""
    images = []
    for doc in docs:
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec) if doc["kind"] != "Pod" else spec
        images += [c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])]
    return images


def test_one_value_moves_every_image_of_ours_to_a_mirror(helm: Helm) -> None:
    """imageRegistry replaces ghcr.io/pdd-dev in the chart's images and in the sidecar and
    router images the operator renders; imagePullSecrets reach the rendered pods too."""
    mirror = "registry.example.com:5000/mirror/pdd"
    docs = helm.template(
        "--set", f"imageRegistry={mirror}", "--set", "imagePullSecrets[0].name=regcred"
    )  # fmt: skip
    images = images_of(docs)
    assert images and all(image.startswith(f"{mirror}/pdd-") for image in images), images
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--sidecar-image={mirror}/pdd-sidecar:0.1.0" in args
    assert f"--router-image={mirror}/pdd-router:0.1.0" in args
    assert "--image-pull-secret=regcred" in args
    default = one(helm.template(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--router-image=ghcr.io/pdd-dev/pdd-router:0.1.0" in default["args"]
    assert not any(a.startswith("--image-pull-secret") for a in default["args"])
    # A release upgraded with --reuse-values from a chart before routerImage keeps a router.
    reused = one(helm.template("--set", "routerImage=null"), "Deployment")
    assert (
        "--router-image=ghcr.io/pdd-dev/pdd-router:0.1.0"
        in (reused["spec"]["template"]["spec"]["containers"][0]["args"])
    )


def test_the_default_router_image_is_the_crds_default(helm: Helm) -> None:
    """The operator swaps in --router-image only where spec.router.image is the CRD's
    default: the chart's router image must be that same reference."""
    args = one(helm.template(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--router-image={DEFAULT_ROUTER_IMAGE}" in args


def test_high_availability(helm: Helm) -> None:
    """Two replicas elect a leader on one Lease in the release's namespace, by a Role there
    that names it; a drain never takes both; they prefer different nodes."""
    docs = helm.template("--skip-tests", "--set", "watchNamespaces={team-a}")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--leader-election-lease=pdd-operator-leader" in container["args"]
    assert "--leader-election-namespace=pdd-system" in container["args"]
    # A standby answers the same endpoint: both replicas are ready, neither is restarted.
    assert container["readinessProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]
    election = [d for d in docs if d["metadata"]["name"] == "pdd-operator-leader-election"]
    role, binding = one(election, "Role"), one(election, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "pdd-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["pdd-operator-leader"],
            "verbs": ["get", "update"],
        },
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "pdd-system"}
    ]
    others = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and d is not role]
    assert not [r for d in others for r in d["rules"] if "leases" in r["resources"]]
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }


def test_one_replica_and_an_own_affinity(helm: Helm) -> None:
    """One replica keeps the election (a rollout starts the new pod as a standby) and has no
    budget, which would block every drain of its node; an affinity given replaces the
    default anti-affinity."""
    zone = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}  # fmt: skip
    docs = helm.template(
        "--skip-tests",
        "--set",
        "replicaCount=1",
        "--set-json",
        f"affinity={json.dumps(zone)}",
    )
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert by_kind(docs, "PodDisruptionBudget") == []
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--leader-election-lease=pdd-operator-leader" in container["args"]
    assert deployment["spec"]["template"]["spec"]["affinity"] == zone


def test_agent_daemonset(helm: Helm) -> None:
    docs = helm.template("--skip-tests")
    daemonset = one(docs, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/pdd-dev/pdd-sidecar:0.1.0"
    assert container["command"] == ["pdd-node"]  # the image's entrypoint is pdd-sidecar
    assert container["args"][0] == "agent"
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/host/sys"]["readOnly"] and mounts["/host/proc"]["readOnly"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"]}
    assert host_paths == {"/sys", "/proc"}
    agent_role = next(
        r for r in by_kind(docs, "ClusterRole") if "topology-agent" in r["metadata"]["name"]
    )
    assert agent_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]
    assert pod["serviceAccountName"] == agent_role["metadata"]["name"]


def test_agent_disabled_renders_no_agent(helm: Helm) -> None:
    docs = helm.template("--skip-tests", *VALUE_SETS["agent-disabled"])
    assert "DaemonSet" not in kinds(docs)
    assert not [d for d in docs if "topology-agent" in d["metadata"]["name"]]


def test_servicemonitor_only_where_the_cluster_serves_it(helm: Helm) -> None:
    values = VALUE_SETS["servicemonitor"]
    assert "ServiceMonitor" not in kinds(helm.template(*values))
    with_api = helm.template(*values, "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
    monitor = one(with_api, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    service = one(with_api, "Service")
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert service["metadata"]["labels"][key] == value
    forced = helm.template(*values, "--set", "metrics.serviceMonitor.skipCapabilityCheck=true")
    assert "ServiceMonitor" in kinds(forced)


def test_watch_namespaces_grants_namespaced_rules_per_namespace(helm: Helm) -> None:
    docs = helm.template("--skip-tests", *VALUE_SETS["watch-namespaces"])
    # The leader election's Role in the release's namespace aside (test_high_availability).
    election = "pdd-operator-leader-election"
    roles = {
        r["metadata"]["namespace"]: r
        for r in by_kind(docs, "Role")
        if r["metadata"]["name"] != election
    }
    bindings = {
        b["metadata"]["namespace"]: b
        for b in by_kind(docs, "RoleBinding")
        if b["metadata"]["name"] != election
    }
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    cluster_role = next(
        r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "pdd-operator"
    )
    cluster_resources = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    assert cluster_resources == {
        "nodes",
        "customresourcedefinitions",
        "namespaces",
        # The name guard, read by name at start-up (cluster-scoped objects).
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    }
    assert "pddeployments" in {
        res for rule in roles["team-a"]["rules"] for res in rule["resources"]
    }
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--verbose" in args


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rbac_never_lists_secrets_nor_uses_wildcards(helm: Helm, values: list[str]) -> None:
    docs = helm.template(*values)
    rules = [rule for d in docs if d["kind"] in ("Role", "ClusterRole") for rule in d["rules"]]
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        if "secrets" in rule["resources"]:
            # Create its token Secret, and nothing else: no Secret can be read.
            assert rule["verbs"] == ["create"], rule
        # Escalation verbs would let the operator grant itself anything.
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_chart_crds_are_the_generated_ones() -> None:
    chart_crds = sorted(p.name for p in (CHART / "crds").iterdir())
    assert chart_crds == sorted(p.name for p in (ROOT / "crds").iterdir())
    for name in chart_crds:
        assert (CHART / "crds" / name).read_text() == (ROOT / "crds" / name).read_text()
        assert yaml.safe_load((CHART / "crds" / name).read_text())["kind"] == (
            "CustomResourceDefinition"
        )


def test_helm_test_pod_is_hardened(helm: Helm) -> None:
    docs = helm.template("--show-only", "templates/tests/test-metrics.yaml")
    pod = one(docs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "pdd-operator-metrics.pdd-system.svc:8081" in pod["spec"]["containers"][0]["command"][2]


def named(docs: list[dict[str, Any]], kind: str, suffix: str) -> list[dict[str, Any]]:
    return [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]


def test_pod_template_policy_toggles(helm: Helm) -> None:
    """On by default with Deny and the namespace exception; the values turn it off or to
    warnings (the binding's actions)."""
    [binding] = named(helm.template(), "ValidatingAdmissionPolicyBinding", "-podtemplate")
    [policy] = named(helm.template(), "ValidatingAdmissionPolicy", "-podtemplate")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "pdd.dev/pod-policy", "operator": "NotIn", "values": ["privileged"]}
    ]
    off = helm.template("--set", "podTemplatePolicy.enabled=false")
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert named(off, kind, "-podtemplate") == []
    warn = helm.template("--set", "podTemplatePolicy.validationActions={Warn,Audit}")
    [warn_binding] = named(warn, "ValidatingAdmissionPolicyBinding", "-podtemplate")
    assert warn_binding["spec"]["validationActions"] == ["Warn", "Audit"]


def test_the_kv_lane_policy_only_warns_and_toggles(helm: Helm) -> None:
    [binding] = named(helm.template(), "ValidatingAdmissionPolicyBinding", "-kv-lane")
    assert binding["spec"]["validationActions"] == ["Warn"]
    [policy] = named(helm.template(), "ValidatingAdmissionPolicy", "-kv-lane")
    assert policy["spec"]["failurePolicy"] == "Ignore"
    off = helm.template("--set", "kvLaneWarning.enabled=false")
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert named(off, kind, "-kv-lane") == []
    # A release upgraded with --reuse-values from a chart without the key keeps it on.
    reused = helm.template("--set", "kvLaneWarning=null")
    assert len(named(reused, "ValidatingAdmissionPolicyBinding", "-kv-lane")) == 1


def test_an_upgrade_reusing_older_values_gets_two_replicas_and_their_budget(helm: Helm) -> None:
    """A release upgraded with --reuse-values from a chart before leader election has neither
    replicaCount nor podDisruptionBudget in its values: the defaults still apply."""
    reused = helm.template("--set", "replicaCount=null", "--set", "podDisruptionBudget=null")
    assert one(reused, "Deployment")["spec"]["replicas"] == 2
    assert len(by_kind(reused, "PodDisruptionBudget")) == 1
    single = helm.template("--set", "replicaCount=1")
    assert by_kind(single, "PodDisruptionBudget") == []


def access_policies(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The access policies by name, each with the user its match condition names."""
    return {
        d["metadata"]["name"]: d["spec"]["matchConditions"][0]["expression"]
        for d in by_kind(docs, "ValidatingAdmissionPolicy")
        if not d["metadata"]["name"].endswith(("-podtemplate", "-child-names", "-kv-lane"))
    }


def test_access_policies_name_the_accounts_the_chart_creates(helm: Helm) -> None:
    """Each policy binds (Deny) and matches the very ServiceAccount the chart runs the
    component as, whatever the release, namespace or account name; the agent's goes with
    the agent, both with accessPolicy.enabled."""
    default = access_policies(helm.template())
    assert default == {
        "pdd-operator-operator-pods": (
            "request.userInfo.username == 'system:serviceaccount:pdd-system:pdd-operator'"
        ),
        "pdd-operator-agent-node": (
            "request.userInfo.username == "
            "'system:serviceaccount:pdd-system:pdd-operator-topology-agent'"
        ),
    }
    for name in default:
        [binding] = named(helm.template(), "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    renamed = helm.template("--set", "serviceAccount.name=ops", namespace="infra")
    assert (
        "'system:serviceaccount:infra:ops'"
        in access_policies(renamed)["pdd-operator-operator-pods"]
    )
    assert list(access_policies(helm.template("--set", "agent.enabled=false"))) == [
        "pdd-operator-operator-pods"
    ]
    assert access_policies(helm.template("--set", "accessPolicy.enabled=false")) == {}


def test_the_name_guard_goes_with_the_access_policies_and_is_named_to_the_operator(
    helm: Helm,
) -> None:
    """The operator skips its name look-ups only where the chart renders the guard: its flag,
    the policy and the `get` on them appear together, under the release's name."""

    def operator_args(docs: list[dict[str, Any]]) -> list[str]:
        args: list[str] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        return args

    def policy_reads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rules = [r for d in by_kind(docs, "ClusterRole") for r in d.get("rules") or []]
        return [r for r in rules if "admissionregistration.k8s.io" in r.get("apiGroups", [])]

    renamed = helm.template(release="edge")
    assert "--name-guard-policy=edge-pdd-operator-child-names" in operator_args(renamed)
    assert named(renamed, "ValidatingAdmissionPolicy", "edge-pdd-operator-child-names")
    [rule] = policy_reads(renamed)
    assert rule["resourceNames"] == ["edge-pdd-operator-child-names"]
    assert rule["verbs"] == ["get"]

    off = helm.template("--set", "accessPolicy.enabled=false")
    assert not [a for a in operator_args(off) if a.startswith("--name-guard-policy")]
    assert named(off, "ValidatingAdmissionPolicy", "-child-names") == []
    assert policy_reads(off) == []
