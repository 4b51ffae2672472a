"""Fixtures of the NIXL tier; the process helpers live in ``nixl_harness``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, which puts no test directory on sys.path; the
# tests and this file import their helpers from this directory by name.
sys.path.insert(0, str(Path(__file__).parent))

from nixl_harness import (
    EtcdServer,
    Processes,
    find_etcd,
    free_port,
    http,
    stop_process,
    wait_until,
)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    binary = find_etcd()
    if binary is None:
        pytest.skip("no etcd binary: run `bash hack/fetch-binaries.sh` or set PDD_ETCD_BIN")
    client_port, peer_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    args = [
        binary, "--data-dir", str(tmp_path / "etcd"), "--name", "test",
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"test={peer_url}", "--log-level", "warn",
    ]  # fmt: skip
    with open(tmp_path / "etcd.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    server = EtcdServer(client_url)

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"etcd exited: {(tmp_path / 'etcd.log').read_text()[-2000:]}")
        try:
            return http("GET", f"{client_url}/health", None, timeout=2)[0] == 200
        except OSError:
            return False

    try:
        wait_until(ready, 30, "etcd to start")
        yield server
    finally:
        # etcd's graceful stop waits seconds for closed gRPC watch streams; its data is
        # throw-away here.
        stop_process(proc, grace_s=1)
