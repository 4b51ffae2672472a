"""A rendered engine command line, checked against what that engine release's own argument
parser accepts (tests/fixtures/engines/<engine>-<version>.json, made by hack/engine-fixtures.sh
from the installed engine; not a copy of its code).

What is checked, as argparse would on the engine's start: every option is one the parser
knows (spelled in full), its value has the option's type and is one of its choices, an option
that takes no value gets none; and what the release marks deprecated or removed is refused
here too. For vLLM, ``--kv-transfer-config`` is read as vLLM's KVTransferConfig: known fields,
a kv_role and a connector of that release. Variables ``VLLM_*`` the operator sets must be ones
the release reads (vllm/envs.py).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from pdd_operator.engines.version import Version

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
NO_VALUE = {"flag", "bool-optional"}


def fixture_path(engine: str, version: Version) -> Path:
    return FIXTURES / f"{engine}-{version}.json"


@cache
def parser_dump(engine: str, version: Version) -> dict[str, Any]:
    path = fixture_path(engine, version)
    if not path.exists():
        raise AssertionError(
            f"no parser fixture for {engine} {version}: run hack/engine-fixtures.sh "
            f"{engine} {version} and commit {path.relative_to(FIXTURES.parents[2])}"
        )
    dump: dict[str, Any] = json.loads(path.read_text())
    return dump


@cache
def _options(engine: str, version: Version) -> dict[str, dict[str, Any]]:
    return {
        option: action
        for action in parser_dump(engine, version)["actions"]
        for option in action["options"]
    }


def engine_args(engine: str, argv: list[str]) -> list[str]:
    """The arguments after the program and its subcommand (vLLM's model is one of them)."""
    for entry in (
        ["vllm", "serve"],
        ["sglang", "serve"],
        ["python3", "-m", "sglang.launch_server"],
    ):
        if argv[: len(entry)] == entry:
            return argv[len(entry) :]
    raise AssertionError(f"not a {engine} server command line: {argv[:3]}")


def command_line_problems(engine: str, version: Version, args: list[str]) -> list[str]:
    """What the release's parser would refuse or warn about in ``args`` (none: it accepts)."""
    options = _options(engine, version)
    problems: list[str] = []
    i = 0
    positionals = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-"):
            positionals += 1
            if engine != "vllm" or positionals > 1:  # vLLM's one positional: the model
                problems.append(f"unexpected argument {token!r}")
            continue
        name, _, inline = token.partition("=")
        action = options.get(name)
        if action is None:
            problems.append(f"{name}: not an option of {engine} {version}")
            continue
        if action["deprecated"]:
            problems.append(f"{name}: deprecated in {engine} {version}: {action['help'][:160]}")
        if action["type"] in NO_VALUE or action["nargs"] == "0":
            if inline:
                problems.append(f"{name} takes no value")
            continue
        values: list[str] = [inline] if inline else []
        if not values:
            many = action["nargs"] in ("+", "*")
            while i < len(args) and not args[i].startswith("--") and (many or not values):
                values.append(args[i])
                i += 1
        if not values and action["nargs"] not in ("?", "*"):
            problems.append(f"{name}: expects a value")
        problems += [p for v in values for p in _value_problems(engine, version, action, name, v)]
    return problems


def _value_problems(
    engine: str, version: Version, action: dict[str, Any], name: str, value: str
) -> list[str]:
    problems = []
    kind = action["type"]
    if kind in ("int", "float"):
        try:
            (int if kind == "int" else float)(value)
        except ValueError:
            problems.append(f"{name} {value!r}: not an {kind}")
    if action["choices"] is not None and value not in action["choices"]:
        problems.append(f"{name} {value!r}: not one of {action['choices']}")
    if engine == "vllm" and name == "--kv-transfer-config":
        problems += kv_transfer_config_problems(version, value)
    return problems


def kv_transfer_config_problems(version: Version, value: str) -> list[str]:
    known = parser_dump("vllm", version)["kv_transfer_config"]
    try:
        config = json.loads(value)
    except json.JSONDecodeError as exc:
        return [f"--kv-transfer-config is not JSON: {exc}"]
    return _connector_problems(version, config, known, "--kv-transfer-config")


def _connector_problems(
    version: Version, config: dict[str, Any], known: dict[str, Any], where: str
) -> list[str]:
    """One KVTransferConfig's problems; a MultiConnector's children are KVTransferConfigs of
    their own (multi_connector.py builds each with KVTransferConfig(**child))."""
    problems = [f"{where}: no field {k!r}" for k in config if k not in known["fields"]]
    connector = config.get("kv_connector")
    if config.get("kv_role") not in known["kv_roles"]:
        problems.append(f"{where}: kv_role {config.get('kv_role')!r} unknown")
    if connector not in known["connectors"]:
        problems.append(f"{where}: no connector {connector!r}")
    nixl = connector in ("NixlConnector", "NixlPushConnector")
    if nixl and config.get("kv_role") == "kv_both" and version >= Version(0, 23, 0):
        problems.append(f"{where}: kv_both is deprecated with NixlConnector")
    extra = config.get("kv_connector_extra_config") or {}
    if connector == "MultiConnector":
        children = extra.get("connectors") or []
        if not children:
            problems.append(f"{where}: a MultiConnector without connectors")
        for i, child in enumerate(children):
            problems += _connector_problems(version, child, known, f"{where} connectors[{i}]")
    if connector == "OffloadingConnector":
        sizes = set(known["offloading_size_keys"])
        if not sizes & set(extra):
            problems.append(f"{where}: the OffloadingConnector needs one of {sorted(sizes)}")
        unread = [k for k in extra if k not in sizes]
        problems += [f"{where}: {k!r} is not a size key vLLM {version} reads" for k in unread]
    if connector == "SimpleCPUOffloadConnector":
        problems += _simple_offload_problems(version, extra, known, where)
    return problems


def _simple_offload_problems(
    version: Version, extra: dict[str, Any], known: dict[str, Any], where: str
) -> list[str]:
    """Keys the release's SimpleCPUOffloadConnector reads, a backend it has, and the ones its
    disk backend cannot start without."""
    read = known["simple_offload"]
    if read is None:
        return [f"{where}: vLLM {version} has no SimpleCPUOffloadConnector config to check"]
    problems = [f"{where}: vLLM {version} reads no {k!r}" for k in extra if k not in read["keys"]]
    backend = extra.get("kv_offload_backend", "cpu")
    if backend not in read["backends"]:
        problems.append(f"{where}: no kv_offload_backend {backend!r}")
    if backend == "disk" and not extra.get("disk_path"):
        problems.append(f"{where}: the disk backend needs disk_path")
    if backend == "disk" and not int(extra.get("disk_capacity_bytes", 1)) > 0:
        problems.append(f"{where}: the disk backend needs disk_capacity_bytes > 0")
    return problems


def env_problems(engine: str, version: Version, env: list[dict[str, Any]]) -> list[str]:
    """vLLM variables the release does not read (SGLang 0.5.4 reads many outside environ.py,
    so its list is not complete enough to refuse by)."""
    if engine != "vllm":
        return []
    known = set(parser_dump(engine, version)["env"])
    return [
        f"env {e['name']}: not read by vLLM {version}"
        for e in env
        if e["name"].startswith("VLLM_") and e["name"] not in known
    ]
