"""Helpers of the chart tests: the pinned helm, server-side apply, ServiceAccount tokens."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from pdd_localcluster import LocalControlPlane
from pdd_localcluster.nodes import KUBELET_VERSION

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pdd-operator"
MANIFESTS = ROOT / "manifests"
FIELD_MANAGER = "pdd-chart-tests"


class Helm:
    """The pinned helm binary with its own (empty) config/cache/data dirs, so nothing from
    the user's helm setup (repositories, plugins) changes what the tests see."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        self._rendered: dict[tuple[str, ...], str] = {}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *args]
        if args[:1] == ("template",) and "--kube-version" not in args:
            # Without a cluster helm assumes 1.20, which the chart's kubeVersion refuses: the
            # pinned version, the local control plane's (and its simulated kubelets').
            cmd += ["--kube-version", KUBELET_VERSION]
        if self.kubeconfig is not None:
            cmd += ["--kubeconfig", str(self.kubeconfig)]
        result = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stderr}\n{result.stdout[-2000:]}"
            )
        return result

    def template(
        self, *args: str, namespace: str = "pdd-system", release: str = "pdd-operator"
    ) -> list[dict[str, Any]]:
        """`helm template` of the chart, as the list of its non-empty documents.

        Rendered once per argument list (the chart does not change during a run; many tests
        render the same values) but parsed on every call, so a test that edits its documents
        changes no other test's."""
        argv = ("template", release, str(CHART), "--namespace", namespace, *args)
        if argv not in self._rendered:
            self._rendered[argv] = self.run(*argv).stdout
        return [doc for doc in yaml.safe_load_all(self._rendered[argv]) if doc]


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    except ApiException as err:
        if err.status != 409:
            raise


def apply(dynamic: DynamicClient, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply of one object (what `kubectl apply --server-side` sends)."""
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    meta = obj["metadata"]
    kwargs: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
    if dry_run:
        kwargs["dry_run"] = "All"
    result = dynamic.server_side_apply(
        resource,
        body=obj,
        name=meta["name"],
        namespace=meta.get("namespace") if resource.namespaced else None,
        **kwargs,
    )
    return dict(result.to_dict())


def exists(dynamic: DynamicClient, obj: dict[str, Any]) -> bool:
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    meta = obj["metadata"]
    try:
        dynamic.get(
            resource,
            name=meta["name"],
            namespace=meta.get("namespace") if resource.namespaced else None,
        )
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def wait_crd_established(api: client.ApiClient, name: str, timeout: float = 30) -> None:
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not Established after {timeout}s")


def service_account_kubeconfig(
    control_plane: LocalControlPlane,
    api: client.ApiClient,
    namespace: str,
    name: str,
    path: Path,
) -> Path:
    """A kubeconfig holding a token of the ServiceAccount from the TokenRequest API: what a
    pod running as that ServiceAccount gets mounted."""
    request = {"spec": {"expirationSeconds": 3600}}
    token = client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request)
    ca = base64.b64encode(control_plane.ca_file.read_bytes()).decode()
    user = f"system:serviceaccount:{namespace}:{name}"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": control_plane.server, "certificate-authority-data": ca},
            }
        ],
        "users": [{"name": user, "user": {"token": token.status.token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def access(
    api: client.ApiClient,
    verb: str,
    resource: str,
    namespace: str = "",
    *,
    user: str,
    group: str = "",
    subresource: str = "",
    name: str = "",
) -> bool:
    """The SubjectAccessReview's answer: what `kubectl auth can-i --as=USER` prints."""
    reviewer = client.AuthorizationV1Api(api)
    namespace_of_user = user.split(":")[2]
    review = reviewer.create_subject_access_review(
        {
            "spec": {
                "user": user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{namespace_of_user}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace,
                    "name": name,
                },
            }
        }
    )
    return bool(review.status.allowed)


def delete_documents(dynamic: DynamicClient, docs: Sequence[dict[str, Any]]) -> None:
    """Delete each cluster-scoped object of `docs` (policies and bindings a test applied)."""
    for doc in docs:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        dynamic.delete(resource, name=doc["metadata"]["name"])


def manifest_documents(kustomization_dir: Path = MANIFESTS) -> list[dict[str, Any]]:
    """Every object `kubectl apply -k manifests/` would send: the kustomization lists plain
    resource files only (no patches or generators), so reading them in order is the same."""
    kustomization = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}, kustomization
    docs: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((kustomization_dir / resource).read_text()) if d)
    return docs


def kinds(docs: Sequence[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]
