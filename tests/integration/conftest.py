"""The integration tier: one real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) and one node simulator per test session; a fresh namespace per test."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from helpers.operator_proc import (
    CONFINED_USER,
    OPERATOR_USER,
    SECOND_OPERATOR_USER,
    OperatorProcess,
    operator_on,
)
from helpers.waits import create_namespace_ready
from pdd_localcluster import LocalControlPlane, NodeSimulator, gpu_fleet

INTEGRATION_DIR = Path(__file__).parent
_BANNER = pytest.StashKey[str]()

# The default fleet: two NVLink cliques of four 8-GPU nodes, each clique over two racks.
FLEET_CLIQUES = 2
FLEET_NODES_PER_CLIQUE = 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees every collected item of the session, not only this directory's.
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    banner = terminalreporter.config.stash.get(_BANNER, None)
    if banner:
        terminalreporter.write_sep("-", "local control plane")
        terminalreporter.write_line(banner)


def _print_now(config: pytest.Config, line: str) -> None:
    """Writes past pytest's output capture, which holds fixture output until a test fails."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(line)


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalControlPlane]:
    state = tmp_path_factory.mktemp("controlplane")
    # The operator runs as its own user, so the audit log tells its writes from everyone's;
    # its lists and watches too: what it asks the apiserver to send (test_operator_watches).
    with LocalControlPlane(
        state,
        users={
            OPERATOR_USER: ["system:masters"],
            SECOND_OPERATOR_USER: ["system:masters"],
            CONFINED_USER: [],
        },
        audit_reads_of=[OPERATOR_USER],
    ) as cp:
        banner = (
            f"kube-apiserver {cp.version}, etcd {cp.etcd_version} at {cp.server}, "
            f"started in {cp.start_seconds:.1f}s; logs in {state / 'logs'}"
        )
        request.config.stash[_BANNER] = banner
        _print_now(request.config, f"local control plane: {banner}")
        yield cp


@pytest.fixture(scope="session")
def kubeconfig(control_plane: LocalControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def node_sim(control_plane: LocalControlPlane) -> Iterator[NodeSimulator]:
    fleet = gpu_fleet(FLEET_CLIQUES, FLEET_NODES_PER_CLIQUE, racks_per_clique=2, zone="zone-a")
    with NodeSimulator(control_plane.kubeconfig, fleet) as sim:
        yield sim


@pytest.fixture(scope="module")
def operator(
    control_plane: LocalControlPlane,
    api_client: client.ApiClient,
    node_sim: NodeSimulator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The real operator process, one per test module that asks for it, as OPERATOR_USER."""
    with operator_on(control_plane, api_client, tmp_path_factory.mktemp("operator")) as proc:
        yield proc


@pytest.fixture
def namespace(request: pytest.FixtureRequest, api_client: client.ApiClient) -> Iterator[str]:
    """A fresh namespace named after the test; deleted afterwards (not waited for: the
    namespace controller and the simulator finish that in the background)."""
    core = client.CoreV1Api(api_client)
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = create_namespace_ready(api_client, f"t-{slug}-{secrets.token_hex(3)}")
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
