"""The operator's own image, run as the chart's Deployment runs it (issue 40): the images
built by `hack/images.sh` (cached by what goes into them), and a container of the operator
image started with the Deployment's args, user, read-only root file system, dropped
capabilities and /tmp volume, with a ServiceAccount token mounted where the kubernetes client
looks for one in a pod: the in-cluster configuration, not a kubeconfig.

What differs from a pod: the container uses the host's network (no pod network here), so the
API server is reached on loopback through KUBERNETES_SERVICE_HOST/PORT (the kubelet sets those
to the `kubernetes` Service), and the metrics and liveness ports are free ports of loopback
instead of the chart's 8081/8080.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client

from helpers.waits import free_port, wait_for
from pdd_localcluster import LocalControlPlane

ROOT = Path(__file__).resolve().parents[2]
IMAGES_SCRIPT = ROOT / "hack" / "images.sh"
# In-cluster configuration: where the kubelet mounts the ServiceAccount's token.
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def engine() -> list[str]:
    """The container engine hack/images.sh builds with: $CONTAINER_ENGINE, else docker where
    it answers, else podman."""
    if chosen := os.environ.get("CONTAINER_ENGINE"):
        return [chosen]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        return [docker]
    return ["podman"]


def engine_env() -> dict[str, str]:
    """podman reads this machine's settings from hack/containers.conf (it says why)."""
    return {**os.environ, "CONTAINERS_CONF": str(ROOT / "hack" / "containers.conf")}


def build_images() -> str:
    """`hack/images.sh`: builds what changed and prints the table of images, sizes and
    contents, which this returns."""
    result = subprocess.run(
        ["bash", str(IMAGES_SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=1500
    )
    assert result.returncode == 0, f"hack/images.sh failed:\n{result.stderr[-4000:]}"
    return result.stdout


def run_image(image: str, args: Sequence[str], *, entrypoint: str = "") -> str:
    """`args` run in `image` as the chart runs its containers (user 65532, read-only root,
    no capabilities, no privilege escalation, no network); its output, checked."""
    cmd = [*engine(), "run", "--rm", "--network", "none", *hardening_flags(65532)]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint]
    result = subprocess.run(
        [*cmd, image, *args], capture_output=True, text=True, env=engine_env(), timeout=120
    )
    assert result.returncode == 0, f"{image} {' '.join(args)}: {result.stderr[-2000:]}"
    return result.stdout + result.stderr


def hardening_flags(user: int) -> list[str]:
    return [
        "--user", f"{user}:{user}", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
    ]  # fmt: skip


class OperatorContainer:
    """The operator image's container, started from the chart's Deployment `deployment`."""

    def __init__(self, deployment: dict[str, Any], token_dir: Path, plane: LocalControlPlane):
        self.deployment = deployment
        self.token_dir = token_dir
        self.plane = plane
        self.name = f"pdd-operator-image-test-{secrets.token_hex(3)}"
        self.liveness_port = free_port("127.0.0.1")
        self.metrics_port = free_port("127.0.0.1")

    @property
    def container(self) -> dict[str, Any]:
        [container] = self.deployment["spec"]["template"]["spec"]["containers"]
        return dict(container)

    @property
    def image(self) -> str:
        return str(self.container["image"])

    def args(self) -> list[str]:
        """The Deployment's args, the two listening ports moved to free ones of loopback."""
        moved = {
            "--metrics-port": f"--metrics-port={self.metrics_port}",
            "--liveness": f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
        }
        return [moved.get(arg.split("=", 1)[0], arg) for arg in self.container["args"]]

    def run_flags(self) -> list[str]:
        pod = self.deployment["spec"]["template"]["spec"]
        user = pod["securityContext"]["runAsUser"]
        context = self.container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        api = urlsplit(self.plane.server)
        mounts = [m["mountPath"] for m in self.container.get("volumeMounts", [])]
        return [
            "--name", self.name, "--network", "host", *hardening_flags(user),
            *[flag for path in mounts for flag in ("--tmpfs", f"{path}:size=64m")],
            "--volume", f"{self.token_dir}:{TOKEN_DIR}:ro",
            "--env", f"KUBERNETES_SERVICE_HOST={api.hostname}",
            "--env", f"KUBERNETES_SERVICE_PORT={api.port}",
        ]  # fmt: skip

    def start(self) -> OperatorContainer:
        cmd = [*engine(), "run", "--detach", *self.run_flags(), self.image, *self.args()]
        result = subprocess.run(cmd, capture_output=True, text=True, env=engine_env())
        assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stderr}"
        try:
            wait_for(self.alive, 60, what="the operator container to answer /healthz")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.logs}") from None
        return self

    def alive(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            with urllib.request.urlopen(url, timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    @property
    def logs(self) -> str:
        result = subprocess.run(
            [*engine(), "logs", self.name], capture_output=True, text=True, env=engine_env()
        )
        return (result.stdout + result.stderr)[-4000:]

    def stop(self) -> None:
        subprocess.run(
            [*engine(), "rm", "--force", "--time", "10", self.name],
            capture_output=True,
            env=engine_env(),
        )


def mounted_token(
    api: client.ApiClient, plane: LocalControlPlane, namespace: str, account: str, into: Path
) -> Path:
    """What the kubelet mounts into a pod of `account`: a TokenRequest token, the cluster's CA
    and the namespace, readable by the container's user."""
    request = {"spec": {"expirationSeconds": 3600}}
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        account, namespace, request
    )
    into.mkdir(mode=0o755, exist_ok=True)
    files = {
        "token": token.status.token,
        "ca.crt": plane.ca_file.read_text(),
        "namespace": namespace,
    }
    for name, text in files.items():
        (into / name).write_text(text)
        (into / name).chmod(0o644)
    into.chmod(0o755)
    return into


@contextmanager
def operator_container(
    deployment: dict[str, Any], token_dir: Path, plane: LocalControlPlane
) -> Iterator[OperatorContainer]:
    container = OperatorContainer(deployment, token_dir, plane)
    try:
        yield container.start()
    finally:
        container.stop()
