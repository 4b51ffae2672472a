"""``python -m pdd_sidecar`` run as a pod's nixl-sidecar container, for integration tests on the
local control plane: the command and environment the operator rendered, the pod identity from
the real pod, the deployment's token, and the API identity of the rendered ServiceAccount.
Each sidecar listens on its pod's simulated IP (198.18.0.0/15) mapped into loopback by a CIDR
``PDD_PEER_ADDRESS_MAP``; nothing ever dials a simulated address."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client

from helpers.operator_proc import ROOT
from helpers.waits import wait_for

# Every simulated pod and node address (the node simulator's 198.18.0.0/15) onto loopback,
# host bits kept: pods created later, with addresses nobody knows yet, are mapped too.
SIMULATED, LOOPBACK = ipaddress.ip_network("198.18.0.0/15"), ipaddress.ip_network("127.18.0.0/15")
ADDRESS_MAP = f"{SIMULATED}={LOOPBACK}"
# Set before any sidecar starts. UCX on loopback: the rendered UCX_TLS names CUDA transports.
LOCAL_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "PDD_PEER_ADDRESS_MAP": ADDRESS_MAP}
DOWNWARD = ("POD_NAME", "POD_UID", "POD_IP")

T = TypeVar("T")


def loopback_for(pod_ip: str) -> str:
    address = ipaddress.ip_address(pod_ip)
    assert address in SIMULATED, f"{pod_ip} is not a simulated pod IP"
    return str(LOOPBACK.network_address + (int(address) - int(SIMULATED.network_address)))


def port_free_on(hosts: list[str]) -> int:
    """One port (peers dial every sidecar on the same one) free on each of ``hosts``."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        try:
            for host in hosts:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every sidecar address")


class Sidecar:
    """``python -m pdd_sidecar`` playing one pod's nixl-sidecar container."""

    def __init__(
        self, pod: client.V1Pod, rendered: client.V1Container, port: int, token: str, env: dict
    ) -> None:
        self.pod, self.uid, self.ip = pod.metadata.name, pod.metadata.uid, pod.status.pod_ip
        self.host, self.port, self.token = loopback_for(self.ip), port, token
        self.url = f"http://{self.host}:{port}"
        self.env, self.rendered = env, rendered
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.terminated = False

    def start(self, log_dir: Path, token_file: Path) -> Sidecar:
        # The rendered command, run from this checkout; later flags win with argparse.
        assert self.rendered.command[:2] == ["pdd-sidecar", "serve"], self.rendered.command
        command = [
            sys.executable, "-m", "pdd_sidecar", *self.rendered.command[1:],
            "--host", self.host, "--port", str(self.port), "--token-file", str(token_file),
        ]  # fmt: skip
        self.log_path = log_dir / f"sidecar-{self.pod}-{self.uid[:8]}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"sidecar {self.pod} exited: {self.log()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer,
        ):
            return bool(answer.status == 200)
        return False

    def call(self, method: str, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-2500:]

    def terminate(self) -> None:
        """SIGTERM once: a second one could land after the sidecar's handler is gone."""
        if self.proc is not None and self.proc.poll() is None and not self.terminated:
            self.proc.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self, grace_s: float = 10) -> None:
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_sidecars() -> Iterator[list[Sidecar]]:
    """Every sidecar a test starts; all stopped at the end, whatever happened."""
    started: list[Sidecar] = []
    try:
        yield started
    finally:
        for sidecar in started:  # all at once: each may take seconds to wind down
            sidecar.terminate()
        for sidecar in started:
            sidecar.stop()
            # Shown by pytest only when the test failed.
            rc = sidecar.proc.returncode if sidecar.proc else None
            print(f"--- sidecar {sidecar.pod} ({sidecar.uid}) exit {rc}\n{sidecar.log()}")


def deployment_token(core: client.CoreV1Api, ns: str, name: str, uid: str, path: Path) -> str:
    """The deployment's sidecar token, also written to `path` (the sidecar's token file)."""
    secret = core.read_namespaced_secret(f"{name}-sidecar-token-{uid[:8]}", ns)
    token = base64.b64decode(secret.data["token"]).decode().strip()
    path.write_text(token)
    path.chmod(0o600)
    return token


def service_account_kubeconfig(
    control_plane: Any, core: client.CoreV1Api, ns: str, name: str, path: Path
) -> Path:
    """A kubeconfig holding a TokenRequest token of the rendered sidecar ServiceAccount of
    the PDDeployment `name`."""
    account = f"{name}-sidecar"
    wait_for(lambda: core.read_namespaced_service_account(account, ns), 30, what=account)
    issued = core.create_namespaced_service_account_token(
        account, ns, {"spec": {"expirationSeconds": 3600}}
    )
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": control_plane.server,
            "certificate-authority": str(control_plane.ca_file)}}],
        "users": [{"name": account, "user": {"token": issued.status.token}}],
        "contexts": [{"name": account, "context": {
            "cluster": "local", "user": account, "namespace": ns}}],
        "current-context": account,
    }  # fmt: skip
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def rendered_sidecar(api: client.ApiClient, ns: str, statefulset: str) -> client.V1Container:
    sts = client.AppsV1Api(api).read_namespaced_stateful_set(statefulset, ns)
    return next(c for c in sts.spec.template.spec.containers if c.name == "nixl-sidecar")


def sidecar_env(rendered: client.V1Container, pod: client.V1Pod, kubeconfig: Path) -> dict:
    """The container's rendered environment with the downward API filled from the real pod;
    UCX and the address map made local (the rendered UCX_TLS names CUDA transports)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PDD_", "POD_", "UCX_"))}
    env["PYTHONPATH"] = str(ROOT / "operator")
    env["KUBECONFIG"] = str(kubeconfig)
    for var in rendered.env:
        if var.value is not None and not var.name.startswith("UCX_"):
            env[var.name] = var.value
    fields = {"metadata.name": pod.metadata.name, "metadata.uid": pod.metadata.uid,
              "status.podIP": pod.status.pod_ip}  # fmt: skip
    for var in rendered.env:
        if var.value_from is not None and var.value_from.field_ref is not None:
            env[var.name] = fields[var.value_from.field_ref.field_path]
    assert all(env.get(name) for name in DOWNWARD), "the rendered downward API env"
    env.update(LOCAL_ENV)
    return env


def running_pod(core: client.CoreV1Api, ns: str, name: str, not_uid: str = "") -> client.V1Pod:
    def check() -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, ns)
        fresh = pod.metadata.uid != not_uid and pod.metadata.deletion_timestamp is None
        return pod if fresh and pod.status.phase == "Running" and pod.status.pod_ip else None

    return wait_for(check, 60, what=f"pod {name} running with an IP")


def until(check: Callable[[], T], timeout: float, what: str, sidecars: list[Sidecar]) -> T:
    """wait_for, with the sidecars' log tails in the failure."""
    try:
        return wait_for(check, timeout, interval=0.3, what=what)
    except AssertionError as err:
        logs = "\n".join(f"--- {s.pod} ({s.uid[:8]})\n{s.log()}" for s in sidecars)
        raise AssertionError(f"{err}\n{logs}") from None
