"""Dump what an engine's own argument parser accepts, as JSON into the file given.

Runs inside a throwaway environment with the engine installed (hack/engine-fixtures.sh makes
them); imports nothing of this project. ``engine`` is vllm or sglang; the parser is the one
the engine's server command builds (`vllm serve`, `python3 -m sglang.launch_server`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any


def force_cpu_platform() -> None:
    """vLLM picks its platform at first use and finds none on a machine without a GPU; its
    CPU platform serves the parser (0.33 also takes VLLM_TARGET_DEVICE=cpu, 0.11 does not)."""
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()


def vllm_parser() -> argparse.ArgumentParser:
    """`vllm serve`'s parser, wherever the release keeps its builder."""
    force_cpu_platform()
    try:  # 0.33
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.11
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def vllm_extras() -> dict[str, Any]:
    """What ``--kv-transfer-config`` accepts and which environment variables vLLM reads."""
    import dataclasses
    import typing

    import vllm.envs
    from vllm.config.kv_transfer import KVRole, KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    roles = sorted(
        {r for group in typing.get_args(KVRole) for r in typing.get_args(group) or (group,)}
    )
    return {
        "kv_transfer_config": {
            "fields": sorted(f.name for f in dataclasses.fields(KVTransferConfig)),
            "kv_roles": roles,
            "connectors": sorted(KVConnectorFactory._registry),
            "offloading_size_keys": offloading_size_keys(Path(vllm.__file__).parent),
            "simple_offload": simple_offload(),
        },
        "nixl_kv_transfer_params": nixl_kv_transfer_params(),
        "env": sorted(vllm.envs.environment_variables),
    }


# Where the OffloadingConnector's CPU spec reads its size: up to 0.19 one module, from 0.20 a
# package.
OFFLOADING_CPU_SPECS = ("v1/kv_offload/cpu.py", "v1/kv_offload/cpu/spec.py")
OFFLOADING_SIZE_KEYS = ("cpu_bytes_to_use", "num_cpu_blocks")


def offloading_size_keys(vllm_root: Path) -> list[str]:
    """The size keys the OffloadingConnector's CPU spec reads from kv_connector_extra_config
    (`extra_config.get("<key>")`), read from the release's source: its config is a free-form
    dict, which no parser describes."""
    found: set[str] = set()
    for relative in OFFLOADING_CPU_SPECS:
        path = vllm_root / relative
        if path.exists():
            text = path.read_text()
            found |= {k for k in OFFLOADING_SIZE_KEYS if f'extra_config.get("{k}")' in text}
    return sorted(found)


SIMPLE_OFFLOAD_CONNECTOR = (
    "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector"
)


def simple_offload() -> dict[str, Any] | None:
    """The SimpleCPUOffloadConnector's kv_connector_extra_config keys (every
    ``extra_config.get("<key>"`` of its module) and its backends; None where the release has
    no such connector (0.11)."""
    if not _importable(SIMPLE_OFFLOAD_CONNECTOR):
        return None
    import importlib

    module = importlib.import_module(SIMPLE_OFFLOAD_CONNECTOR)
    text = Path(module.__file__).read_text()
    return {
        "keys": sorted(set(re.findall(r'extra_config\.get\(\s*"(\w+)"', text))),
        "backends": sorted(module.VALID_KV_OFFLOAD_BACKENDS),
    }


NIXL_PULL_SCHEDULERS = (
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler",  # 0.24 and later
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector",  # 0.11
)


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package the release does not have
        return False


def nixl_kv_transfer_params() -> dict[str, Any]:
    """The keys NixlConnector's pulling scheduler puts in a prefill's kv_transfer_params
    (``request_finished``'s ``dict(...)``) and those a decode checks for before it pulls
    (every ``all(p in params for p in (...))``), read from the release's source."""
    import ast
    import importlib
    import inspect

    name = next(n for n in NIXL_PULL_SCHEDULERS if _importable(n))
    tree = ast.parse(inspect.getsource(importlib.import_module(name)))
    answer: set[str] = set()
    required: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "request_finished":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "dict":
                    answer |= {k.arg for k in call.keywords if k.arg}
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "all":
            for gen in node.args:
                if isinstance(gen, ast.GeneratorExp) and isinstance(
                    gen.generators[0].iter, ast.Tuple
                ):
                    required |= {
                        e.value for e in gen.generators[0].iter.elts if isinstance(e, ast.Constant)
                    }
    return {"module": name, "prefill_answer": sorted(answer), "decode_requires": sorted(required)}


def sglang_extras() -> dict[str, Any]:
    """The environment variables SGLang declares (sglang/srt/environ.py), and its P/D
    bootstrap exchange over HTTP and ZMQ, read from the release's source
    (hack/sglang_exchange_dump.py)."""
    from sglang.srt import environ
    from sglang_exchange_dump import bootstrap_exchange

    names = {
        name
        for name, value in vars(environ.Envs).items()
        if name.isupper() and not name.startswith("_") and hasattr(value, "get")
    }
    site = Path(str(importlib.metadata.distribution("sglang").locate_file("")))
    return {"env": sorted(names), "bootstrap_exchange": bootstrap_exchange(site)}


def type_name(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "flag"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool-optional"
    kind = action.type
    if kind is None:
        return "str"
    name = getattr(kind, "__name__", "") or type(kind).__name__
    return name if name in ("int", "float", "str") else f"other:{name}"


DEPRECATED = re.compile(r"deprecat|will be removed|removed in", re.IGNORECASE)


def describe(action: argparse.Action) -> dict[str, Any]:
    help_text = action.help if isinstance(action.help, str) else ""
    return {
        "options": sorted(action.option_strings),
        "dest": action.dest,
        "type": type_name(action),
        "nargs": None if action.nargs is None else str(action.nargs),
        "choices": None if action.choices is None else sorted(str(c) for c in action.choices),
        "default": action.default if isinstance(action.default, (int, float, str, bool)) else None,
        "deprecated": bool(getattr(action, "deprecated", False))
        or bool(DEPRECATED.search(help_text)),
        "help": help_text[:400],
    }


def main() -> None:
    engine, out = sys.argv[1], sys.argv[2]  # a file: vLLM logs to stdout
    parser = {"vllm": vllm_parser, "sglang": sglang_parser}[engine]()
    extras = {"vllm": vllm_extras, "sglang": sglang_extras}[engine]()
    actions = [describe(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    actions.sort(key=lambda a: a["options"][0])
    dump = {
        "engine": engine,
        "version": importlib.metadata.version(engine),
        "python": sys.version.split()[0],
        "parser": parser.prog,
        "actions": actions,
        **extras,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(dump, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
