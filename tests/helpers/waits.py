"""Polling helpers with a deadline and a clear failure message (tests only)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float = 60, interval: float = 0.3, what: str = ""
) -> T:
    deadline = time.time() + timeout
    last: object = None
    while time.time() < deadline:
        try:
            result = check()
            if result:
                return result
            last = result
        except Exception as err:  # keep polling; report the last error on timeout
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")


def wait_namespaces_gone(api_client: object, timeout: float = 60) -> None:
    """Wait until no namespace is Terminating: the namespace controller's deletions are writes
    too, and a test that counts writes must not see another test's clean-up."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    wait_for(
        lambda: not [n for n in core.list_namespace().items if n.status.phase == "Terminating"],
        timeout,
        what="terminating namespaces to be gone",
    )


# After an apiserver restart (the fault tests make one on the shared control plane) the
# controller-manager can take over a minute to see new namespaces again (73 s once, on a
# loaded run); until then its ServiceAccount controller makes no `default`.
SERVICE_ACCOUNT_CONTROLLER_S = 120.0


def create_namespace_ready(api_client: object, name: str) -> str:
    """Create namespace `name` and wait until the ServiceAccount controller made `default`
    in it: pods are refused before that."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        SERVICE_ACCOUNT_CONTROLLER_S,
        interval=0.1,
        what=f"the ServiceAccount controller to make `default` in {name}",
    )
    return name


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll with backoff until ``condition()`` is truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
