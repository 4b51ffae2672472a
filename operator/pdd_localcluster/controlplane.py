"""The local control plane: real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler on 127.0.0.1, each in its own process group, all state under one directory."""

from __future__ import annotations

import atexit
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import yaml

from pdd_localcluster import procs
from pdd_localcluster.certs import CertFiles, ensure_certs

REPO_ROOT = Path(__file__).resolve().parents[2]

# Controllers the tests rely on. `node-lifecycle-controller` is left out on purpose: simulated
# nodes have no kubelet renewing a lease, so it would mark them NotReady and taint them; the
# node simulator owns node conditions instead.
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "endpointslice-controller",
    # Creates a pod's ResourceClaims from its ResourceClaimTemplates (DRA) and removes them
    # with the pod; kube-scheduler then allocates devices from the ResourceSlices.
    "resourceclaim-controller",
    # Lifts a deleted claim's kubernetes.io/pvc-protection finalizer once no pod uses it;
    # without it a namespace holding a claim never finishes terminating.
    "persistentvolumeclaim-protection-controller",
    # Computes each ResourceQuota's usage; without it the quota admission plugin has no
    # usage to check against and admits everything (tests of pods refused by a quota).
    "resourcequota-controller",
)

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
{reads}  - level: None
"""


def audit_policy(read_users: Sequence[str] = ()) -> str:
    """Every user's writes; the reads of `read_users` too (what a client asks the apiserver to
    send it: its selectors are in the request URI; which names it looks up)."""
    reads = ""
    if read_users:
        users = ", ".join(f'"{u}"' for u in read_users)
        reads = f'  - level: Metadata\n    users: [{users}]\n    verbs: ["get", "list", "watch"]\n'
    return AUDIT_POLICY.format(reads=reads)


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# `apiserver_request_total` spells the verb after the HTTP method except for server-side apply.
MUTATING_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
ADMIN_USER = "pdd-admin"


class ControlPlaneStartError(RuntimeError):
    """A component did not come up; the message carries the tail of its log."""

    def __init__(self, message: str, *, port_conflict: bool = False) -> None:
        super().__init__(message)
        self.port_conflict = port_conflict


@dataclass(frozen=True)
class StaticUser:
    name: str
    groups: tuple[str, ...]
    token: str


def resolve_bin_dir() -> Path:
    """The directory with the pinned binaries: $PDD_BIN_DIR, else whatever
    hack/fetch-binaries.sh prints (it returns at once when they are cached)."""
    if env := os.environ.get("PDD_BIN_DIR"):
        return Path(env)
    res = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "fetch-binaries.sh")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        tail = "\n".join(res.stderr.strip().splitlines()[-20:])
        raise ControlPlaneStartError(f"hack/fetch-binaries.sh failed ({res.returncode}):\n{tail}")
    return Path(lines[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager, kube-scheduler) on loopback.

    Use as a context manager, or call start()/stop(). Everything (etcd data, certificates,
    kubeconfigs, one log file per component) lives in `state_dir`; a temporary directory when
    none is given. Static users (name -> groups) get bearer tokens at start; the admin user is
    in system:masters. `controller_qps` is the client rate limit of the controller-manager
    and the scheduler.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        bin_dir: Path | str | None = None,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        controller_manager: bool = True,
        scheduler: bool = True,
        users: Mapping[str, Sequence[str]] | None = None,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Sequence[str] = (),
        controller_qps: int = 100,
        start_timeout: float = 90.0,
        reset: bool = True,
        audit_reads_of: Sequence[str] = (),
    ) -> None:
        self._tmp = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="pdd-cp-")).resolve()
        self._bin_dir = Path(bin_dir) if bin_dir else None
        self.controllers = tuple(controllers)
        self._want_kcm = controller_manager
        self._want_scheduler = scheduler
        self._extra_users = dict(users or {})
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._extra_kcm_args = list(extra_controller_manager_args)
        # Alpha features for one test's own control plane (e.g. GenericWorkload and
        # GangScheduling), given to every component; runtime_config serves alpha APIs.
        self._feature_gates = dict(feature_gates or {})
        self._runtime_config = tuple(runtime_config)
        self._controller_qps = controller_qps
        self.start_timeout = start_timeout
        self._reset = reset
        self._audit_reads_of = tuple(audit_reads_of)
        self._users: dict[str, StaticUser] = {}
        self._components: dict[str, procs.Component] = {}
        self._ports: dict[str, int] = {}
        self._certs: CertFiles | None = None
        self._ssl: ssl.SSLContext | None = None
        self.version = ""
        self.etcd_version = ""
        self.start_seconds = 0.0
        # Seconds from the start until etcd, the apiserver and the controllers were ready.
        self.start_phases: dict[str, float] = {}

    # ----------------------------------------------------------------- public surface

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self._ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def admin_token(self) -> str:
        return self._users[ADMIN_USER].token

    @property
    def ca_file(self) -> Path:
        assert self._certs is not None, "not started"
        return self._certs.ca_crt

    @property
    def etcd_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._ports['etcd']}"

    def token_for(self, user: str) -> str:
        return self._users[user].token

    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig for one of the static users given at construction."""
        path = self.state_dir / f"kubeconfig-{user.replace(':', '-')}"
        self._write_kubeconfig(path, user)
        return path

    def log_path(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Starts every component and returns once the cluster serves the default namespace's
        default ServiceAccount (which proves the controller-manager runs)."""
        t0 = time.monotonic()
        atexit.register(self.stop)
        for attempt in range(3):
            try:
                self._start_once()
                break
            except ControlPlaneStartError as e:
                self._stop_components()
                # A free port can be taken between picking and binding it; pick again.
                if not e.port_conflict or attempt == 2:
                    atexit.unregister(self.stop)
                    raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stops every component (process groups, SIGTERM then SIGKILL); idempotent."""
        atexit.unregister(self.stop)
        self._stop_components()
        if self._tmp:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until the apiserver is ready, the controllers answer /healthz and the default
        ServiceAccount exists."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        self._wait_apiserver(deadline)
        for name in ("kube-controller-manager", "kube-scheduler"):
            if name in self._components:
                self._wait_component_healthz(name, deadline)
        if not self._runs_controller("serviceaccount-controller", alias="serviceaccount"):
            return
        self._wait_for(
            "the default ServiceAccount",
            lambda: self._api_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            deadline,
            watch=self._components.get("kube-controller-manager"),
        )

    def stop_apiserver(self, graceful: bool = True) -> None:
        """Stops only the apiserver (fault tests); etcd and the controllers keep running.
        Graceful: SIGTERM, then SIGKILL after 2 s (it holds open watches until its clients
        hang up, which those still running never do); otherwise SIGKILL at once, a crash."""
        apiserver = self._components["kube-apiserver"]
        if graceful:
            apiserver.stop(timeout=2.0)
        else:
            apiserver.kill()

    def start_apiserver(self, timeout: float | None = None) -> None:
        """Starts the apiserver again with the same port, tokens and certificates."""
        self._components["kube-apiserver"].start()
        procs.write_pid_file(self._pid_file, list(self._components.values()))
        self._wait_apiserver(time.monotonic() + (timeout or self.start_timeout))

    def restart_apiserver(self, downtime: float = 0.0, graceful: bool = True) -> None:
        """Stops the apiserver, waits `downtime` seconds, starts it again and waits for /readyz."""
        self.stop_apiserver(graceful)
        if downtime > 0:
            time.sleep(downtime)
        self.start_apiserver()

    def metrics(self) -> str:
        """The apiserver's own Prometheus metrics text."""
        status, body = self._api_get("/metrics", timeout=10)
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}")
        return body

    def mutating_requests(self, resources: Iterable[str] | None = None) -> int:
        """Writes the apiserver has served so far, from its `apiserver_request_total` counter,
        across every client. `resources` filters by resource the way RBAC names them: "pods"
        counts writes to pods themselves, "pods/status" those to the status subresource."""
        wanted = set(resources) if resources is not None else None
        return sum_mutating_requests(self.metrics(), wanted)

    # ----------------------------------------------------------------- start-up

    @property
    def _pid_file(self) -> Path:
        return self.state_dir / "pids.json"

    def _start_once(self) -> None:
        t0 = time.monotonic()
        bin_dir = self._bin_dir or resolve_bin_dir()
        self._prepare_state_dir()
        self._certs = ensure_certs(self.state_dir / "certs")
        self._ssl = ssl.create_default_context(cafile=str(self._certs.ca_crt))
        self._make_users()
        self._ports = {"etcd": free_port(), "etcd-peer": free_port(), "apiserver": free_port()}
        self._components = {}
        deadline = t0 + self.start_timeout

        etcd = self._launch("etcd", self._etcd_argv(bin_dir))
        self._wait_for("etcd /health", self._etcd_healthy, deadline, watch=etcd)
        self.start_phases = {"etcd": time.monotonic() - t0}
        self._launch("kube-apiserver", self._apiserver_argv(bin_dir))
        self._wait_apiserver(deadline)
        self.start_phases["kube-apiserver"] = time.monotonic() - t0
        self._write_kubeconfig(self.kubeconfig, ADMIN_USER)
        # The controllers wait only briefly for the apiserver, so they start once it is ready.
        if self._want_kcm:
            self._ports["kube-controller-manager"] = free_port()
            self._launch("kube-controller-manager", self._kcm_argv(bin_dir))
        if self._want_scheduler:
            self._ports["kube-scheduler"] = free_port()
            self._launch("kube-scheduler", self._scheduler_argv(bin_dir))
        self.wait_ready(max(1.0, deadline - time.monotonic()))
        self.start_phases["controllers"] = time.monotonic() - t0
        self.version = json.loads(self._api_get("/version")[1])["gitVersion"]
        self.etcd_version = self._etcd_version()

    def _prepare_state_dir(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        # Leftovers of an earlier run in the same dir (a killed `up`) would hold etcd's data.
        procs.kill_recorded(self._pid_file, str(self.state_dir))
        if self._reset:
            shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)

    def _make_users(self) -> None:
        users = {
            ADMIN_USER: ("system:masters",),
            # Without --use-service-account-credentials the controller-manager acts as itself
            # for every controller; the bootstrap role for that name is too narrow for that.
            "system:kube-controller-manager": ("system:masters",),
            # The scheduler's bootstrap ClusterRole covers it, so it runs as it would in a cluster.
            "system:kube-scheduler": (),
            **{name: tuple(groups) for name, groups in self._extra_users.items()},
        }
        self._users = {
            name: StaticUser(name, groups, secrets.token_hex(24)) for name, groups in users.items()
        }
        lines = [
            f'{u.token},{u.name},{u.name},"{",".join(u.groups)}"' for u in self._users.values()
        ]
        token_file = self.state_dir / "tokens.csv"
        token_file.write_text("\n".join(lines) + "\n")
        token_file.chmod(0o600)

    def _launch(self, name: str, argv: list[str]) -> procs.Component:
        comp = procs.Component(name, argv, self.log_path(name), self.state_dir)
        self._components[name] = comp
        comp.start()
        # Recorded at once, so `down` finds it even if this process dies mid-start.
        procs.write_pid_file(self._pid_file, list(self._components.values()))
        return comp

    def _etcd_argv(self, bin_dir: Path) -> list[str]:
        client = f"http://127.0.0.1:{self._ports['etcd']}"
        peer = f"http://127.0.0.1:{self._ports['etcd-peer']}"
        return [
            str(bin_dir / "etcd"),
            "--name=pdd",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=pdd={peer}",
            # A throwaway cluster: durability buys nothing and fsync dominates on slow disks.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_argv(self, bin_dir: Path) -> list[str]:
        c = self._certs
        assert c is not None
        return [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_endpoint}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._ports['apiserver']}",
            f"--tls-cert-file={c.serving_crt}",
            f"--tls-private-key-file={c.serving_key}",
            f"--token-auth-file={self.state_dir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={c.sa_pub}",
            f"--service-account-signing-key-file={c.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # The `kubernetes` Service would get 127.0.0.1 as its endpoint, which Endpoints
            # validation rejects; nothing here needs in-cluster access to the apiserver.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.state_dir / 'certs' / 'apiserver'}",
            "--profiling=false",
            # Writes only, with who made them: tests count one client's writes exactly.
            f"--audit-policy-file={self._write_audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            *self._gate_argv(),
            *(
                [f"--runtime-config={','.join(self._runtime_config)}"]
                if self._runtime_config
                else []
            ),
            *self._extra_apiserver_args,
        ]

    def _gate_argv(self) -> list[str]:
        if not self._feature_gates:
            return []
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self._feature_gates.items()))
        return [f"--feature-gates={gates}"]

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "logs" / "audit.jsonl"

    def _write_audit_policy(self) -> Path:
        path = self.state_dir / "audit-policy.yaml"
        path.write_text(audit_policy(self._audit_reads_of))
        return path

    def pause_etcd(self, seconds: float) -> None:
        """Freeze etcd (SIGSTOP) for `seconds`, then let it go on (SIGCONT): the apiserver
        stays up but cannot read or write, as during an etcd leader election or a stall."""
        proc = self._components["etcd"].proc
        assert proc is not None, "etcd is not running"
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(proc.pid, signal.SIGCONT)

    def writes_by(
        self, user: str, resources: Iterable[str] | None = None, namespace: str | None = None
    ) -> int:
        """Mutating requests the apiserver completed for `user` (from its audit log),
        optionally only for these resources ("pods", "pods/status" as RBAC names them)."""
        wanted = set(resources) if resources is not None else None
        count = 0
        if not self.audit_log.exists():
            return 0
        with self.audit_log.open(encoding="utf-8") as fh:
            for line in fh:
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete":
                    continue
                if event.get("user", {}).get("username") != user:
                    continue
                if event.get("verb") not in WRITE_VERBS:  # reads are audited for some users
                    continue
                ref = event.get("objectRef", {})
                if namespace is not None and ref.get("namespace") != namespace:
                    continue
                resource = ref.get("resource", "")
                if ref.get("subresource"):
                    resource += "/" + ref["subresource"]
                if wanted is None or resource in wanted:
                    count += 1
        return count

    def reads_by(
        self, user: str, resource: str, verbs: tuple[str, ...] = ("list", "watch")
    ) -> list[tuple[str, str]]:
        """(verb, request URI) of each read of `resource` by `user` (lists and watches unless
        `verbs` says otherwise); only for a user named in `audit_reads_of`."""
        # A watch is logged when its response starts and again when it ends: one per ID.
        seen: dict[str, tuple[str, str]] = {}
        if not self.audit_log.exists():
            return []
        with self.audit_log.open(encoding="utf-8") as fh:
            for line in fh:
                event = json.loads(line)
                if event.get("user", {}).get("username") != user:
                    continue
                if event.get("verb") not in verbs:
                    continue
                if event.get("objectRef", {}).get("resource") != resource:
                    continue
                seen[event["auditID"]] = (event["verb"], event.get("requestURI", ""))
        return list(seen.values())

    def _component_common_argv(self, name: str, user: str) -> list[str]:
        kubeconfig = self.state_dir / f"kubeconfig-{name}"
        self._write_kubeconfig(kubeconfig, user)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._ports[name]}",
            f"--cert-dir={self.state_dir / 'certs' / name}",
            # One replica; waiting for a lease only adds seconds to every start.
            "--leader-elect=false",
            # The defaults (20 and 50 QPS) make a 2,000-pod benchmark wait on client-side
            # throttling of the controllers, not on anything the operator does.
            f"--kube-api-qps={self._controller_qps}",
            f"--kube-api-burst={2 * self._controller_qps}",
        ]

    def _kcm_argv(self, bin_dir: Path) -> list[str]:
        c = self._certs
        assert c is not None
        return [
            str(bin_dir / "kube-controller-manager"),
            *self._component_common_argv(
                "kube-controller-manager", "system:kube-controller-manager"
            ),
            f"--controllers={','.join(self.controllers)}",
            f"--service-account-private-key-file={c.sa_key}",
            f"--root-ca-file={c.ca_crt}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--use-service-account-credentials=false",
            *self._extra_kcm_args,
            *self._gate_argv(),
        ]

    def _scheduler_argv(self, bin_dir: Path) -> list[str]:
        return [
            str(bin_dir / "kube-scheduler"),
            *self._component_common_argv("kube-scheduler", "system:kube-scheduler"),
            *self._gate_argv(),
        ]

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        assert self._certs is not None
        ca = base64.b64encode(self._certs.ca_crt.read_bytes()).decode()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "pdd-local",
                    "cluster": {"server": self.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": user, "user": {"token": self._users[user].token}}],
            "contexts": [{"name": "pdd-local", "context": {"cluster": "pdd-local", "user": user}}],
            "current-context": "pdd-local",
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(path)

    # ----------------------------------------------------------------- waiting

    def _wait_apiserver(self, deadline: float) -> None:
        self._wait_for(
            "kube-apiserver /readyz",
            lambda: self._api_get("/readyz", timeout=5)[0] == 200,
            deadline,
            watch=self._components["kube-apiserver"],
        )

    def _runs_controller(self, name: str, alias: str) -> bool:
        if "kube-controller-manager" not in self._components:
            return False
        return any(c in (name, alias, "*") for c in self.controllers)

    def _wait_component_healthz(self, name: str, deadline: float) -> None:
        url = f"https://127.0.0.1:{self._ports[name]}/healthz"
        # The controllers serve a self-signed certificate of their own.
        ctx = ssl._create_unverified_context()
        self._wait_for(
            f"{name} /healthz",
            lambda: _http_get(url, None, ctx, timeout=2)[0] == 200,
            deadline,
            watch=self._components[name],
        )

    def _wait_for(
        self,
        what: str,
        ok: Callable[[], bool],
        deadline: float,
        watch: procs.Component | None = None,
    ) -> None:
        """Polls `ok` with exponential backoff; fails fast, with the log tail, when the
        component that should make it true has exited."""
        delay = 0.02
        while True:
            if ok():
                return
            if watch is not None and not watch.alive():
                self._raise_for(watch, f"{watch.name} exited ({watch.exit_code()})")
            if time.monotonic() >= deadline:
                if watch is not None:
                    self._raise_for(watch, f"timed out waiting for {what}")
                raise ControlPlaneStartError(f"timed out waiting for {what}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _raise_for(self, comp: procs.Component, why: str) -> None:
        log = comp.log_tail(40)
        raise ControlPlaneStartError(
            f"{why}; last lines of {comp.log_path}:\n{log}",
            port_conflict="address already in use" in log,
        )

    # ----------------------------------------------------------------- HTTP

    def _api_get(self, path: str, timeout: float = 5) -> tuple[int, str]:
        assert self._ssl is not None
        return _http_get(self.server + path, self.admin_token, self._ssl, timeout)

    def _etcd_healthy(self) -> bool:
        status, body = _http_get(self.etcd_endpoint + "/health", None, None, timeout=2)
        return status == 200 and '"true"' in body

    def _etcd_version(self) -> str:
        status, body = _http_get(self.etcd_endpoint + "/version", None, None, timeout=2)
        return str(json.loads(body).get("etcdserver", "")) if status == 200 else ""

    def _stop_components(self) -> None:
        # etcd last: an apiserver that loses etcd mid-shutdown hangs until SIGKILL.
        comps = list(self._components.values())
        procs.stop_all([c for c in comps if c.name != "etcd"])
        procs.stop_all([c for c in comps if c.name == "etcd"])
        self._pid_file.unlink(missing_ok=True)


def _http_get(
    url: str, token: str | None, ctx: ssl.SSLContext | None, timeout: float
) -> tuple[int, str]:
    """GET returning (status, body); status 0 when nothing answered yet."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (OSError, ValueError):
        return 0, ""


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str, metric: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in Prometheus text format, as (labels, value)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(metric):
            continue
        m = _SAMPLE.match(line)
        if m and m["name"] == metric:
            out.append((dict(_LABEL.findall(m["labels"] or "")), float(m["value"])))
    return out


def sum_mutating_requests(metrics_text: str, resources: set[str] | None) -> int:
    total = 0.0
    for labels, value in parse_samples(metrics_text, "apiserver_request_total"):
        if labels.get("verb") not in MUTATING_VERBS:
            continue
        if resources is not None:
            sub = labels.get("subresource", "")
            name = labels.get("resource", "") + (f"/{sub}" if sub else "")
            if name not in resources:
                continue
        total += value
    return int(total)
