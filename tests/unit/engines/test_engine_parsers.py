"""Every engine command line the operator renders, for every supported release, is one that
release's own parser accepts: each example and a matrix of specs (TP, DP, EP, data-parallel
attention, multi-node ranks, block and page size, every model source and metadata mode).

The parsers' dumps are fixtures (tests/fixtures/engines, made by hack/engine-fixtures.sh from
the installed engines); a supported release without one fails here.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.engine_parsers import (
    command_line_problems,
    engine_args,
    env_problems,
    fixture_path,
    parser_dump,
)
from helpers.factories import make_pdd
from pdd_contract.env import PDD_NODE_RANK
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.registry import ENGINES, adapter_for
from pdd_operator.engines.version import Version
from pdd_operator.rendering.children import render_children
from pdd_operator.rendering.context import RenderContext

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PDD_EXAMPLES = sorted(p for p in EXAMPLES.rglob("*.yaml") if "kind: PDDeployment" in p.read_text())


def supported_releases(engine: str) -> list[Version]:
    """The releases whose wiring is rendered and checked: the range's two ends."""
    versions = adapter_for(engine).versions
    assert versions is not None
    return [versions.oldest, versions.newest]


RELEASES = [(e, v) for e in ("vllm", "sglang") for v in supported_releases(e)]
IDS = [f"{e}-{v}" for e, v in RELEASES]

ONE_NODE = {"replicas": 1, "gpusPerInstance": 8}
TWO_NODES = {"replicas": 1, "gpusPerInstance": 8, "nodesPerInstance": 2}
MATRIX: dict[str, dict[str, Any]] = {
    "default": {},
    "tp1": {"prefill": {"gpusPerInstance": 1}, "decode": {"gpusPerInstance": 1}},
    "tp8": {"prefill": dict(ONE_NODE), "decode": dict(ONE_NODE)},
    "block-128": {"engine": {"kvBlockSize": 128}},
    "kv-aware": {"router": {"prefillPolicy": "kv_aware"}},
    "dp2-tp4": {
        "prefill": {**ONE_NODE, "parallelism": {"tensor": 4, "data": 2}},
        "decode": {**ONE_NODE, "parallelism": {"tensor": 4, "data": 2}},
    },
    "ep8": {
        "prefill": {**ONE_NODE, "parallelism": {"tensor": 8, "expert": 8}},
        "decode": {**ONE_NODE, "parallelism": {"tensor": 8, "expert": 8}},
    },
    "two-nodes": {"prefill": dict(TWO_NODES), "decode": dict(TWO_NODES)},
    "pvc": {"model": {"name": "llama", "source": {"pvc": {"claimName": "weights"}}}},
    "host-path": {"model": {"name": "llama", "source": {"hostPath": {"path": "/data/llama"}}}},
    "image": {
        "model": {"name": "llama", "source": {"image": {"reference": "registry.example/llama:1"}}}
    },
    "hf-revision": {
        "model": {
            "name": "meta-llama/Llama-3.1-8B",
            "source": {"huggingFace": {"revision": "main"}},
        }
    },
    "sidecar-metadata": {"kvTransfer": {"metadataExchange": {"mode": "sidecar"}}},
    # The prefill's CPU tier of the KV cache: a known model (vLLM 0.11 counts blocks), and
    # data-parallel engines sharing a pod's tier.
    "cpu-offload": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "kvCache": {"offload": {"cpu": "64Gi"}},
        "prefill": {"gpusPerInstance": 2},
    },
    # ... with a disk tier behind it (SGLang 0.5.23's file storage backend, vLLM 0.33.0's
    # SimpleCPUOffloadConnector; SGLang 0.5.4 and vLLM 0.11.0 render none, and their command
    # lines stay as without it).
    "cpu-and-disk-offload": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "kvCache": {"offload": {"cpu": "64Gi", "disk": {"size": "200Gi"}}},
        "prefill": {"gpusPerInstance": 2},
    },
    # LoRA adapters from each source, loaded by both roles.
    "lora": {
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "adapters": [
                {"name": "sql", "source": {"huggingFace": {"repo": "org/llama-sql-lora"}}},
                {"name": "chat-v2", "source": {"pvc": {"claimName": "adapters", "subPath": "v2"}}},
                {"name": "ner", "source": {"image": {"reference": "registry.example/ner:1"}}},
            ],
        },
    },
    "cpu-offload-dp2-tp4": {
        "kvCache": {"offload": {"cpu": "200Gi"}},
        "prefill": {**ONE_NODE, "parallelism": {"tensor": 4, "data": 2}},
        "decode": {**ONE_NODE, "parallelism": {"tensor": 4, "data": 2}},
    },
    # 70B at TP 1 with both roles in the host's PID namespace: the operator's own block size
    # (and on 0.33 --prefix-match-unit and the push connector)
    "70b-host-pid": {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "prefill": {"gpusPerInstance": 1, "podTemplate": {"spec": {"hostPID": True}}},
        "decode": {"gpusPerInstance": 1, "podTemplate": {"spec": {"hostPID": True}}},
    },
}
# Data-parallel attention inside the TP group: SGLang's DeepSeek-style layout.
SGLANG_MATRIX = {
    "dp-attention": {
        "prefill": {**ONE_NODE, "parallelism": {"tensor": 8, "data": 8}},
        "decode": {**ONE_NODE, "parallelism": {"tensor": 8, "data": 8}},
    },
    "dp-attention-two-nodes": {
        "prefill": {**TWO_NODES, "parallelism": {"tensor": 16, "data": 8, "expert": 16}},
        "decode": {**TWO_NODES, "parallelism": {"tensor": 16, "data": 8, "expert": 16}},
    },
}


def launched(container: dict[str, Any], rank: int, tmp_path: Path) -> list[str]:
    """The engine's argv as the container's own start shell builds it for ``rank``."""
    printer = tmp_path / "print-argv"
    printer.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    printer.chmod(printer.stat().st_mode | stat.S_IEXEC)
    command, args = container["command"], container["args"]
    out = subprocess.run(
        [*command, str(printer), *args[1:]],
        env={"PATH": "/usr/bin:/bin", PDD_NODE_RANK: str(rank)},
        capture_output=True,
        text=True,
        check=True,
    )
    return [args[0], *out.stdout.splitlines()]


def engine_command_lines(pdd: PDDeployment, tmp_path: Path) -> dict[str, tuple[list[str], Any]]:
    """Each engine container's argv and env, by StatefulSet and rank."""
    lines: dict[str, tuple[list[str], Any]] = {}
    for child in render_children(pdd, RenderContext()):
        if child["kind"] != "StatefulSet" or child["metadata"]["labels"].get(
            "pdd.dev/role"
        ) not in ("prefill", "decode"):
            continue
        pod = child["spec"]["template"]["spec"]
        engine = next(c for c in pod["containers"] if c["name"] == "engine")
        for rank in range(min(child["spec"]["replicas"], 2) if _spans_nodes(child) else 1):
            name = f"{child['metadata']['name']}/rank{rank}"
            lines[name] = (launched(engine, rank, tmp_path), engine.get("env", []))
    assert lines, "no engine StatefulSet rendered"
    return lines


def _spans_nodes(statefulset: dict[str, Any]) -> bool:
    return "pdd.dev/instance" in statefulset["spec"]["template"]["metadata"]["labels"]


def problems_of(pdd: PDDeployment, engine: str, release: Version, tmp_path: Path) -> list[str]:
    found = []
    for where, (argv, env) in engine_command_lines(pdd, tmp_path).items():
        args = engine_args(engine, argv)
        found += [f"{where}: {p}" for p in command_line_problems(engine, release, args)]
        found += [f"{where}: {p}" for p in env_problems(engine, release, env)]
    return found


def pinned(spec: dict[str, Any], engine: str, release: Version) -> dict[str, Any]:
    engine_spec = dict(spec.get("engine") or {})
    engine_spec.update(type=engine, version=str(release))
    engine_spec.setdefault("image", "registry.example/engine@sha256:" + "0" * 64)
    return {**spec, "engine": engine_spec}


@pytest.mark.parametrize(("engine", "release"), RELEASES, ids=IDS)
def test_every_supported_release_has_its_parser_fixture(engine: str, release: Version) -> None:
    dump = parser_dump(engine, release)
    assert (dump["engine"], dump["version"]) == (engine, str(release)), fixture_path(
        engine, release
    )


@pytest.mark.parametrize(("engine", "release"), RELEASES, ids=IDS)
@pytest.mark.parametrize("case", sorted(MATRIX))
def test_the_matrix_passes_each_releases_parser(
    engine: str, release: Version, case: str, tmp_path: Path
) -> None:
    pdd = make_pdd(pinned(MATRIX[case], engine, release))
    assert problems_of(pdd, engine, release, tmp_path) == []


@pytest.mark.parametrize("release", supported_releases("sglang"), ids=str)
@pytest.mark.parametrize("case", sorted(SGLANG_MATRIX))
def test_sglang_data_parallel_attention_passes_each_releases_parser(
    release: Version, case: str, tmp_path: Path
) -> None:
    pdd = make_pdd(pinned(SGLANG_MATRIX[case], "sglang", release))
    assert problems_of(pdd, "sglang", release, tmp_path) == []


def _example_releases() -> list[tuple[Path, Version]]:
    cases = []
    for path in PDD_EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "PDDeployment":
                engine = document["spec"].get("engine", {}).get("type", "vllm")
                cases += [(path, v) for v in supported_releases(engine)]
                break
    return cases


@pytest.mark.parametrize(
    ("example", "release"),
    _example_releases(),
    ids=lambda v: v.name if isinstance(v, Path) else str(v),
)
def test_every_example_passes_each_releases_parser(
    example: Path, release: Version, tmp_path: Path
) -> None:
    for document in yaml.safe_load_all(example.read_text()):
        if not document or document.get("kind") != "PDDeployment":
            continue
        engine = document["spec"].get("engine", {}).get("type", "vllm")
        document["spec"]["engine"]["version"] = str(release)
        meta = {"namespace": "default", **document["metadata"], "uid": "u", "generation": 1}
        pdd = PDDeployment.from_body({**document, "metadata": meta})
        assert problems_of(pdd, engine, release, tmp_path) == []


def test_the_checker_refuses_what_the_parsers_refuse() -> None:
    """The check can fail: what each release's own parser refuses or deprecates."""
    old, new = supported_releases("sglang")
    assert command_line_problems("sglang", new, ["--prefill-round-robin-balance"])
    assert command_line_problems("sglang", old, ["--attn-dp-size", "8"])
    assert command_line_problems("sglang", new, ["--enable-dp-attention"])  # deprecated
    assert command_line_problems("sglang", new, ["--tp", "two"])
    assert command_line_problems("sglang", new, ["--disaggregation-mode", "both"])
    vllm_new = supported_releases("vllm")[1]
    kv_both = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    assert command_line_problems("vllm", vllm_new, ["m", "--kv-transfer-config", kv_both])
    assert command_line_problems("vllm", vllm_new, ["m", "--no-such-flag"])
    assert not command_line_problems("vllm", vllm_new, ["m", "--tensor-parallel-size", "2"])


def test_every_engine_with_releases_is_in_the_matrix() -> None:
    with_releases = {t for t, a in ENGINES.items() if a.versions is not None}
    assert with_releases == {e for e, _ in RELEASES}
