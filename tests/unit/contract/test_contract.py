"""pdd_contract: standard library only, and the copies outside it kept equal to it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import pdd_contract
from pdd_contract import env, paths, ports
from pdd_sidecar import client, config

CONTRACT_DIR = Path(pdd_contract.__file__).parent
MODULES = sorted(CONTRACT_DIR.glob("*.py"))


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", MODULES, ids=lambda path: path.name)
def test_imports_only_the_standard_library_and_itself(module: Path) -> None:
    roots = imported_roots(module.read_text())
    assert roots - set(sys.stdlib_module_names) - {"__future__", "pdd_contract"} == set()


def test_the_check_sees_a_third_party_import() -> None:
    assert imported_roots("import yaml\nfrom kubernetes import client\n") == {"yaml", "kubernetes"}


def test_env_names_are_spelled_like_their_values() -> None:
    names = {name: value for name, value in vars(env).items() if name.isupper()}
    assert names and all(
        value == name for name, value in names.items() if not isinstance(value, tuple)
    )


def test_the_engine_client_copies_match_the_contract() -> None:
    assert client.URL_ENV == env.PDD_SIDECAR_URL
    assert client.TOKEN_FILE_ENV == env.PDD_SIDECAR_TOKEN_FILE
    assert client.DEFAULT_TOKEN_FILE == paths.TOKEN_FILE
    rendered = f"http://127.0.0.1:{ports.SIDECAR_PORT}"
    assert rendered == client.DEFAULT_URL


def test_the_sidecar_listens_by_default_where_the_operator_renders_it() -> None:
    assert config.DEFAULT_PORT == ports.SIDECAR_PORT


def test_vllm_gets_one_side_channel_port_per_rank() -> None:
    assert ports.vllm_side_channel_ports(3) == (5600, 5601, 5602)
    assert ports.vllm_side_channel_ports(2, base=7000) == (7000, 7001)
