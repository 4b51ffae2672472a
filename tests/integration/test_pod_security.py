"""The Pod Security level each deployment shape needs, as docs/security.md states it, checked
by the API server's own Pod Security admission: every example's pods are admitted in a
namespace enforcing the documented level, and its engine pods are refused one level stricter
for exactly the documented rule. Pods are created as server-side dry runs (the StatefulSet
controller would create the same pods from the same templates); test_failures.py has the
operator report such a refusal as PodsRefused."""

from __future__ import annotations

import copy
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.pod_security import ENFORCE, STRICTER, violated_rules
from helpers.waits import create_namespace_ready
from pdd_operator.offline import render_documents

ROOT = Path(__file__).resolve().parents[2]
SECURITY_DOC = ROOT / "docs" / "security.md"
LEVELS = ("privileged", "baseline", "restricted")
PRIVILEGED = {"privileged": True}


@dataclass(frozen=True)
class ShapeLevel:
    """A row of docs/security.md's Pod Security table."""

    shape: str
    examples: tuple[str, ...]
    level: str
    refused_at: str
    rule: str


def documented_levels() -> list[ShapeLevel]:
    section = SECURITY_DOC.read_text().split("## Pod Security levels", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # less header
    out = []
    for row in rows:
        shape, examples, level, refused_at, rule, _why = (
            cell.strip() for cell in row.strip("|").split("|")
        )
        out.append(
            ShapeLevel(
                shape=shape,
                examples=tuple(re.findall(r"`([^`]+)`", examples)),
                level=level.strip("`"),
                refused_at=refused_at.strip("`"),
                rule=rule.strip("`"),
            )
        )
    return out


SHAPES = documented_levels()


def test_the_table_covers_every_example_and_steps_one_level() -> None:
    documented = {example for row in SHAPES for example in row.examples}
    examples = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "examples").rglob("*.yaml")
        if "kind: PDDeployment" in p.read_text()
    }
    assert documented == examples
    assert {row.shape.split(" ")[0] for row in SHAPES} == {"NVLink", "RDMA", "multi-node"}
    for row in SHAPES:
        assert row.refused_at == STRICTER[row.level], row.shape


@pytest.fixture(scope="module")
def level_namespaces(api_client: client.ApiClient) -> Iterator[dict[str, str]]:
    """One namespace per level, each enforcing it."""
    core = client.CoreV1Api(api_client)
    created = {}
    for level in LEVELS:
        name = create_namespace_ready(api_client, f"t-psa-{level}-{secrets.token_hex(3)}")
        core.patch_namespace(name, {"metadata": {"labels": {ENFORCE: level}}})
        created[level] = name
    _wait_until_enforced(api_client, created["baseline"])
    yield created
    for name in created.values():
        core.delete_namespace(name)


def _wait_until_enforced(api: client.ApiClient, namespace: str) -> None:
    """Pod Security admission reads namespaces from its informer: the label takes a moment."""
    probe = {
        "metadata": {"name": "probe"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]
        },
    }
    deadline = time.monotonic() + 20
    while _admission_error(api, namespace, probe) == "":
        assert time.monotonic() < deadline, f"{namespace} does not enforce its level"
        time.sleep(0.2)


def _admission_error(api: client.ApiClient, namespace: str, pod: dict[str, Any]) -> str:
    """The API server's refusal of the pod (a dry run), or "" when it admits it."""
    try:
        client.CoreV1Api(api).create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as e:
        assert e.status == 403, e.body
        return str(yaml.safe_load(e.body)["message"])
    return ""


def _example(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]


def _rendered_pods(
    documents: list[dict[str, Any]], namespace: str, api: client.ApiClient
) -> list[dict[str, Any]]:
    """The PDDeployments' pods as their workloads would create them in `namespace`, after
    creating the ServiceAccounts they run as (admission refuses a pod whose account is
    missing)."""
    documents = copy.deepcopy(documents)
    for document in documents:
        document["metadata"]["namespace"] = namespace
    (rendered,) = render_documents(documents)
    core = client.CoreV1Api(api)
    pods = []
    for child in rendered.children:
        if child["kind"] == "ServiceAccount":
            account = copy.deepcopy(child)
            account["metadata"] = {"name": child["metadata"]["name"]}
            try:
                core.create_namespaced_service_account(namespace, account)
            except ApiException as e:
                if e.status != 409:
                    raise
        if child["kind"] in ("StatefulSet", "Deployment"):
            template = child["spec"]["template"]
            metadata = {**template["metadata"], "name": f"{child['metadata']['name']}-0"}
            # The gang's Workload reference is alpha (test_kubectl's NOT_SERVED_HERE) and
            # the client refuses it; Pod Security does not read it.
            spec = {k: v for k, v in template["spec"].items() if k != "workloadRef"}
            pods.append({"metadata": metadata, "spec": spec})
    return pods


def _is_router(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"]["containers"][0]["name"] == "router")


@pytest.mark.parametrize(
    "shape, example",
    [(row, example) for row in SHAPES for example in row.examples],
    ids=lambda v: v if isinstance(v, str) else v.shape.split(" ")[0],
)
def test_an_example_is_admitted_at_its_documented_level_and_refused_one_stricter(
    api_client: client.ApiClient, level_namespaces: dict[str, str], shape: ShapeLevel, example: str
) -> None:
    at_level = level_namespaces[shape.level]
    for pod in _rendered_pods(_example(example), at_level, api_client):
        assert _admission_error(api_client, at_level, pod) == "", pod["metadata"]["name"]

    stricter = level_namespaces[shape.refused_at]
    pods = _rendered_pods(_example(example), stricter, api_client)
    engines = [pod for pod in pods if not _is_router(pod)]
    assert engines
    for pod in engines:
        refusal = _admission_error(api_client, stricter, pod)
        assert f'violates PodSecurity "{shape.refused_at}:latest"' in refusal, pod
        assert violated_rules(refusal) == {shape.rule}, refusal


@pytest.mark.parametrize("example", sorted({e for row in SHAPES for e in row.examples}))
def test_the_router_passes_restricted_in_every_shape(
    api_client: client.ApiClient, level_namespaces: dict[str, str], example: str
) -> None:
    restricted = level_namespaces["restricted"]
    routers = [
        p for p in _rendered_pods(_example(example), restricted, api_client) if _is_router(p)
    ]
    assert routers, f"{example} renders no router"
    for pod in routers:
        assert _admission_error(api_client, restricted, pod) == ""


def test_an_engine_that_says_it_runs_as_non_root_passes_restricted_without_rdma(
    api_client: client.ApiClient, level_namespaces: dict[str, str]
) -> None:
    """What docs/security.md tells a user whose engine image runs as non-root."""
    restricted = level_namespaces["restricted"]
    nvlink = next(row for row in SHAPES if row.shape.startswith("NVLink"))
    documents = _example(nvlink.examples[0])
    engine = {"name": "engine", "securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}
    for role in ("prefill", "decode"):
        documents[0]["spec"][role]["podTemplate"] = {"spec": {"containers": [engine]}}
    for pod in _rendered_pods(documents, restricted, api_client):
        assert _admission_error(api_client, restricted, pod) == "", pod["metadata"]["name"]
