"""What a user types, with the real kubectl (built at the API server's version) against the
real control plane: the short names and the category, describe, the state of a PDDeployment
no operator has looked at yet, and `pdd-operator render | kubectl apply --dry-run=server`
for every example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from helpers.operator_proc import install_crd
from pdd_localcluster import LocalControlPlane
from pdd_localcluster.controlplane import resolve_bin_dir
from pdd_operator.api import v1alpha1 as api

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p for p in (ROOT / "examples").rglob("*.yaml") if f"kind: {api.KIND}" in p.read_text()
)
# APIs an example's render may need that this control plane does not serve, and why: their
# objects are checked by the test of that feature (test_multinode's plane has the gates).
NOT_SERVED_HERE = {
    "scheduling.k8s.io/v1alpha1": "gang: native needs the GenericWorkload and GangScheduling "
    "feature gates (alpha in Kubernetes 1.35)"
}


@pytest.fixture(scope="module")
def kubectl(control_plane: LocalControlPlane, api_client: client.ApiClient) -> Any:
    install_crd(api_client)
    binary = resolve_bin_dir() / "kubectl"

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(binary), "--kubeconfig", str(control_plane.kubeconfig), *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)

    return run


def _pdd(name: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "test-org/tiny-model"},
            "engine": {"type": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
        },
    }


def _scaler(name: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.SCALER_KIND,
        "metadata": {"name": name},
        "spec": {"replicas": 1},
    }


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args[3:]}: {result.stderr.strip()}"
    return result.stdout


def test_every_short_name_gets_and_describes_one_object_and_the_category_lists_both(
    kubectl: Any, namespace: str
) -> None:
    """A category named like a short name wins over it in kubectl: `kubectl get pdd NAME`
    then asked for two kinds and failed ("you must specify only one resource")."""
    _ok(kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(_pdd("llama"))))
    _ok(kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(_scaler("llama-decode"))))
    for short in api.SHORT_NAMES:
        got = _ok(kubectl("-n", namespace, "get", short, "llama", "-o", "name"))
        assert got.strip() == f"{api.SINGULAR}.{api.GROUP}/llama"
        described = _ok(kubectl("-n", namespace, "describe", short, "llama"))
        assert f"Kind:         {api.KIND}" in described
    for short in api.SCALER_SHORT_NAMES:
        got = _ok(kubectl("-n", namespace, "get", short, "llama-decode", "-o", "name"))
        assert got.strip() == f"{api.SCALER_SINGULAR}.{api.GROUP}/llama-decode"
    listed = _ok(kubectl("-n", namespace, "get", api.CATEGORY, "-o", "name")).split()
    assert sorted(listed) == sorted(
        [f"{api.SINGULAR}.{api.GROUP}/llama", f"{api.SCALER_SINGULAR}.{api.GROUP}/llama-decode"]
    )


def test_a_pdddeployment_no_operator_has_seen_reads_as_not_yet_observed(
    kubectl: Any, namespace: str
) -> None:
    """kstatus (Flux's health checks) reads an object without status as Current; the CRD's
    status default makes it an unobserved generation, so it reads InProgress until the
    operator writes a status."""
    _ok(kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(_pdd("unseen"))))
    body = json.loads(_ok(kubectl("-n", namespace, "get", "pdd", "unseen", "-o", "json")))
    assert body["status"]["observedGeneration"] == -1 < body["metadata"]["generation"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_rendered_examples_pass_kubectls_own_reading_and_a_server_dry_run(
    kubectl: Any, example: Path
) -> None:
    """`pdd-operator render -f EXAMPLE | kubectl apply --dry-run=server -f -`, as a GitOps
    repository built from render's output would be applied. kubectl reads YAML 1.1, where a
    bare `y` is a boolean: an env value printed so was refused."""
    rendered = subprocess.run(
        [sys.executable, "-m", "pdd_operator.cli", "render", "-f", str(example)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=True,
    ).stdout  # fmt: skip
    served = set(_ok(kubectl("api-versions")).split())
    documents = [doc for doc in yaml.safe_load_all(rendered) if doc]
    unserved = {doc["apiVersion"] for doc in documents} - served
    assert unserved <= set(NOT_SERVED_HERE), f"{example.name} needs {unserved}"
    for ns in {(doc.get("metadata") or {}).get("namespace", "default") for doc in documents}:
        kubectl("create", "namespace", ns)  # an example's own namespace; may exist already
    # The text as render printed it, less the documents of an API this plane lacks: what is
    # applied is what a GitOps repository would hold, byte for byte.
    kept = [
        text
        for text in rendered.split("\n---\n")
        if (yaml.safe_load(text) or {}).get("apiVersion") not in unserved
    ]
    out = _ok(
        kubectl("apply", "--dry-run=server", "--server-side", "-f", "-", stdin="\n---\n".join(kept))
    )
    assert "serverside-applied (server dry run)" in out, out
