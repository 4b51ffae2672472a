"""The `operator` fixture: the real operator process, one per test module that imports it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helpers.operator_proc import OperatorProcess, install_crd

OPERATOR_USER = "pdd-operator"  # a static user of the test control plane (conftest)


@pytest.fixture(scope="module")
def operator(
    control_plane: Any,
    kubeconfig: Path,
    api_client: client.ApiClient,
    node_sim: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    install_crd(api_client)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    identity = control_plane.kubeconfig_for(OPERATOR_USER)  # its writes show in the audit log
    proc = OperatorProcess(identity, log, resync_seconds=2.0).start()
    yield proc
    proc.kill()
