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
SCALER_CRD_FILE = ROOT / "crds" / "pdd.dev_pddrolescalers.yaml"
# The operator's static user on the integration tier's control plane: its writes show in the
# audit log under this name.
OPERATOR_USER = "pdd-operator"
# A user with no rights until a test grants some (an operator confined by Roles).
CONFINED_USER = "pdd-confined"


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
    plane: LocalControlPlane, api: client.ApiClient, log_dir: Path
) -> Iterator[OperatorProcess]:
    """The CRDs installed and the real operator running against `plane` as OPERATOR_USER
    (resync every 2 s, so tests do not wait for the chart's default); killed after the block."""
    install_crd(api)
    identity = plane.kubeconfig_for(OPERATOR_USER)
    proc = OperatorProcess(identity, log_dir / "operator.log", resync_seconds=2.0).start()
    try:
        yield proc
    finally:
        proc.kill()
