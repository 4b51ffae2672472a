"""Real sidecars against the real operator's rendering, on the real control plane.

The operator runs a PDDeployment; the test then starts ``python -m pdd_sidecar`` with the
command and environment the operator rendered for the pods' ``nixl-sidecar`` containers, as
if it were those containers: the pod identity from the real pods, the deployment token from
the operator's Secret, and the API identity of the rendered ServiceAccount (a TokenRequest
token), so the rendered Role is what discovery and the probe annotations run on. Each sidecar
listens on its pod's simulated IP (198.18.0.0/15) mapped into loopback by a CIDR
``PDD_PEER_ADDRESS_MAP``; nothing ever dials a simulated address.

Shown here: discovery through the deployment's pods (real pod names and UIDs), a replaced decode
pod reported removed (old UID) and added (new UID) through the watch, the operator's probe
request answered with a real NIXL probe (DRAM over TCP on loopback) and turned into
``status.transfer`` and ``KVTransferVerified``, and the sidecar's identity refused Secrets.
"""

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

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helpers.factories import small_pdd_body
from helpers.operator_proc import ROOT, OperatorProcess
from helpers.waits import wait_for

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"
NAME = "kv"
REQUEST, RESULT = "pdd.dev/probe-request", "pdd.dev/probe-result"
REVISION_LABEL = "pdd.dev/revision"

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


@pytest.fixture
def sidecars() -> Iterator[list[Sidecar]]:
    """Every sidecar a test starts; all stopped at teardown, whatever happened."""
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


def create(api: client.ApiClient, ns: str) -> None:
    body = small_pdd_body(
        NAME,
        ns,
        engine={"type": "vllm"},
        decode={"replicas": 2},
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def pdd(api: client.ApiClient, ns: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, NAME
    )


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    conditions = body.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def ready(api: client.ApiClient, ns: str) -> bool:
    body = pdd(api, ns)
    fresh = body.get("status", {}).get("observedGeneration") == body["metadata"]["generation"]
    return fresh and condition(body, "Ready").get("status") == "True"


def service_account_kubeconfig(
    control_plane: Any, core: client.CoreV1Api, ns: str, path: Path
) -> Path:
    """A kubeconfig holding a TokenRequest token of the rendered sidecar ServiceAccount."""
    account = f"{NAME}-sidecar"
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


def rendered_sidecar(api: client.ApiClient, ns: str, role: str) -> client.V1Container:
    sts = client.AppsV1Api(api).read_namespaced_stateful_set(f"{NAME}-{role}", ns)
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


def test_real_sidecars_discover_replace_and_probe(
    operator: OperatorProcess,
    control_plane: Any,
    api_client: client.ApiClient,
    namespace: str,
    sidecars: list[Sidecar],
    tmp_path: Path,
) -> None:
    ns, core = namespace, client.CoreV1Api(api_client)
    create(api_client, ns)
    wait_for(lambda: ready(api_client, ns), 90, what="the PDDeployment Ready")

    pods = {name: running_pod(core, ns, name) for name in
            ("kv-prefill-0", "kv-decode-0", "kv-decode-1")}  # fmt: skip
    revision = pods["kv-prefill-0"].metadata.labels[REVISION_LABEL]
    assert {p.metadata.labels[REVISION_LABEL] for p in pods.values()} == {revision}

    uid = pdd(api_client, ns)["metadata"]["uid"]
    secret = core.read_namespaced_secret(f"{NAME}-sidecar-token-{uid[:8]}", ns)
    token = base64.b64decode(secret.data["token"]).decode().strip()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    kubeconfig = service_account_kubeconfig(control_plane, core, ns, tmp_path / "sa.kubeconfig")

    rendered = {role: rendered_sidecar(api_client, ns, role) for role in ("prefill", "decode")}
    port = port_free_on([loopback_for(p.status.pod_ip) for p in pods.values()])

    def start(pod: client.V1Pod) -> Sidecar:
        role = pod.metadata.labels["pdd.dev/role"]
        env = sidecar_env(rendered[role], pod, kubeconfig)
        assert env["PDD_REVISION"] == revision and env["PDD_PROBER_POD"] == "kv-prefill-0"
        sidecar = Sidecar(pod, rendered[role], port, token, env).start(tmp_path, token_file)
        sidecars.append(sidecar)
        return sidecar

    # The prober pod's sidecar and kv-decode-0's first: the prober answers the operator's
    # request (already stamped: the deployment is Ready) with a probe of the first live decode
    # peer, which is then kv-decode-0, the only decode pod with a sidecar.
    decode0, prefill = start(pods["kv-decode-0"]), start(pods["kv-prefill-0"])
    for sidecar in (decode0, prefill):
        until(sidecar.healthy, 45, f"sidecar {sidecar.pod} healthy", sidecars)

    # Discovery through the pods with the rendered Role: both decode pods with their
    # real names and UIDs, kv-decode-1 too although no sidecar answers for it yet.
    expected = {(p.metadata.name, p.metadata.uid) for n, p in pods.items() if "decode" in n}

    def listed() -> dict[str, Any] | None:
        peers = prefill.get("/v1/peers?role=decode")
        return peers if {(p["pod"], p["pod_uid"]) for p in peers["pods"]} == expected else None

    listing = until(listed, 45, "the prefill sidecar to list both decode pods", sidecars)
    for entry in listing["pods"]:
        assert entry["address"] == f"{loopback_for(pods[entry['pod']].status.pod_ip)}:{port}"

    # The operator's probe request, answered by the prober pod's sidecar with a real probe.
    def answered() -> dict[str, Any] | None:
        annotations = core.read_namespaced_pod("kv-prefill-0", ns).metadata.annotations or {}
        result = json.loads(annotations.get(RESULT, "{}") or "{}")
        requested = annotations.get(REQUEST)
        return result if requested and result.get("request_id") == requested else None

    result = until(answered, 120, "the probe result on the prober pod", sidecars)
    assert result["error"] is None, result
    assert result["verified"] is True, result
    assert result["gbps"] > 0 and result["bytes"] > 0, result
    assert result["transport"] in ("tcp", "shm"), result
    assert (result["src_role"], result["dst_role"], result["peer"]) == (
        "prefill", "decode", "kv-decode-0"
    )  # fmt: skip
    assert prefill.get("/v1/status")["last_probe"]["verified"] is True

    def judged() -> dict[str, Any] | None:
        body = pdd(api_client, ns)
        verdict = condition(body, "KVTransferVerified")
        transfer = body.get("status", {}).get("transfer", {})
        return body if verdict.get("status") == "False" and transfer.get("measuredGBps") else None

    body = until(judged, 60, "status.transfer and KVTransferVerified", sidecars)
    verdict = condition(body, "KVTransferVerified")
    print("status", json.dumps(body.get("status")))  # shown when the test fails
    assert verdict["reason"] in ("TCPFallback", "BelowExpectedBandwidth"), verdict
    transfer = body["status"]["transfer"]
    assert transfer["measuredGBps"] > 0 and transfer["transport"] == result["transport"]
    assert transfer["requestedAt"] == result["request_id"]

    # kv-decode-1's sidecar too; stand-ins for the engines publish an agent named after the pod.
    decode1 = start(pods["kv-decode-1"])
    until(decode1.healthy, 45, "sidecar kv-decode-1 healthy", sidecars)
    for sidecar in (decode0, decode1):
        sidecar.call("PUT", f"/v1/agents/{sidecar.pod}", f"metadata of {sidecar.uid}".encode())

    def discovered() -> dict[str, Any] | None:
        peers = prefill.get("/v1/peers?role=decode")
        agents = {(a["name"], a["pod_uid"], a["revision"]) for a in peers["agents"]}
        answering = all(p["error"] is None and p["revision"] == revision for p in peers["pods"])
        wanted = {(name, uid, revision) for name, uid in expected}
        return peers if agents == wanted and answering else None

    peers = until(discovered, 45, "the prefill sidecar to list both decode agents", sidecars)
    status = prefill.get("/v1/status")
    assert status["self"]["pod_uid"] == pods["kv-prefill-0"].metadata.uid
    assert status["self"]["revision"] == revision and status["incompatible_peers"] == []

    # A decode pod replaced: the StatefulSet recreates it with a new UID and a new IP.
    since = peers["version"]
    old = pods["kv-decode-1"]
    core.delete_namespaced_pod("kv-decode-1", ns)
    decode1.stop()  # its containers die with it
    new = running_pod(core, ns, "kv-decode-1", not_uid=old.metadata.uid)
    decode1b = start(new)
    until(decode1b.healthy, 45, "the replacement's sidecar healthy", sidecars)
    decode1b.call("PUT", "/v1/agents/kv-decode-1", f"metadata of {new.metadata.uid}".encode())

    def replaced() -> bool:
        agents = prefill.get("/v1/peers?role=decode")["agents"]
        return ("kv-decode-1", new.metadata.uid) in {(a["name"], a["pod_uid"]) for a in agents}

    until(replaced, 45, "the prefill sidecar to list the replacement", sidecars)
    watch = prefill.get(f"/v1/peers/watch?since={since}&wait_s=0&role=decode")
    print("watch since", since, json.dumps(watch))
    assert watch["resync"] is False
    assert [(r["name"], r["pod_uid"]) for r in watch["removed"]] == [
        ("kv-decode-1", old.metadata.uid)
    ]
    assert [(r["name"], r["pod_uid"]) for r in watch["added"]] == [
        ("kv-decode-1", new.metadata.uid)
    ]

    # The sidecar's API identity discovers peers, but Secrets are refused.
    sa_api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(sa_api).list_namespaced_secret(ns)
        assert refused.value.status == 403
        assert client.CoreV1Api(sa_api).list_namespaced_pod(ns).items
    finally:
        sa_api.close()
    for sidecar in sidecars:
        assert token not in sidecar.log()
