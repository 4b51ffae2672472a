"""Processes for the reference-engine tests: pdd sidecars with static peers, reference
engines (the test double of vLLM/SGLang) started through the image shims with the command
lines the operator's engine adapters render, and the real routers. All on 127.0.0.0/8; every
wait is bounded; ``Procs.close`` stops everything started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from helpers.factories import make_pdd
from helpers.waits import free_port as free_port  # its tests import both from here
from helpers.waits import wait_until as wait_until
from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.registry import ENGINES

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DIR = REPO / "operator"
IMAGE = OPERATOR_DIR / "pdd_refengine" / "image"
TOKEN = "refengine-test-token"
MODEL = "test-org/tiny-model"  # not in the layout table: the default 256 B/token


# Both roles in the host's PID namespace: where the operator renders vLLM's push connector.
HOST_PID = {"podTemplate": {"spec": {"hostPID": True}}}


def rendered_engine_argv(
    engine: str,
    role: str,
    host: str,
    port: int,
    bootstrap: int,
    release: str | None = None,
    host_pid: bool = False,
    adapters: Sequence[dict[str, Any]] = (),
    router: dict[str, Any] | None = None,
) -> list[str]:
    """The engine command line the operator renders for ``role`` (of ``release``, default
    the newest supported; with ``host_pid``, for roles that share the host's PID namespace;
    with spec.model.adapters; with spec.router), bound where the test says (a pod's IP and
    ports are its own; here pods share loopback, so each gets its own)."""
    spec = _spec(engine, bootstrap, release, host_pid, adapters, router)
    adapter = ENGINES[engine]
    launch = adapter.launch(spec, role)
    argv = [*launch.command, *launch.args, *adapter.lora_flags(spec)]
    return _replace_flag(_replace_flag(argv, "--host", host), "--port", str(port))


def rendered_engine_values(
    engine: str, role: str, router: dict[str, Any] | None = None
) -> dict[str, str]:
    """The environment variables with plain values the operator renders for ``role`` (those
    from the downward API, the pod's IP, each test sets itself)."""
    launch = ENGINES[engine].launch(_spec(engine, 0, router=router), role)
    return {e["name"]: e["value"] for e in launch.env if "value" in e}


def _spec(
    engine: str,
    bootstrap: int,
    release: str | None = None,
    host_pid: bool = False,
    adapters: Sequence[dict[str, Any]] = (),
    router: dict[str, Any] | None = None,
) -> PDDeploymentSpec:
    versions = ENGINES[engine].versions
    assert versions is not None
    roles = {"prefill": HOST_PID, "decode": HOST_PID} if host_pid else {}
    return make_pdd(
        {
            "engine": {"type": engine, "version": release or str(versions.newest)},
            "model": {"name": MODEL, "servedName": "tiny", "adapters": list(adapters)},
            "kvTransfer": {"bootstrapPort": bootstrap},
            **({"router": router} if router else {}),
            **roles,
        }
    ).spec


def _replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def http(
    method: str, url: str, body: Any = None, timeout: float = 30, token: str | None = None
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def metric(url: str, name: str) -> float | None:
    """The value of an unlabelled (or first labelled) sample ``name`` at ``url``/metrics."""
    text = http("GET", f"{url}/metrics")[1].decode()
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == name or series.startswith(name + "{"):
            return float(value)
    return None


class Proc:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        log_dir: Path,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.terminate()
        self.wait_stopped()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)

    def wait_stopped(self) -> None:
        """Wait for the exit a SIGTERM asked for; kill after 10 s."""
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Procs:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.started: list[Proc] = []
        self.router_metrics: dict[str, str] = {}  # a router's URL -> its /metrics URL

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([str(IMAGE / "bin"), venv_bin, env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join([str(OPERATOR_DIR), str(IMAGE / "python")])
        env["UCX_NET_DEVICES"] = "lo"  # loopback only
        env.update(extra)
        return env

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> Proc:
        proc = Proc(name, argv, env, self.tmp_path, stop_signal)
        self.started.append(proc)
        return proc

    def sidecar(
        self, role: str, host: str, port: int, peers: str, wait: bool = True, pod: str = ""
    ) -> str:
        """A sidecar's URL; with ``wait``, once it answers (else `wait_sidecar` it later).
        ``pod``: its pod's name (default ROLE-0)."""
        pod = pod or f"{role}-0"
        argv = [
            sys.executable,
            "-m",
            "pdd_sidecar",
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--pod-ip",
            host,
            "--role",
            role,
            "--pod-name",
            pod,
            "--pod-uid",
            f"uid-{pod}",
            "--deployment",
            "demo",
            "--namespace",
            "test",
            "--token-file",
            str(self.token_file),
            "--peer-source",
            f"static:{peers}",
        ]
        proc = self.start(f"sidecar-{pod}", argv, self.env())
        url = f"http://{host}:{port}"
        if wait:
            self.wait_sidecar(proc, url)
        return url

    def wait_sidecar(self, proc: Proc, url: str) -> None:
        wait_until(lambda: self._answers(proc, f"{url}/healthz"), 20, proc.name)

    def engine(self, name: str, argv: Sequence[str], sidecar_url: str, **env: str) -> Proc:
        environment = self.env(
            PDD_SIDECAR_URL=sidecar_url,
            PDD_SIDECAR_TOKEN_FILE=str(self.token_file),
            POD_NAME=name,
            **env,
        )
        return self.start(name, argv, environment)

    def wait_healthy(self, proc: Proc, url: str, timeout_s: float = 60) -> None:
        wait_until(lambda: self._answers(proc, f"{url}/health"), timeout_s, f"{proc.name} health")

    def _answers(self, proc: Proc, url: str) -> bool:
        if not proc.alive():
            pytest.fail(f"{proc.name} exited: {proc.log()}")
        try:
            return http("GET", url, timeout=2)[0] == 200
        except OSError:
            return False

    def close(self) -> None:
        """Stop everything at once: an engine drains for a quiet spell before it exits
        (pdd_refengine.server), and the engines' drains need not follow one another."""
        for proc in reversed(self.started):
            proc.terminate()
        for proc in reversed(self.started):
            proc.wait_stopped()

    def router(
        self,
        engine: str,
        host: str,
        prefills: Sequence[tuple[str, int]],
        decode: str,
        extra: Sequence[str] = (),
    ) -> str:
        """The engine's real router (vllm-router, smg) in static PD mode on ``host``: each
        prefill's URL with its bootstrap port (SGLang's), one decode, ``extra`` flags; its
        URL once it says it is ready. Killed at the end: how a router shuts down is not under
        test here, and smg's graceful shutdown takes about 5 s of every teardown."""
        port, metrics_port = free_port(host), free_port(host)
        common = ["--host", host, "--port", str(port)]
        common += ["--prometheus-host", host, "--prometheus-port", str(metrics_port), *extra]
        bin_dir = Path(sys.executable).parent
        if engine == "vllm":
            argv = [str(bin_dir / "vllm-router"), *common, "--vllm-pd-disaggregation"]
            argv += [arg for url, _ in prefills for arg in ("--prefill", url)]
            argv += ["--decode", decode, "--kv-connector", "nixl"]
        else:
            argv = [str(bin_dir / "smg"), "launch", *common, "--pd-disaggregation"]
            argv += [arg for url, boot in prefills for arg in ("--prefill", url, str(boot))]
            argv += ["--decode", decode, "--disable-tokenizer-autoload"]
        router = self.start(f"router-{engine}", argv, self.env(), signal.SIGKILL)
        url = f"http://{host}:{port}"
        self.router_metrics[url] = f"http://{host}:{metrics_port}/metrics"
        wait_until(lambda: self._answers(router, f"{url}/readiness"), 60, f"{engine} router")
        return url


@contextmanager
def running(tmp_path: Path) -> Iterator[Procs]:
    """Processes started for one test: each one's log printed when the test fails, every one
    stopped at the end."""
    procs = Procs(tmp_path)
    try:
        yield procs
    except BaseException:
        for proc in procs.started:
            print(f"--- {proc.name}\n{proc.log()}")
        raise
    finally:
        procs.close()
