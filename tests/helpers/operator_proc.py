"""Run the real operator (`pdd-operator run`) as a subprocess against the test control plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers import waits
from pdd_localcluster import LocalControlPlane

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "pdd.dev_pddeployments.yaml"
ACCESS_POLICY_FILE = ROOT / "manifests" / "access-policy.yaml"
# The chart's name-guard policy and its binding, as `manifests/` names them; the operator
# reads them at start-up when this is its --name-guard-policy.
NAME_GUARD_POLICY = "pdd-operator-child-names"
NAME_GUARD_ENV = {"PDD_NAME_GUARD_POLICY": NAME_GUARD_POLICY}
SCALER_CRD_FILE = ROOT / "crds" / "pdd.dev_pddrolescalers.yaml"
# The operator's static user on the integration tier's control plane: its writes show in the
# audit log under this name.
OPERATOR_USER = "pdd-operator"
# A user with no rights until a test grants some (an operator confined by Roles).
CONFINED_USER = "pdd-confined"
# The second replica of the leader-election test: its writes show in the audit log apart from
# the first replica's.
SECOND_OPERATOR_USER = "pdd-operator-2"


def load_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


def free_port() -> int:
    return waits.free_port("127.0.0.1")


def install_crd(api: client.ApiClient, crd: dict[str, Any] | None = None) -> None:
    """The generated CRDs (PDDeployment and PDDRoleScaler), or a variant of the PDDeployment
    CRD (`crd`), created or replaced, and Established."""
    if crd is None:
        _install_one(api, yaml.safe_load(SCALER_CRD_FILE.read_text()))
    _install_one(api, crd if crd is not None else load_crd())


def _install_one(api: client.ApiClient, crd: dict[str, Any]) -> None:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as err:
        if err.status != 409:
            raise
        current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
    deadline = time.time() + 30
    while time.time() < deadline:
        current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        conditions = current.status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise TimeoutError("CRD not established")


def install_name_guard(api: client.ApiClient, probe_namespace: str = "default") -> None:
    """The chart's name-guard policy and binding (from `manifests/`), created or replaced,
    once the API server enforces them (its admission plugin loads policies asynchronously):
    until a probe Service in `probe_namespace` may no longer be made a PDDeployment's child."""
    admission = client.AdmissionregistrationV1Api(api)
    for doc in yaml.safe_load_all(ACCESS_POLICY_FILE.read_text()):
        if doc and doc["metadata"]["name"] == NAME_GUARD_POLICY:
            _create_or_replace_policy(admission, doc)
    core = client.CoreV1Api(api)
    probe = client.V1Service(
        metadata=client.V1ObjectMeta(name="name-guard-probe"),
        spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=80)]),
    )
    try:
        core.create_namespaced_service(probe_namespace, probe)
    except ApiException as err:
        if err.status != 409:
            raise
    claim = {
        "metadata": {
            "ownerReferences": [
                {"apiVersion": "pdd.dev/v1alpha1", "kind": "PDDeployment", "name": "probe",
                 "uid": "00000000-0000-0000-0000-000000000000", "controller": True}
            ]
        }
    }  # fmt: skip
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            try:  # a dry run: admission answers, nothing is stored
                core.patch_namespaced_service(
                    "name-guard-probe", probe_namespace, claim, dry_run="All"
                )
            except ApiException as err:
                if err.status == 422 and "pdd.dev/name-taken" in str(err.body):
                    return
                raise
            time.sleep(0.2)
        raise TimeoutError("the name-guard policy was not enforced within 60 s")
    finally:
        core.delete_namespaced_service("name-guard-probe", probe_namespace)


def remove_name_guard(api: client.ApiClient) -> None:
    """The policy and binding `install_name_guard` made, those of them that exist."""
    admission = client.AdmissionregistrationV1Api(api)
    for kind in ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"):
        _unless(404, _admission_call(admission, "delete", kind), NAME_GUARD_POLICY)


def _create_or_replace_policy(admission: Any, doc: dict[str, Any]) -> None:
    name, kind = doc["metadata"]["name"], doc["kind"]
    if _unless(409, _admission_call(admission, "create", kind), doc):
        return
    current = _admission_call(admission, "read", kind)(name)
    doc["metadata"]["resourceVersion"] = current.metadata.resource_version
    _admission_call(admission, "replace", kind)(name, doc)


def _admission_call(admission: Any, verb: str, kind: str) -> Any:
    """The client's method for `verb` on a ValidatingAdmissionPolicy or its binding."""
    suffix = {
        "ValidatingAdmissionPolicy": "validating_admission_policy",
        "ValidatingAdmissionPolicyBinding": "validating_admission_policy_binding",
    }[kind]
    return getattr(admission, f"{verb}_{suffix}")


def _unless(status: int, call: Any, *args: Any) -> bool:
    """`call(*args)`; False where the API server answered `status` instead."""
    try:
        call(*args)
    except ApiException as err:
        if err.status != status:
            raise
        return False
    return True


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        resync_seconds: float = 300.0,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), **self.extra_env}
        cmd = [
            sys.executable,
            "-m",
            "pdd_operator.cli",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--metrics-port",
            str(self.metrics_port),
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--resync-seconds",
            str(self.resync_seconds),
        ]
        self.log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_alive()
        return self

    def _wait_alive(self, timeout: float = 60) -> None:
        import urllib.request

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"operator exited: {self.tail()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1
                ):
                    return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"operator not alive: {self.tail()}")

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every series of the metric `name` the operator serves now: (labels, value)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text = r.read().decode()
        return [
            (dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def metric(self, name: str) -> float:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total


@contextmanager
def operator_on(
    plane: LocalControlPlane,
    api: client.ApiClient,
    log_dir: Path,
    name_guard: bool = False,
    resync_seconds: float = 2.0,
) -> Iterator[OperatorProcess]:
    """The CRDs installed and the real operator running against `plane` as OPERATOR_USER
    (resync every 2 s, so tests do not wait for the chart's default, unless a test needs the
    chart's); killed after the block.
    `name_guard`: with the chart's name-guard policy installed and named to the operator, as
    a Helm install runs it (removed after the block)."""
    install_crd(api)
    identity = plane.kubeconfig_for(OPERATOR_USER)
    env = NAME_GUARD_ENV if name_guard else None
    try:
        if name_guard:
            install_name_guard(api)
        log = log_dir / "operator.log"
        proc = OperatorProcess(identity, log, resync_seconds, extra_env=env).start()
        try:
            yield proc
        finally:
            proc.kill()
    finally:
        if name_guard:  # also after a failed install: later modules run without it
            remove_name_guard(api)
