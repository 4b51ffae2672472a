"""Real processes for the NIXL tests: sidecars (``python -m pdd_sidecar serve``), stand-in
engines (``engine_proc.py``, a real ``nixl_agent`` each) and etcd, all on 127.0.0.0/8, all
started by the fixtures in conftest.py and stopped at teardown. Every wait is bounded."""

from __future__ import annotations

import base64
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers.waits import free_port as free_port  # the NIXL tests import both from here
from helpers.waits import wait_until as wait_until

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DIR = REPO / "operator"
ENGINE_SCRIPT = Path(__file__).with_name("engine_proc.py")
TOKEN = "test-token-7f3a9c"


def ok(answer: dict[str, Any]) -> dict[str, Any]:
    """A stand-in engine's answer, asserted successful."""
    assert answer["ok"], answer
    return answer


def sync_until(engine: Any, done: Any, what: str, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Run PeerSync.sync (long-poll) until ``done(reports)``; returns every report seen."""
    reports: list[dict[str, Any]] = []

    def step() -> bool:
        reports.append(ok(engine.call("sync", wait_s=2)))
        return bool(done(reports))

    wait_until(step, timeout_s, what)
    return reports


def write_and_verify(
    writer: Any, target: Any, target_info: dict[str, Any], *, peer: str, nbytes: int, seed: int
) -> None:
    """`writer` writes `nbytes` into `target`'s registered memory through NIXL; the bytes
    arrived when the target's digest matches the writer's."""
    written = ok(writer.call("write", peer=peer, remote_addr=target_info["addr"],
                             nbytes=nbytes, seed=seed))  # fmt: skip
    assert written["state"] == "DONE", written
    assert ok(target.call("digest", nbytes=nbytes))["digest"] == written["digest"]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(OPERATOR_DIR), env.get("PYTHONPATH", "")])
    )
    # Keep UCX's network lanes on loopback: tests never use another interface.
    env["UCX_NET_DEVICES"] = "lo"
    env.update(extra)
    return env


def http(
    method: str,
    url: str,
    token: str | None = TOKEN,
    body: bytes | None = None,
    timeout: float = 30,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace_s: float = 10
) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    wait_stopped(proc, grace_s)


def wait_stopped(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """Wait for a signalled process; killed after ``grace_s``."""
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# After SIGTERM a sidecar serves on while its engine has agents published, 55 s by default.
# A test's engine that was killed (or exits without unpublishing) never ends that drain, so
# every teardown sat out the harness's 10 s stop limit per sidecar. Tests of the drain itself
# pass their own --drain-seconds (the last one given wins).
HARNESS_DRAIN_S = 2


class SidecarProcess:
    def __init__(
        self,
        log_dir: Path,
        host: str,
        port: int,
        role: str,
        pod: str,
        uid: str,
        token_file: Path,
        peer_source: str,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.host, self.port, self.role, self.pod, self.uid = host, port, role, pod, uid
        self.url = f"http://{host}:{port}"
        self._log_path = log_dir / f"sidecar-{pod}-{uid}.log"
        args = [
            sys.executable, "-m", "pdd_sidecar", "--log-level", "debug", "serve",
            "--host", host, "--port", str(port), "--pod-ip", host,
            "--role", role, "--pod-name", pod, "--pod-uid", uid,
            "--deployment", "demo", "--namespace", "test",
            "--token-file", str(token_file), "--peer-source", peer_source,
            "--drain-seconds", str(HARNESS_DRAIN_S), *extra_args,
        ]  # fmt: skip
        with open(self._log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env or child_env()
            )
        wait_until(self._healthy, 20, f"sidecar {pod} on {self.url}")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"sidecar {self.pod} exited: {self.log()}")
        try:
            return http("GET", f"{self.url}/healthz", token=None, timeout=2)[0] == 200
        except OSError:
            return False

    def get_json(self, path: str, token: str | None = TOKEN, timeout: float = 30) -> Any:
        status, body, _ = http("GET", f"{self.url}{path}", token, timeout=timeout)
        assert status == 200, (status, body)
        return json.loads(body)

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample from /metrics, or None when absent."""
        text = http("GET", f"{self.url}/metrics")[1].decode()
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == (f"{name}{{{wanted}}}" if wanted else name):
                return float(value)
        return None

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.begin_stop()
        wait_stopped(self.proc)

    def begin_stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        stop_process(self.proc, signal.SIGKILL)


class EngineProcess:
    MARKER = b"@@engine "

    def __init__(self, log_dir: Path, name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self._stderr_path = log_dir / f"engine-{name}-{time.monotonic_ns()}.log"
        with open(self._stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(ENGINE_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env or child_env(),
            )
        self._buffer = b""

    def call(self, op: str, timeout_s: float = 60, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self._read_answer(time.monotonic() + timeout_s))
        return answer

    def _read_answer(self, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buffer:
                line, _, self._buffer = self._buffer.partition(b"\n")
                if line.startswith(self.MARKER):
                    return line[len(self.MARKER) :]
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"engine {self.name} did not answer in time: {self.stderr()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                pytest.fail(f"engine {self.name} exited: {self.stderr()}")
            self._buffer += chunk

    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.begin_stop()
        wait_stopped(self.proc)

    def begin_stop(self) -> None:
        """The exit request, and SIGTERM right behind it (as before the stops overlapped)."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        stop_process(self.proc, signal.SIGKILL)


class Processes:
    """Starts sidecars and engines for one test and stops every one of them afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN + "\n")
        self._started: list[SidecarProcess | EngineProcess] = []

    def sidecar(self, **kwargs: Any) -> SidecarProcess:
        sidecar = SidecarProcess(self.tmp_path, token_file=self.token_file, **kwargs)
        self._started.append(sidecar)
        return sidecar

    def engine(self, name: str, env: dict[str, str] | None = None) -> EngineProcess:
        engine = EngineProcess(self.tmp_path, name, env)
        self._started.append(engine)
        return engine

    def close(self) -> None:
        """Every process asked to stop at once (engines first, as they were started after
        their sidecars), then each waited for: the stops overlap instead of adding up."""
        for started in reversed(self._started):
            started.begin_stop()
        for started in reversed(self._started):
            wait_stopped(started.proc)


# -- etcd --------------------------------------------------------------------------------------


def find_etcd() -> str | None:
    candidates = [os.environ.get("PDD_ETCD_BIN", "")]
    if os.environ.get("KUBEBUILDER_ASSETS"):
        candidates.append(os.path.join(os.environ["KUBEBUILDER_ASSETS"], "etcd"))
    cache = os.path.expanduser("~/.cache/pdd-operator/bin")
    candidates += sorted(glob.glob(os.path.join(cache, "*", "etcd")), reverse=True)
    candidates.append(shutil.which("etcd") or "")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


class EtcdServer:
    def __init__(self, url: str) -> None:
        self.url = url

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, raw, _ = http("POST", f"{self.url}{path}", None, json.dumps(body).encode(), 5)
        assert status == 200, raw
        document: dict[str, Any] = json.loads(raw)
        return document

    def keys(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """key -> (value, mod_revision) for every key under prefix."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        document = self._post(
            "/v3/kv/range",
            {"key": base64.b64encode(prefix.encode()).decode(),
             "range_end": base64.b64encode(end.encode()).decode()},
        )  # fmt: skip
        return {
            base64.b64decode(kv["key"]).decode(): (
                base64.b64decode(kv.get("value", "")),
                int(kv["mod_revision"]),
            )
            for kv in document.get("kvs", [])
        }
