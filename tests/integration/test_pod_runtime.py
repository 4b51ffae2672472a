"""Pods that really run (`pdd_localcluster.runtime`) against the real control plane: a node
simulator of this module's own, whose node is tainted so other tests' pods stay off it and
whose pods get addresses in 127.86.0.0/24, runs the containers of known images as local
processes, reports their probes, restarts them and stops them when the pod is deleted."""

from __future__ import annotations

import base64
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.waits import wait_for
from pdd_localcluster import LocalControlPlane, NodeSimulator, SimNode
from pdd_localcluster.runtime import PodRuntime, RuntimeOptions
from pdd_operator.offline import render_documents

NODE = "podruntime-node-0"
TAINT = {"key": "pdd.dev/podruntime-test", "value": "true", "effect": "NoSchedule"}
TOLERATION = {**TAINT, "operator": "Equal"}
SIDECAR_IMAGE = "ghcr.io/pdd-dev/pdd-sidecar:0.1.0"
ROUTER_IMAGE = "ghcr.io/pdd-dev/pdd-router:0.1.0"
TOKEN = "s3cret-sidecar-token"

# A stand-in server for the tests: answers every GET with the pod's name (from the
# downward API), so a reply says which pod's process took the connection.
NAME_SERVER = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["POD_NAME"].encode()
        self.send_response(200 if self.path == "/" else 404)
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def runtime(
    control_plane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRuntime]:
    state = tmp_path_factory.mktemp("podruntime")
    # Probe periods capped at 1 s: the rendered pods' 10 s would only make the tests slow.
    options = RuntimeOptions(
        backoff_base_s=0.5, backoff_max_s=2.0, max_grace_s=3.0, max_probe_period_s=1.0
    )
    rt = PodRuntime(control_plane.kubeconfig, state, options=options)
    addresses = iter(f"127.86.0.{i}" for i in range(1, 255))
    node = SimNode(NODE, taints=(TAINT,))
    sim = NodeSimulator(control_plane.kubeconfig, [node], pod_ips=addresses, runtime=rt).start()
    try:
        yield rt
    finally:
        sim.delete_node(NODE)
        sim.stop()


def pod_body(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 5,
            "containers": containers,
            **spec,
        },
    }


def name_server(port: int = 8080, **extra: Any) -> dict[str, Any]:
    return {
        "name": "server",
        "image": SIDECAR_IMAGE,
        "command": ["python3", "-c", NAME_SERVER, str(port)],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "http", "containerPort": port}],
        **extra,
    }


def create(core: client.CoreV1Api, ns: str, body: dict[str, Any]) -> Any:
    return core.create_namespaced_pod(ns, body)


def ready(core: client.CoreV1Api, ns: str, name: str) -> bool:
    pod = core.read_namespaced_pod(name, ns)
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def answers(url: str) -> bool:
    try:
        get(url)
    except urllib.error.URLError:
        return False
    return True


def test_two_sidecar_pods_bind_the_same_wildcard_port_each_at_its_own_ip_and_become_ready(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    secret = {"token": base64.b64encode(TOKEN.encode()).decode()}
    core.create_namespaced_secret(namespace, {"metadata": {"name": "tok"}, "data": secret})
    for name in ("side-a", "side-b"):
        sidecar = {
            "name": "nixl-sidecar",
            "image": SIDECAR_IMAGE,
            "command": ["pdd-sidecar", "serve", "--port", "8099", "--role", "prefill"],
            "args": [
                "--deployment",
                "d",
                "--namespace",
                namespace,
                "--token-file",
                "/var/run/pdd/token/token",
                "--peer-source",
                "static:decode=127.0.0.1:1",
            ],
            "ports": [{"name": "sidecar", "containerPort": 8099}],
            "readinessProbe": {
                "httpGet": {"path": "/healthz", "port": "sidecar"},
                "periodSeconds": 1,
            },
            "volumeMounts": [
                {"name": "token", "mountPath": "/var/run/pdd/token", "readOnly": True},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        }
        volumes = [
            {"name": "token", "secret": {"secretName": "tok", "defaultMode": 0o440}},
            {"name": "tmp", "emptyDir": {}},
        ]
        create(core, namespace, pod_body(name, [sidecar], volumes=volumes))
    for name in ("side-a", "side-b"):
        wait_for(lambda n=name: ready(core, namespace, n), 60, what=f"{name} Ready")
    pods = {n: core.read_namespaced_pod(n, namespace) for n in ("side-a", "side-b")}
    ips = {n: p.status.pod_ip for n, p in pods.items()}
    assert len(set(ips.values())) == 2 and all(ip.startswith("127.86.0.") for ip in ips.values())
    for name, ip in ips.items():
        status, _ = get(f"http://{ip}:8099/healthz")
        assert status == 200, name
        # Each pod's process holds its own address's port, not the wildcard.
        listeners = Path("/proc/net/tcp").read_text()
        assert _proc_net_tcp_entry(ip, 8099) in listeners
        cs = pods[name].status.container_statuses[0]
        assert cs.ready and cs.state.running is not None and cs.restart_count == 0
    # The secret volume holds the token with the mode the pod asked for.
    uid = pods["side-a"].metadata.uid
    out = runtime.exec(
        uid,
        "nixl-sidecar",
        ["sh", "-c", "stat -L -c %a /var/run/pdd/token/token; cat /var/run/pdd/token/token"],
    )
    assert out.stdout.decode().split() == ["440", TOKEN]


def _proc_net_tcp_entry(ip: str, port: int) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"{d:02X}{c:02X}{b:02X}{a:02X}:{port:04X} 00000000:0000 0A"


def test_a_pod_whose_readiness_probe_fails_stays_not_ready(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    probe = {"httpGet": {"path": "/not-here", "port": "http"}, "periodSeconds": 1}
    create(core, namespace, pod_body("unready", [name_server(readinessProbe=probe)]))

    def running() -> bool:
        st = core.read_namespaced_pod("unready", namespace).status
        return bool(st.container_statuses and st.container_statuses[0].state.running)

    wait_for(running, 30, what="the container running")
    pod = core.read_namespaced_pod("unready", namespace)
    url = f"http://{pod.status.pod_ip}:8080/not-here"
    # Running is the process started, not yet listening: on a loaded machine the server binds
    # its port a while later (a 3-worker run got "connection refused" here).
    wait_for(lambda: answers(url), 30, what="the container's server to listen")
    status, body = get(url)
    assert (status, body) == (404, "unready")  # it serves; its probe path fails
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert not ready(core, namespace, "unready")
        time.sleep(0.5)
    cs = core.read_namespaced_pod("unready", namespace).status.container_statuses[0]
    assert cs.state.running is not None and not cs.ready


def test_a_container_that_exits_is_restarted_and_its_restart_count_grows(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    crasher = {
        "name": "crasher",
        "image": SIDECAR_IMAGE,
        "command": ["sh", "-c", "echo run; exit 3"],
    }
    create(core, namespace, pod_body("crasher", [crasher]))

    def restarted_twice() -> Any:
        st = core.read_namespaced_pod("crasher", namespace).status
        cs = (st.container_statuses or [None])[0]
        return cs if cs is not None and cs.restart_count >= 2 else None

    cs = wait_for(restarted_twice, 60, what="restartCount >= 2")
    assert cs.last_state.terminated.exit_code == 3
    pod = core.read_namespaced_pod("crasher", namespace)
    log = runtime.log_path(pod.to_dict() | {"metadata": pod.metadata.to_dict()}, "crasher")
    # Two runs have ended (the third may not have written yet).
    assert log.read_text().count("run") >= 2


def test_deleting_the_pod_kills_its_processes(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    # It ignores SIGTERM, so only the SIGKILL after the (capped) grace period ends it.
    stubborn = {
        "name": "stubborn",
        "image": SIDECAR_IMAGE,
        "command": ["sh", "-c", "trap '' TERM; sleep 1000 & wait; sleep 1000"],
    }
    uid = create(core, namespace, pod_body("stubborn", [stubborn])).metadata.uid
    pid = wait_for(lambda: runtime.pid(uid, "stubborn"), 30, what="the container's pid")
    assert os.path.exists(f"/proc/{pid}")
    t0 = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("stubborn", namespace)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, 30, what="the pod gone")
    assert not _alive(pid)
    assert time.monotonic() - t0 >= 2.5  # it had its grace period (capped at 3 s here)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


LIST_PODS = """
import sys
from kubernetes import client, config
config.load_incluster_config()
try:
    pods = client.CoreV1Api().list_namespaced_pod(sys.argv[1])
except client.ApiException as e:
    print("refused", e.status)
    sys.exit(1)
print("listed", len(pods.items))
"""


def test_in_cluster_credentials_list_pods_only_where_rbac_allows(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "lister"}})
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "lister"}, "rules": [rule]})
    binding = {
        "metadata": {"name": "lister"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lister"},
        "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": namespace}],
    }
    rbac.create_namespaced_role_binding(namespace, binding)
    for name, sa in (("allowed", "lister"), ("refused", "default")):
        check = {
            "name": "check",
            "image": ROUTER_IMAGE,
            "command": ["python3", "-c", LIST_PODS, namespace],
        }
        create(
            core, namespace, pod_body(name, [check], serviceAccountName=sa, restartPolicy="Never")
        )

    def finished(name: str) -> str:
        phase: str = core.read_namespaced_pod(name, namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else ""

    assert wait_for(lambda: finished("allowed"), 60, what="allowed pod done") == "Succeeded"
    assert wait_for(lambda: finished("refused"), 60, what="refused pod done") == "Failed"
    logs = {n: _log(runtime, core, namespace, n, "check") for n in ("allowed", "refused")}
    # The pods of the namespace (the other one may not exist yet when it lists).
    assert re.search(r"listed [12]\b", logs["allowed"]), logs
    assert "refused 403" in logs["refused"], logs


def _log(runtime: PodRuntime, core: client.CoreV1Api, ns: str, name: str, container: str) -> str:
    meta = core.read_namespaced_pod(name, ns).metadata
    pod = {"metadata": {"namespace": ns, "name": name, "uid": meta.uid}}
    return runtime.log_path(pod, container).read_text()


SOCKETS = """
import socket, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:8080/").read().decode())
tcp = socket.socket(); tcp.bind(("0.0.0.0", 0)); print("tcp", tcp.getsockname()[0])
udp = socket.socket(type=socket.SOCK_DGRAM); udp.bind(("0.0.0.0", 0))
print("udp", udp.getsockname()[0])
"""


def test_localhost_inside_a_pod_is_the_pods_own(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    for name in ("local-a", "local-b"):
        create(core, namespace, pod_body(name, [name_server(readinessProbe=probe)]))
    for name in ("local-a", "local-b"):
        wait_for(lambda n=name: ready(core, namespace, n), 60, what=f"{name} Ready")
        pod = core.read_namespaced_pod(name, namespace)
        out = runtime.exec(pod.metadata.uid, "server", ["python3", "-c", SOCKETS])
        assert out.returncode == 0, (
            name,
            pod.status.pod_ip,
            out.stdout.decode(),
            out.stderr.decode()[-300:],
        )
        # 127.0.0.1:8080 is this pod's server; a TCP wildcard bind gets the pod's address;
        # UDP is left alone.
        assert out.stdout.decode().split() == [name, "tcp", pod.status.pod_ip, "udp", "0.0.0.0"]


def test_init_containers_run_in_order_and_a_failing_one_shows_its_output(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    shared = [{"name": "shared", "mountPath": "/shared"}]
    volumes = [{"name": "shared", "emptyDir": {}}]

    def step(name: str, script: str) -> dict[str, Any]:
        cmd = ["sh", "-c", script]
        return {"name": name, "image": SIDECAR_IMAGE, "command": cmd, "volumeMounts": shared}

    inits = [step("one", "echo one > /shared/order"), step("two", "echo two >> /shared/order")]
    main = step("main", "sleep 1000")
    main["readinessProbe"] = {
        "exec": {"command": ["test", "-s", "/shared/order"]},
        "periodSeconds": 1,
    }
    uid = create(
        core, namespace, pod_body("inits", [main], initContainers=inits, volumes=volumes)
    ).metadata.uid
    wait_for(lambda: ready(core, namespace, "inits"), 60, what="inits Ready")
    out = runtime.exec(uid, "main", ["cat", "/shared/order"])
    assert out.stdout.decode().split() == ["one", "two"]
    pod = core.read_namespaced_pod("inits", namespace)
    assert [s.state.terminated.reason for s in pod.status.init_container_statuses] == [
        "Completed"
    ] * 2

    failing = step("check", "echo checking; echo 'no usable GPU' >&2; exit 4")
    failing["terminationMessagePolicy"] = "FallbackToLogsOnError"
    create(
        core,
        namespace,
        pod_body(
            "bad-init", [step("main", "sleep 1000")], initContainers=[failing], volumes=volumes
        ),
    )

    def failed() -> Any:
        st = core.read_namespaced_pod("bad-init", namespace).status
        s = (st.init_container_statuses or [None])[0]
        return s if s is not None and s.state.terminated is not None else None

    term = wait_for(failed, 60, what="the init container's failure").state.terminated
    assert term.exit_code == 4 and "no usable GPU" in term.message and "checking" in term.message
    pod = core.read_namespaced_pod("bad-init", namespace)
    assert pod.status.phase == "Pending"
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"


PREFLIGHT_ENV = {
    # As the operator renders them for a prefill pod (`pdd-operator render`), plus what the
    # NVIDIA device plugin would add for two GPUs.
    "PDD_ROLE": "prefill",
    "UCX_TLS": "rc_x,ud_x,sm,self,cuda_copy,cuda_ipc",
    "PDD_GPUDIRECT": "auto",
    "PDD_REQUIRE_RDMA": "false",
    "PDD_NIC_SELECTION": "auto",
    "PDD_VERIFY_TRANSFER": "true",
    "PDD_KV_DESCRIPTOR_BYTES": "32768",
    "NVIDIA_VISIBLE_DEVICES": "0,1",
}


def test_preflight_on_a_node_showing_a_topology_fixture_as_its_hardware(
    api_client: client.ApiClient,
    namespace: str,
    control_plane: LocalControlPlane,
    tmp_path: Path,
) -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "topology" / "h100-hgx"
    node = "podruntime-hgx"
    rt = PodRuntime(control_plane.kubeconfig, tmp_path, node_hardware={node: fixture})
    # 127.85: a block no other module uses, so modules on parallel workers never share one.
    addresses = iter(f"127.85.0.{i}" for i in range(1, 255))
    with NodeSimulator(
        control_plane.kubeconfig, [SimNode(node, taints=(TAINT,))], pod_ips=addresses, runtime=rt
    ) as sim:
        core = client.CoreV1Api(api_client)
        preflight = {
            "name": "preflight",
            "image": SIDECAR_IMAGE,
            "command": ["pdd-node", "preflight", "--env-file", "/pdd/env/transfer.env"],
            "env": [{"name": k, "value": v} for k, v in PREFLIGHT_ENV.items()],
            "volumeMounts": [{"name": "pdd-env", "mountPath": "/pdd/env"}],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        main = {
            "name": "main",
            "image": SIDECAR_IMAGE,
            "command": ["sleep", "1000"],
            "volumeMounts": [{"name": "pdd-env", "mountPath": "/pdd/env", "readOnly": True}],
        }
        body = pod_body("pre", [main], initContainers=[preflight])
        body["spec"].update(nodeName=node, volumes=[{"name": "pdd-env", "emptyDir": {}}])
        uid = create(core, namespace, body).metadata.uid
        wait_for(lambda: ready(core, namespace, "pre"), 120, what="preflight done, main Ready")
        env_file = rt.exec(uid, "main", ["cat", "/pdd/env/transfer.env"]).stdout.decode()
        sim.delete_node(node)
    # The fixture's NIC next to each GPU is pinned, as on a real HGX node.
    assert "export PDD_GPU_NIC_MAP=0:mlx5_0:1,1:mlx5_1:1" in env_file, env_file


REFENGINE_IMAGE = "ghcr.io/pdd-dev/pdd-refengine:0.1.0"
EXAMPLE = Path(__file__).parents[2] / "examples" / "vllm-2p4d.yaml"


def rendered_children(namespace: str) -> list[dict[str, Any]]:
    """The example deployment as the operator renders it, with the reference engine's image
    and the UCX transports a CPU machine has (the example's rc_x/cuda ones need hardware)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"]["engine"]["image"] = REFENGINE_IMAGE
    body["spec"]["kvTransfer"] = {"ucx": {"transports": ["tcp", "sm", "self"]}}
    (rendered,) = render_documents([body])
    for child in rendered.children:
        # The placeholder owner does not exist: the garbage collector would delete them.
        child["metadata"].pop("ownerReferences", None)
    return rendered.children


def test_the_rendered_prefill_pod_runs_as_rendered_and_becomes_ready(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    children = rendered_children(namespace)
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        for obj in (c for c in children if c["kind"] == kind):
            _create(api_client, obj)
    core = client.CoreV1Api(api_client)
    sts = next(
        c for c in children if c["kind"] == "StatefulSet" and "prefill" in c["metadata"]["name"]
    )
    template = sts["spec"]["template"]
    # The token Secret the operator creates once (not among the rendered children).
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "sidecar-token")
    token = {"token": base64.b64encode(TOKEN.encode()).decode()}
    secret = {"metadata": {"name": volume["secret"]["secretName"]}, "data": token}
    core.create_namespaced_secret(namespace, secret)
    pod = {
        "metadata": {"name": "llama-70b-prefill-0", **template["metadata"]},
        "spec": {**template["spec"], "nodeName": NODE, "tolerations": [TOLERATION]},
    }
    uid = create(core, namespace, pod).metadata.uid

    def engine_waiting_reason() -> str:
        st = core.read_namespaced_pod("llama-70b-prefill-0", namespace).status
        cs = {c.name: c for c in st.container_statuses or []}
        w = cs["engine"].state.waiting if "engine" in cs else None
        starting = ("ContainerCreating", "PodInitializing")
        return f"{w.reason}: {w.message}" if w and w.reason not in starting else ""

    # The engine reads HF_TOKEN from the user's Secret `hf-token`: like a kubelet, the
    # runtime holds the container until it exists.
    waiting = wait_for(engine_waiting_reason, 60, what="the engine waiting for hf-token")
    assert waiting.startswith("CreateContainerConfigError") and "hf-token" in waiting
    hf = {"metadata": {"name": "hf-token"}, "stringData": {"HF_TOKEN": "hf_test_double"}}
    core.create_namespaced_secret(namespace, hf)
    wait_for(lambda: ready(core, namespace, "llama-70b-prefill-0"), 120, what="rendered pod Ready")
    live = core.read_namespaced_pod("llama-70b-prefill-0", namespace)
    status, body = get(f"http://{live.status.pod_ip}:8000/v1/models")
    assert status == 200 and "llama-70b" in body
    # The engine runs exactly the rendered command line, from the reference engine's image.
    engine = next(c for c in template["spec"]["containers"] if c["name"] == "engine")
    pid = runtime.pid(uid, "engine")
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in cmdline][-len(engine["args"]) :] == engine["args"]
    assert all(c.restart_count == 0 for c in live.status.container_statuses)


def _create(api_client: client.ApiClient, obj: dict[str, Any]) -> None:
    ns = obj["metadata"]["namespace"]
    if obj["kind"] == "ServiceAccount":
        client.CoreV1Api(api_client).create_namespaced_service_account(ns, obj)
    elif obj["kind"] == "Role":
        client.RbacAuthorizationV1Api(api_client).create_namespaced_role(ns, obj)
    else:
        client.RbacAuthorizationV1Api(api_client).create_namespaced_role_binding(ns, obj)


def test_a_failing_liveness_probe_restarts_the_container(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    # Nothing listens on 9; the process itself would run for ever.
    probe = {"tcpSocket": {"port": 9}, "periodSeconds": 1, "failureThreshold": 2}
    sleeper = {"name": "sleeper", "image": SIDECAR_IMAGE, "command": ["sleep", "1000"]}
    create(core, namespace, pod_body("unhealthy", [{**sleeper, "livenessProbe": probe}]))

    def restarted() -> Any:
        st = core.read_namespaced_pod("unhealthy", namespace).status
        cs = (st.container_statuses or [None])[0]
        return cs if cs is not None and cs.restart_count >= 1 else None

    cs = wait_for(restarted, 60, what="a restart after the liveness probe failed")
    assert cs.last_state.terminated.exit_code == 128 + 15  # SIGTERM ended it


# What a container reports about where it runs: its namespaces, host name and its own PID as
# it sees them (`$$$$`: the pod spec's escape for the shell's `$$`), after adding a file named
# after its pod and itself to its /dev/shm.
WHERE_AM_I = (
    'touch /dev/shm/"$(hostname)-$C"; '
    'echo "pid=$(readlink /proc/self/ns/pid) ipc=$(readlink /proc/self/ns/ipc) '
    'uts=$(readlink /proc/self/ns/uts) host=$(hostname) self=$$$$"; '
    "exec sleep 1000"
)


def _namespace_container(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": SIDECAR_IMAGE,
        "command": ["sh", "-c", WHERE_AM_I],
        "env": [{"name": "C", "value": name}],
    }


def _where(runtime: PodRuntime, pod: Any, container: str) -> dict[str, str]:
    path = runtime.log_path(pod.to_dict() | {"metadata": pod.metadata.to_dict()}, container)
    line = wait_for(
        lambda: (
            next((x for x in Path(path).read_text().splitlines() if "pid=" in x), None)
            if Path(path).exists()
            else None
        ),
        30,
        what=f"{container} to report its namespaces",
    )
    return dict(field.split("=", 1) for field in line.split())


def _shm(runtime: PodRuntime, uid: str, container: str) -> set[str]:
    return set(runtime.exec(uid, container, ["ls", "/dev/shm"]).stdout.decode().split())


def _own_ns(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


def test_each_pod_has_its_own_namespaces_and_its_containers_share_them_as_a_pods_do(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    """What two P/D pods on one node cross: separate PID and IPC namespaces and /dev/shm (UCX's
    cuda_ipc and cma lanes stop there). Within a pod, IPC, UTS and /dev/shm are shared and
    each container has its own PID namespace, unless shareProcessNamespace or hostPID."""
    core = client.CoreV1Api(api_client)
    containers = [_namespace_container("a"), _namespace_container("b")]
    bodies = {
        "ns-one": pod_body("ns-one", containers),
        "ns-two": pod_body("ns-two", containers),
        "ns-shared": pod_body("ns-shared", containers, shareProcessNamespace=True),
        "ns-host": pod_body("ns-host", containers, hostPID=True, hostIPC=True),
    }
    pods = {name: create(core, namespace, body) for name, body in bodies.items()}
    where = {(n, c): _where(runtime, pods[n], c) for n in pods for c in ("a", "b")}
    host_pid, host_ipc = _own_ns("pid"), _own_ns("ipc")

    one_a, one_b, two_a = where["ns-one", "a"], where["ns-one", "b"], where["ns-two", "a"]
    # Between pods: nothing shared but the network.
    assert len({one_a["pid"], one_b["pid"], two_a["pid"], host_pid}) == 4, where
    assert one_a["ipc"] != two_a["ipc"] and host_ipc not in (one_a["ipc"], two_a["ipc"])
    assert (one_a["host"], two_a["host"]) == ("ns-one", "ns-two")
    # Within a pod: one IPC and UTS namespace; a PID namespace per container, in which the
    # container's process is the child of a small init (PID 1).
    assert (one_a["ipc"], one_a["uts"]) == (one_b["ipc"], one_b["uts"])
    assert one_a["self"] == one_b["self"] == "2", where
    uid_one, uid_two = pods["ns-one"].metadata.uid, pods["ns-two"].metadata.uid
    one = {"ns-one-a", "ns-one-b"}
    wait_for(lambda: _shm(runtime, uid_one, "a") == one, 30, what="ns-one's /dev/shm")
    assert _shm(runtime, uid_two, "b") == {"ns-two-a", "ns-two-b"}  # its own, not ns-one's
    host_shm = set(os.listdir("/dev/shm"))
    # hostIPC: the node's IPC namespace and /dev/shm, and only that pod's files land there.
    assert {"ns-host-a", "ns-host-b"} <= host_shm and not one & host_shm, host_shm
    for name in ("ns-host-a", "ns-host-b"):
        os.unlink(f"/dev/shm/{name}")

    shared_a, shared_b = where["ns-shared", "a"], where["ns-shared", "b"]
    assert shared_a["pid"] == shared_b["pid"] != host_pid
    # One PID namespace for the pod: its sandbox is PID 1, each container's process another.
    assert len({"1", shared_a["self"], shared_b["self"]}) == 3, where
    host_a = where["ns-host", "a"]
    assert (host_a["pid"], host_a["ipc"]) == (host_pid, host_ipc)
    assert host_a["host"] == "ns-host"  # hostPID and hostIPC leave UTS the pod's own


def test_a_process_that_leaves_its_process_group_ends_with_its_pod(
    api_client: client.ApiClient, namespace: str, runtime: PodRuntime
) -> None:
    core = client.CoreV1Api(api_client)
    escaper = {
        "name": "escaper",
        "image": SIDECAR_IMAGE,
        "command": ["sh", "-c", "setsid sleep 1000 & echo started; exec sleep 1000"],
    }
    pod = create(core, namespace, pod_body("escaper", [escaper]))
    log = runtime.log_path(pod.to_dict() | {"metadata": pod.metadata.to_dict()}, "escaper")
    wait_for(lambda: log.exists() and "started" in log.read_text(), 30, what="the escape")
    init = runtime.pid(pod.metadata.uid, "escaper")
    assert init is not None

    def escaped() -> list[int]:
        return [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and _cmdline(int(p)) == ["sleep", "1000"] and _in_pod(int(p), init)
        ]

    wait_for(lambda: len(escaped()) == 2, 30, what="both sleeps")
    strays = escaped()
    core.delete_namespaced_pod("escaper", namespace)
    wait_for(lambda: not any(_alive(p) for p in strays), 30, what="the setsid process to end")


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    except OSError:
        return []


def _in_pod(pid: int, container_pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{container_pid}/ns/pid")
    except OSError:
        return False
