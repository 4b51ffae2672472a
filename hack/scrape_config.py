"""Prometheus scrape jobs from the chart's PodMonitors, as the Prometheus Operator generates
them (pure; hack/dashboard_picture.py runs Prometheus with them, no Operator needed).

What the chart's monitors use is translated, and nothing else is accepted: a namespace
selector (`any` or `matchNames`), a pod selector (`matchLabels`, `matchExpressions` with
`In`), `podTargetLabels`, and per endpoint a named `port`, `path`, `interval`,
`scrapeTimeout` and `relabelings`. The jobs keep the pods (from kubernetes_sd, or
pod_targets() with its meta labels) the monitor selects, on the named port, label them with
`namespace`, `pod`, `container`, `job`, `endpoint` and the pod's target labels (their names
sanitized as the Operator does: `pdd.dev/role` becomes `pdd_dev_role`), then apply the
endpoint's relabelings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Json = dict[str, Any]
_KNOWN_SPEC = {"namespaceSelector", "selector", "podTargetLabels", "podMetricsEndpoints"}
_KNOWN_ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "relabelings"}
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


class UnsupportedMonitor(ValueError):
    """The monitor uses a field this translation does not know: it would scrape otherwise."""


def sanitized(label: str) -> str:
    """A Kubernetes label name as a Prometheus label name (what service discovery does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def pod_monitor_jobs(monitor: Mapping[str, Any], discovery: Mapping[str, Any]) -> list[Json]:
    """One scrape job per endpoint of a PodMonitor. `discovery`: the job's service discovery,
    which gives each pod's container ports with kubernetes_sd's meta labels (kubernetes_sd
    itself: {"kubernetes_sd_configs": [{"role": "pod", ...}]}; or pod_targets() written to a
    file: {"file_sd_configs": [{"files": [...]}]})."""
    spec, meta = monitor["spec"], monitor["metadata"]
    _known(spec, _KNOWN_SPEC, "spec")
    keep = [
        *_namespace_scope(spec.get("namespaceSelector", {})),
        *_selected(spec["selector"]),
        # The Operator's: no target for a pod that has finished.
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
         "action": "drop"},
    ]  # fmt: skip
    jobs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        _known(endpoint, _KNOWN_ENDPOINT, "podMetricsEndpoints[]")
        relabel = [
            *keep,
            _keep(["__meta_kubernetes_pod_container_port_name"], endpoint["port"]),
            *_target_labels(spec.get("podTargetLabels", [])),
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *(_relabeling(r) for r in endpoint.get("relabelings", [])),
        ]
        job: Json = {
            "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "metrics_path": endpoint.get("path", "/metrics"),
            **discovery,
            "relabel_configs": relabel,
        }
        for key, name in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")):
            if key in endpoint:
                job[name] = endpoint[key]
        jobs.append(job)
    return jobs


def pod_targets(pods: Sequence[Mapping[str, Any]]) -> list[Json]:
    """file_sd target groups for pods (as the API returns them): one per container port, with
    the meta labels kubernetes_sd's pod role gives (those the translated jobs read)."""
    groups = []
    for pod in pods:
        meta, ip = pod["metadata"], pod.get("status", {}).get("podIP")
        if not ip:
            continue
        labels = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_phase": pod.get("status", {}).get("phase", ""),
        }
        for key, value in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_pod_label_{sanitized(key)}"] = value
            labels[f"__meta_kubernetes_pod_labelpresent_{sanitized(key)}"] = "true"
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                groups.append(
                    {
                        "targets": [f"{ip}:{port['containerPort']}"],
                        "labels": {
                            **labels,
                            "__meta_kubernetes_pod_container_name": container["name"],
                            "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        },
                    }
                )
    return groups


def _known(fields: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UnsupportedMonitor(f"{where}: {', '.join(unknown)} not translated")


def _namespace_scope(selector: Mapping[str, Any]) -> list[Json]:
    """`any: true` (every namespace) or `matchNames`; an empty selector (the monitor's own
    namespace) the chart never renders."""
    if selector.get("any"):
        return []
    if names := selector.get("matchNames"):
        return [_keep(["__meta_kubernetes_namespace"], "|".join(re.escape(n) for n in names))]
    raise UnsupportedMonitor("namespaceSelector: only `any` and `matchNames` are translated")


def _selected(selector: Mapping[str, Any]) -> list[Json]:
    """Keep the pods whose labels the selector matches (present, and one of the values)."""
    rules = []
    for key, value in selector.get("matchLabels", {}).items():
        rules.append(_label_in(key, [value]))
    for expression in selector.get("matchExpressions", []):
        if expression["operator"] != "In":
            raise UnsupportedMonitor(f"matchExpressions: {expression['operator']} not translated")
        rules.append(_label_in(expression["key"], expression["values"]))
    return rules


def _label_in(key: str, values: Sequence[str]) -> Json:
    label = sanitized(key)
    return _keep(
        [f"__meta_kubernetes_pod_label_{label}", f"__meta_kubernetes_pod_labelpresent_{label}"],
        f"({'|'.join(re.escape(v) for v in values)});true",
    )


def _keep(sources: list[str], regex: str) -> Json:
    return {"source_labels": sources, "regex": regex, "action": "keep"}


def _target_labels(labels: Sequence[str]) -> list[Json]:
    standard = [
        ("__meta_kubernetes_namespace", "namespace"),
        ("__meta_kubernetes_pod_name", "pod"),
        ("__meta_kubernetes_pod_container_name", "container"),
    ]
    pod_labels = [(f"__meta_kubernetes_pod_label_{sanitized(k)}", sanitized(k)) for k in labels]
    return [
        {"source_labels": [source], "target_label": target, "regex": "(.+)", "replacement": "$1"}
        for source, target in [*standard, *pod_labels]
    ]


def _relabeling(rule: Mapping[str, Any]) -> Json:
    unknown = sorted(set(rule) - set(_RELABEL_KEYS))
    if unknown:
        raise UnsupportedMonitor(f"relabelings: {', '.join(unknown)} not translated")
    return {_RELABEL_KEYS[key]: value for key, value in rule.items()}
