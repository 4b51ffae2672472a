"""hack/scrape_config.py: the chart's PodMonitors as Prometheus scrape jobs (what
hack/dashboard_picture.py scrapes the dashboard's picture with). The jobs' relabelings are
applied here as Prometheus applies keep, drop and replace rules (the regex anchored, the
source labels joined with ';', an absent label empty), to the targets pod_targets() makes of
the pods a PDDeployment renders."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

from .support import ROOT, Helm
from .test_dashboards import MONITORING

sys.path.insert(0, str(ROOT / "hack"))
try:
    import scrape_config
finally:
    sys.path.remove(str(ROOT / "hack"))

DISCOVERY = {"file_sd_configs": [{"files": ["pods.json"]}]}


def relabeled(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """The target's labels after the rules; None when a rule drops it."""
    labels = dict(labels)
    for rule in rules:
        joined = ";".join(labels.get(s, "") for s in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), joined)
        action = rule.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            value = match.expand(rule.get("replacement", "$1").replace("$1", r"\g<1>"))
            labels[rule["target_label"]] = value
            if not value:  # an empty value removes the label
                del labels[rule["target_label"]]
    return {k: v for k, v in labels.items() if not k.startswith("__meta_")}


def rendered_pods(engine: str, namespace: str = "team-a") -> list[dict[str, Any]]:
    """A pod of each workload the PDDeployment renders, as the API would list it, with the
    pod-index label a StatefulSet's pods carry."""
    pods = []
    for i, child in enumerate(
        render_children(make_pdd({"engine": {"type": engine}}), RenderContext())
    ):
        if child["kind"] not in ("StatefulSet", "Deployment"):
            continue
        template = child["spec"]["template"]
        labels = {**template["metadata"]["labels"], "apps.kubernetes.io/pod-index": "0"}
        pods.append(
            {
                "metadata": {
                    "name": f"{child['metadata']['name']}-0",
                    "namespace": namespace,
                    "labels": labels,
                },
                "spec": template["spec"],
                "status": {"podIP": f"10.0.0.{i}", "phase": "Running"},
            }
        )
    return pods


def scraped(helm: Helm, pods: list[dict[str, Any]], *args: str) -> dict[str, list[dict[str, str]]]:
    """Each job's targets (their labels) after its relabelings."""
    monitors = [d for d in helm.template(*MONITORING, *args) if d["kind"] == "PodMonitor"]
    groups = scrape_config.pod_targets(pods)
    out = {}
    for job in (j for m in monitors for j in scrape_config.pod_monitor_jobs(m, DISCOVERY)):
        kept = (
            relabeled(job["relabel_configs"], {**g["labels"], "__address__": g["targets"][0]})
            for g in groups
        )
        out[job["job_name"]] = [labels for labels in kept if labels is not None]
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_engine_and_router_pod_is_one_target_with_its_deployment_and_role(
    helm: Helm, engine: str
) -> None:
    jobs = scraped(helm, rendered_pods(engine))
    engines = jobs["podMonitor/pdd-system/pdd-operator-engines/0"]
    routers = jobs["podMonitor/pdd-system/pdd-operator-routers/0"]
    assert sorted((t["pdd_dev_role"], t["pod"]) for t in engines) == [
        ("decode", "llama-decode-0"),
        ("prefill", "llama-prefill-0"),
    ]
    assert [(t["pdd_dev_role"], t["pod"]) for t in routers] == [("router", "llama-router-0")]
    assert {t["endpoint"] for t in engines} == {"http"}
    assert {t["endpoint"] for t in routers} == {"metrics"}
    for target in [*engines, *routers]:
        assert target["namespace"] == "team-a"
        assert target["pdd_dev_deployment"] == "llama"


def test_a_worker_rank_of_an_instance_is_not_scraped(helm: Helm) -> None:
    pods = rendered_pods("vllm")
    decode = next(p for p in pods if p["metadata"]["labels"]["pdd.dev/role"] == "decode")
    worker = {**decode, "metadata": {**decode["metadata"], "name": "llama-decode-0-1"}}
    worker["metadata"]["labels"] = {
        **decode["metadata"]["labels"],
        "pdd.dev/instance": "0",
        "apps.kubernetes.io/pod-index": "1",
    }
    engines = scraped(helm, [*pods, worker])["podMonitor/pdd-system/pdd-operator-engines/0"]
    assert "llama-decode-0-1" not in {t["pod"] for t in engines}


def test_the_watched_namespaces_bound_what_is_scraped(helm: Helm) -> None:
    args = ("--set", "watchNamespaces={team-b}")
    jobs = scraped(helm, rendered_pods("vllm", "team-a") + rendered_pods("sglang", "team-b"), *args)
    assert {t["namespace"] for targets in jobs.values() for t in targets} == {"team-b"}


def test_a_monitor_field_not_translated_is_refused() -> None:
    monitor = {
        "metadata": {"name": "m", "namespace": "n"},
        "spec": {
            "namespaceSelector": {"any": True},
            "selector": {},
            "podMetricsEndpoints": [{"port": "http", "honorLabels": True}],
        },
    }
    with pytest.raises(scrape_config.UnsupportedMonitor, match="honorLabels"):
        scrape_config.pod_monitor_jobs(monitor, DISCOVERY)
