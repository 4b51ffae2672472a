"""`PodRuntime`: runs the pods of known images as local processes for the node simulator.

The API side of a kubelet lives here: Secrets and ConfigMaps read for volumes and env,
service-account tokens from the TokenRequest API bound to the pod, and the `kubernetes`
service variables pointing at the real apiserver (the runtime stands in for kube-proxy there).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kubernetes.client.exceptions import ApiException

from pdd_localcluster.kubejson import KubeJson
from pdd_localcluster.podstatus import InitFailure, PodRun
from pdd_localcluster.runtime import images as image_table
from pdd_localcluster.runtime import netshim
from pdd_localcluster.runtime.podrunner import PodRunner, PodServices, RuntimeOptions, pod_dir_name
from pdd_localcluster.runtime.volumes import Mount, VolumeError, decode_object_data

log = logging.getLogger(__name__)
Json = dict[str, Any]

ROOT_CA_CONFIGMAP = "kube-root-ca.crt"


class PodRuntime:
    """Runs pods whose images are all in `images`; `runs(pod)` says which. Thread-safe."""

    def __init__(
        self,
        kubeconfig: Path | str,
        state_dir: Path | str,
        *,
        images: Mapping[str, image_table.ImageFs] = image_table.KNOWN_IMAGES,
        options: RuntimeOptions | None = None,
        node_hardware: Mapping[str, Path] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.images = dict(images)
        self.options = options or RuntimeOptions()
        self._kube = KubeJson(kubeconfig, pool_size=8)
        cfg = self._kube.api.configuration
        self._ca_file = Path(cfg.ssl_ca_cert) if cfg.ssl_ca_cert else None
        self._service_env = service_env(cfg.host)
        self._netshim = netshim.build(self.state_dir / "cache")
        # Node name -> a topology fixture (tests/fixtures/topology/*) shown as its hardware.
        self._node_hardware = dict(node_hardware or {})
        self._runners: dict[str, PodRunner] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------- for the simulator

    def unknown_images(self, pod: Json) -> list[str]:
        return image_table.unknown_images(pod, self.images)

    def runs(self, pod: Json) -> bool:
        return not self.unknown_images(pod)

    def pod_dir(self, pod: Json) -> Path:
        return self.state_dir / "pods" / pod_dir_name(pod)

    def start(self, pod: Json, pod_ip: str, host_ip: str, changed: Callable[[], None]) -> None:
        uid = pod["metadata"]["uid"]
        services = PodServices(
            lookup=lambda kind, name: self._object_data(pod, kind, name),
            issue_token=self._issue_token,
            service_env=self._service_env,
            netshim=self._netshim,
            images=self.images,
            options=self.options,
            changed=changed,
            report=lambda kind, reason, message: self._report(pod, kind, reason, message),
            node_mounts=hardware_mounts(self._node_hardware.get(pod["spec"].get("nodeName", ""))),
        )
        runner = PodRunner(pod, pod_ip, host_ip, self.pod_dir(pod), services)
        with self._lock:
            if uid in self._runners:
                return
            self._runners[uid] = runner
        runner.start()

    def note_simulated(self, pod: Json, unknown: Sequence[str]) -> None:
        """Leaves a log saying the pod's containers do not run, so nobody mistakes its
        Running status for processes."""
        d = self.pod_dir(pod)
        d.mkdir(parents=True, exist_ok=True)
        msg = f"simulated: image(s) {', '.join(unknown)} have no local filesystem; nothing runs\n"
        spec = pod.get("spec", {})
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            (d / f"{c['name']}.log").write_text(msg)
        log.info("pod %s: %s", pod_dir_name(pod), msg.strip())

    def snapshot(self, uid: str) -> PodRun | InitFailure | None:
        runner = self._runner(uid)
        return runner.snapshot() if runner else None

    def stop(self, uid: str, grace: float) -> None:
        """Stops the pod's containers (blocks up to the capped grace period)."""
        with self._lock:
            runner = self._runners.pop(uid, None)
        if runner is not None:
            runner.stop(grace)

    def close(self) -> None:
        with self._lock:
            uids = list(self._runners)
        threads = [threading.Thread(target=self.stop, args=(u, 2.0)) for u in uids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._kube.close()

    # ------------------------------------------------------------- for tests and demos

    def pid(self, uid: str, container: str) -> int | None:
        runner = self._runner(uid)
        return runner.pid(container) if runner else None

    def started_with(self, uid: str, container: str) -> dict[str, Any] | None:
        """The sandbox spec the container's last run started with (root, user, mounts, ...)."""
        runner = self._runner(uid)
        return runner.started_with(container) if runner else None

    def exec(
        self, uid: str, container: str, argv: Sequence[str], timeout: float = 30
    ) -> subprocess.CompletedProcess[bytes]:
        """`kubectl exec` for a running pod."""
        runner = self._runner(uid)
        if runner is None:
            raise KeyError(f"no running pod with uid {uid}")
        return runner.exec(container, argv, timeout)

    def log_path(self, pod: Json, container: str) -> Path:
        return self.pod_dir(pod) / f"{container}.log"

    # ------------------------------------------------------------- the API

    def _runner(self, uid: str) -> PodRunner | None:
        with self._lock:
            return self._runners.get(uid)

    def _object_data(self, pod: Json, kind: str, name: str) -> Mapping[str, bytes] | None:
        ns = pod["metadata"]["namespace"]
        plural = "secrets" if kind == "secret" else "configmaps"
        try:
            obj = self._kube.request("GET", f"/api/v1/namespaces/{ns}/{plural}/{name}")
        except ApiException as e:
            if e.status != 404:
                raise
            return self._root_ca() if (kind, name) == ("configmap", ROOT_CA_CONFIGMAP) else None
        return decode_object_data(kind, obj)

    def _root_ca(self) -> Mapping[str, bytes] | None:
        # The local control plane runs no root-ca-cert-publisher; the cluster CA from the
        # kubeconfig is what that controller would publish.
        if self._ca_file is None:
            return None
        return {"ca.crt": self._ca_file.read_bytes()}

    def _report(self, pod: Json, kind: str, reason: str, message: str) -> None:
        """An Event about the pod, as its kubelet posts one (FailedMount, ...). A failure to
        post is logged, as the kubelet's event recorder drops what it cannot send."""
        meta = pod["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._kube.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)
        except (ApiException, OSError) as e:
            log.info("pod %s: could not post a %s event: %s", meta["name"], reason, e)

    def _issue_token(self, pod: Json, audience: str, seconds: int) -> str:
        meta = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else None,
                "expirationSeconds": max(seconds, 600),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token"
        try:
            answer = self._kube.request("POST", path, body=body)
        except ApiException as e:
            raise VolumeError(f"token for service account {sa}: {e.status} {e.reason}") from e
        return str(answer["status"]["token"])


def hardware_mounts(fixture: Path | None) -> list[Mount]:
    """A topology fixture as the node's hardware: its sys/ over /sys, and each of its proc/
    files over the same /proc file where the host has one (procfs takes no new files, and
    the rest of /proc, /proc/net/tcp for the network shim included, must stay the host's).
    A simulated node then looks like, say, an HGX H100 to `pdd-node preflight`."""
    if fixture is None:
        return []
    mounts = [Mount(fixture / "sys", "/sys", read_only=True)]
    proc = fixture / "proc"
    for f in sorted(p for p in proc.rglob("*") if p.is_file()):
        target = "/proc/" + str(f.relative_to(proc))
        if Path(target).exists():
            mounts.append(Mount(f, target, read_only=True))
    return mounts


def service_env(server: str) -> dict[str, str]:
    """The `kubernetes` service's variables, pointing at the real apiserver."""
    url = urlparse(server)
    host, port = url.hostname or "127.0.0.1", str(url.port or 443)
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "KUBERNETES_SERVICE_PORT_HTTPS": port,
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        "KUBERNETES_PORT_443_TCP": f"tcp://{host}:{port}",
        "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": port,
        "KUBERNETES_PORT_443_TCP_ADDR": host,
    }


__all__ = ["PodRuntime", "RuntimeOptions", "hardware_mounts", "service_env"]
