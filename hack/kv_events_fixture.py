"""Dump the KV event wire format of a vLLM release (its msgspec Structs in
vllm/distributed/kv_events.py) into tests/fixtures/engines/vllm-<version>.kv-events.json, for
the unit test that holds the reference engine's events to it.

Read with ``ast`` from the release's wheel: nothing of vLLM is imported (its module needs
torch). Not part of `make test`; rerun when a supported release changes:

    .venv/bin/python hack/kv_events_fixture.py 0.33.0
    .venv/bin/python hack/kv_events_fixture.py 0.11.0 --source DIR/vllm/distributed/kv_events.py
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

MODULE = "vllm/distributed/kv_events.py"
EVENT_CLASSES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
BATCH_CLASSES = ("EventBatch", "KVEventBatch")
STRUCT_OPTIONS = ("array_like", "omit_defaults", "tag")
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engines"


def wheel_source(version: str) -> str:
    """The module's text from the release's wheel (pip download, no dependencies)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
             f"vllm=={version}"],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(MODULE).decode()


def struct_shapes(source: str) -> dict[str, Any]:
    """Each class: its options (own and inherited) and its fields, in order, with whether
    each has a default."""
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    return {name: _shape(classes, name) for name in (*EVENT_CLASSES, *BATCH_CLASSES)}


def _shape(classes: dict[str, ast.ClassDef], name: str) -> dict[str, Any]:
    node = classes[name]
    options: dict[str, Any] = {}
    fields: list[dict[str, Any]] = []
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            inherited = _shape(classes, base.id)
            options |= inherited["options"]
            fields += inherited["fields"]
    for keyword in node.keywords:
        if keyword.arg in STRUCT_OPTIONS:
            options[keyword.arg] = ast.literal_eval(keyword.value)
    own = [
        {"name": stmt.target.id, "required": stmt.value is None}
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ]
    names = {f["name"] for f in own}
    return {"options": options, "fields": [f for f in fields if f["name"] not in names] + own}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version")
    parser.add_argument("--source", type=Path, help=f"the release's {MODULE} (else: its wheel)")
    args = parser.parse_args()
    source = args.source.read_text() if args.source else wheel_source(args.version)
    out = FIXTURES / f"vllm-{args.version}.kv-events.json"
    out.write_text(json.dumps({"vllm": args.version, **struct_shapes(source)}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
