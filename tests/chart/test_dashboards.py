"""The chart's monitoring (issue 43): PodMonitors for the engines and routers every
PDDeployment runs, the operator's NetworkPolicies admitting the scraper, and the Grafana
dashboard of a deployment, each of whose queries names only metrics the pinned engines and
routers export (tests/fixtures/metrics, hack/metric_names.py) or the operator registers."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from helpers.factories import make_pdd
from pdd_operator.metrics import OperatorMetrics
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import OperatorSettings, RenderContext

from .support import CHART, ROOT, Helm, kinds
from .test_chart_lint import VALUE_SETS

DASHBOARD = CHART / "dashboards" / "pdd-deployment.json"
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
# The labels a scrape adds to every series: the target's, and what the PodMonitors copy from
# the pods' pdd.dev/ labels.
TARGET_LABELS = {"namespace", "pod", "container", "job", "instance", "endpoint"}
POD_LABELS = {"pdd_dev_deployment", "pdd_dev_role"}
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
MONITORING = [*VALUE_SETS["monitoring"], "--api-versions", "monitoring.coreos.com/v1/PodMonitor"]


def base(name: str) -> str:
    """A series name without the suffix the exposition adds (counters, histograms)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def engine_names(engine: str) -> list[set[str]]:
    """Each pinned release's metric names (its fixture), without suffixes."""
    paths = sorted(FIXTURES.glob(f"{engine}-[0-9]*.json"))
    assert len(paths) >= 2, f"the oldest and newest supported {engine} release: {paths}"
    return [{base(n) for n in json.loads(p.read_text())["names"]} for p in paths]


def router_series(name: str) -> dict[str, set[str]]:
    (path,) = FIXTURES.glob(f"{name}-[0-9]*.json")
    return {
        series: set(labels) for series, labels in json.loads(path.read_text())["series"].items()
    }


def operator_metrics() -> dict[str, set[str]]:
    """The operator's metrics (without exposition suffixes) and their declared label names."""
    metrics = OperatorMetrics()
    return {
        base(metric._name): set(metric._labelnames)
        for metric in vars(metrics).values()
        if isinstance(metric, MetricWrapperBase)
    }


def queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    found = [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]
    found += [
        (f"variable {v['name']}", v["query"])
        for v in board["templating"]["list"]
        if v["type"] == "query"
    ]
    return found


def label_names(matchers: str) -> set[str]:
    return set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))


def problems(expr: str) -> list[str]:
    found = []
    selectors = SELECTOR.findall(expr)
    if not selectors:
        found.append("no metric selector")
    for name, matchers in selectors:
        labels = label_names(matchers) - TARGET_LABELS - POD_LABELS
        if name.startswith("vllm:") or name.startswith("sglang:"):
            engine = name.split(":")[0]
            missing = [i for i, names in enumerate(engine_names(engine)) if base(name) not in names]
            if missing:
                found.append(f"{name}: not exported by every pinned {engine} release")
            if labels:
                found.append(f"{name}: labels {sorted(labels)} beyond the scrape's")
        elif name.startswith(("vllm_router_", "smg_")):
            series = router_series("vllm-router" if name.startswith("vllm_router_") else "smg")
            if name not in series:
                found.append(f"{name}: not a series the pinned router exports")
            elif labels - series[name]:
                found.append(f"{name}: no label {sorted(labels - series[name])}")
        elif name.startswith("pdd_"):
            declared = operator_metrics()
            if base(name) not in declared:
                found.append(f"{name}: not a metric of the operator")
            elif labels - declared[base(name)]:
                found.append(f"{name}: no label {sorted(labels - declared[base(name)])}")
        elif name != "up":
            found.append(f"{name}: from no pinned component")
    return found


@pytest.mark.parametrize(("title", "expr"), queries(), ids=[t for t, _ in queries()])
def test_every_query_names_metrics_the_pinned_components_export(title: str, expr: str) -> None:
    assert problems(expr) == [], f"{title}: {expr}"


def test_the_check_refuses_a_metric_no_pinned_release_exports() -> None:
    assert problems('vllm:time_to_first_token_secs_bucket{namespace="a"}')
    assert problems('vllm:nixl_xfer_time_seconds_count{namespace="a"}')  # 0.33 only
    assert problems('smg_http_responses_total{stauts_code="500"}')
    assert problems('pdd_kv_transfer_gigabytes{deployment="a"}')
    assert problems('pdd_kv_transfer_gbps{deployment_name="a"}')
    assert not problems('vllm:num_requests_running{namespace="a"}')


def test_the_committed_dashboard_is_what_hack_dashboards_writes() -> None:
    sys.path.insert(0, str(ROOT / "hack"))
    try:
        import dashboards
    finally:
        sys.path.remove(str(ROOT / "hack"))
    assert json.loads(DASHBOARD.read_text()) == dashboards.dashboard(), (
        "run .venv/bin/python hack/dashboards.py"
    )


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar(helm: Helm) -> None:
    (config_map,) = [
        d
        for d in helm.template(*MONITORING)
        if d["kind"] == "ConfigMap" and "dashboards" in d["metadata"]["name"]
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["pdd-deployment.json"]) == json.loads(
        DASHBOARD.read_text()
    )
    assert not [d for d in helm.template() if "dashboards" in d["metadata"]["name"]]


def test_pod_monitors_only_where_the_cluster_serves_them(helm: Helm) -> None:
    assert "PodMonitor" not in kinds(helm.template(*VALUE_SETS["monitoring"]))
    assert kinds(helm.template(*MONITORING)).count("PodMonitor") == 2


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_pod_monitors_select_the_rendered_pods_and_their_metrics_ports(
    helm: Helm, engine: str
) -> None:
    monitors = [d for d in helm.template(*MONITORING) if d["kind"] == "PodMonitor"]
    pods = [
        child["spec"]["template"]
        for child in render_children(make_pdd({"engine": {"type": engine}}), RenderContext())
        if child["kind"] in ("StatefulSet", "Deployment")
    ]
    roles_seen = set()
    for monitor in monitors:
        spec = monitor["spec"]
        assert spec["namespaceSelector"] == {"any": True}
        selected = [p for p in pods if _selects(spec["selector"], p["metadata"]["labels"])]
        assert selected, monitor["metadata"]["name"]
        for pod in selected:
            roles_seen.add(pod["metadata"]["labels"]["pdd.dev/role"])
            ports = {port["name"] for c in pod["spec"]["containers"] for port in c.get("ports", [])}
            for endpoint in spec["podMetricsEndpoints"]:
                assert endpoint["port"] in ports, (monitor["metadata"]["name"], ports)
            for label in spec["podTargetLabels"]:
                assert label in pod["metadata"]["labels"]
    assert roles_seen == {"prefill", "decode", "router"}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def test_the_scraper_namespaces_and_labels_reach_the_chart_operators_flags(helm: Helm) -> None:
    (deployment,) = [d for d in helm.template(*MONITORING) if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metrics-scraper-namespace=monitoring" in args
    assert "--metrics-scraper-pod-label=app.kubernetes.io/name=prometheus" in args


def test_the_pod_monitors_watch_the_namespaces_the_release_reconciles(helm: Helm) -> None:
    scoped = helm.template(*MONITORING, *VALUE_SETS["watch-namespaces"])
    monitors = [d for d in scoped if d["kind"] == "PodMonitor"]
    assert len(monitors) == 2
    for monitor in monitors:
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


@pytest.mark.parametrize(
    ("instance", "index", "dropped"),
    [("", "0", False), ("", "3", False), ("0", "0", False), ("0", "1", True), ("2", "12", True)],
)
def test_a_multi_node_instances_worker_ranks_are_not_scraped(
    helm: Helm, instance: str, index: str, dropped: bool
) -> None:
    """Only an instance's leader (rank 0) serves HTTP; single-node pods carry no instance
    label and are all scraped. Prometheus anchors a relabeling's regex and joins the source
    labels with ';' (absent labels are empty)."""
    for monitor in [d for d in helm.template(*MONITORING) if d["kind"] == "PodMonitor"]:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            (rule,) = endpoint["relabelings"]
            assert rule["sourceLabels"] == [
                "__meta_kubernetes_pod_label_pdd_dev_instance",
                "__meta_kubernetes_pod_label_apps_kubernetes_io_pod_index",
            ]
            assert rule["action"] == "drop"
            assert bool(re.fullmatch(rule["regex"], f"{instance};{index}")) == dropped


def test_the_network_policies_admit_the_scraper_on_the_metrics_ports_only() -> None:
    pdd = make_pdd({"engine": {"type": "sglang"}})
    settings = OperatorSettings(
        metrics_scraper_namespaces=("monitoring",),
        metrics_scraper_pod_labels=(("app.kubernetes.io/name", "prometheus"),),
    )
    policies = {
        c["metadata"]["name"]: c["spec"]
        for c in render_children(pdd, RenderContext(settings=settings))
        if c["kind"] == "NetworkPolicy"
    }
    scraped = {
        name: rule["ports"]
        for name, spec in policies.items()
        for rule in spec["ingress"]
        if any("namespaceSelector" in source for source in rule.get("from", []))
    }
    engine, router = pdd.spec.engine.port, pdd.spec.router.metricsPort
    assert sorted(p["port"] for ports in scraped.values() for p in ports) == sorted(
        [engine, router]
    )
    peers = [
        source
        for spec in policies.values()
        for rule in spec["ingress"]
        for source in rule.get("from", [])
        if "namespaceSelector" in source
    ]
    assert peers and all(
        peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
        for peer in peers
    )
    unscraped = {
        c["metadata"]["name"]: c["spec"]
        for c in render_children(pdd, RenderContext())
        if c["kind"] == "NetworkPolicy"
    }
    assert all("namespaceSelector" not in str(spec["ingress"]) for spec in unscraped.values())


def test_a_release_upgraded_with_reuse_values_from_before_these_values_renders(
    helm: Helm,
) -> None:
    """`helm upgrade --reuse-values` keeps the previous release's values, which lack the
    keys added here (docs/install.md runs that upgrade): every template must take them
    absent."""
    unset = ["dashboards", "podMonitors", "scraperNamespaces", "scraperPodLabels"]
    args = [arg for key in unset for arg in ("--set", f"metrics.{key}=null")]
    docs = helm.template(*args, "--api-versions", "monitoring.coreos.com/v1/PodMonitor")
    assert "Deployment" in kinds(docs) and "PodMonitor" not in kinds(docs)
