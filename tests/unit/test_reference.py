"""docs/api.md is generated from the models: every field, default and rule is in it, it is a
valid Markdown table structure, and it is pure and deterministic."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdd_operator.api.crd import generate_crd
from pdd_operator.api.reference import api_reference_markdown, type_name, validation_rules
from pdd_operator.engines.registry import spec_rules

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def page() -> str:
    return api_reference_markdown(spec_rules())


def crd_schema() -> dict[str, Any]:
    return generate_crd(spec_rules())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(path: str, node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field below an object, independently of the generator's own walk."""
    for name, prop in node.get("properties", {}).items():
        yield f"{path}.{name}", prop
        if prop.get("type") == "array" and "properties" in prop.get("items", {}):
            yield from walk(f"{path}.{name}[]", prop["items"])
        else:
            yield from walk(f"{path}.{name}", prop)


def section(page: str, path: str) -> str:
    """The text of one `### \\`path\\`` section."""
    start = page.index(f"### `{path}`\n")
    end = page.find("\n### ", start + 1)
    return page[start : end if end != -1 else len(page)]


def row(page: str, field_path: str) -> str:
    parent, name = field_path.rsplit(".", 1)
    for line in section(page, parent).splitlines():
        if line.startswith(f"| `{name}`"):
            return line
    raise AssertionError(f"no row for {field_path} in section {parent}")


SPEC_FIELDS = list(walk("spec", crd_schema()["properties"]["spec"]))
STATUS_FIELDS = list(walk("status", crd_schema()["properties"]["status"]))


@pytest.mark.parametrize(
    ("path", "prop"), SPEC_FIELDS + STATUS_FIELDS, ids=[p for p, _ in SPEC_FIELDS + STATUS_FIELDS]
)
def test_every_field_has_a_row_with_its_type(page: str, path: str, prop: dict[str, Any]) -> None:
    line = row(page, path)
    assert type_name(prop).replace("|", "\\|") in line


@pytest.mark.parametrize(("path", "prop"), SPEC_FIELDS, ids=[p for p, _ in SPEC_FIELDS])
def test_every_spec_default_is_shown(page: str, path: str, prop: dict[str, Any]) -> None:
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", row(page, path))[1:-1]]
    expected = f"`{json.dumps(prop['default'], sort_keys=True)}`" if "default" in prop else "—"
    assert cells[2] == expected


def test_every_cel_rule_and_message_is_listed(page: str) -> None:
    rules = [rule for _, prop in SPEC_FIELDS for rule in prop.get("x-kubernetes-validations", [])]
    rules += [
        rule
        for _, prop in SPEC_FIELDS
        for nested in (prop.get("items", {}), prop.get("additionalProperties") or {})
        if isinstance(nested, dict)
        for rule in nested.get("x-kubernetes-validations", [])
    ]
    rules += [{"rule": rule, "message": message} for rule, message in spec_rules()]
    assert len(rules) > 20
    for rule in rules:
        assert rule["message"] in page
        assert f"`{rule['rule']}`" in page


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "string", "enum": ["a", "b"]}, 'string (one of: "a", "b")'),
        ({"type": "array", "items": {"type": "string"}}, "[]string"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "map[string]string"),
        ({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, "object (free-form)"),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, "object"),
        ({"type": "integer"}, "integer"),
    ],
)
def test_type_name(node: dict[str, Any], expected: str) -> None:
    assert type_name(node) == expected


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "string", "maxLength": 5, "pattern": "^a$"}, ["max length 5", "matches `^a$`"]),
        (
            {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 9}},
            ["max items 2", "each item: max length 9"],
        ),
        (
            {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
            ["each value: min length 1"],
        ),
        (
            {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0", "message": "m"}]},
            ['CEL `self > 0`: "m"'],
        ),
        ({"type": "boolean"}, []),
    ],
)
def test_validation_rules(node: dict[str, Any], expected: list[str]) -> None:
    assert list(validation_rules(node)) == expected


def test_tables_keep_their_column_count(page: str) -> None:
    # An unescaped pipe in a cell (CEL's `||`, a regex) would shift every column after it.
    table: list[str] = []
    for line in [*page.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            counts = {len(re.findall(r"(?<!\\)\|", t)) for t in table}
            assert len(counts) == 1, table
            table = []


def test_links_point_at_anchors(page: str) -> None:
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', page))
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert links and links <= anchors


def test_deterministic_and_pure() -> None:
    code = (
        "import sys; from pdd_operator.api.reference import api_reference_markdown as r; "
        "from pdd_operator.engines.registry import spec_rules as s; "
        "assert r(s()) == r(s()); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf', 'aiohttp')]; "
        "assert not bad, bad"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(ROOT / "operator")}
    )


def test_docs_api_md_is_current(page: str) -> None:
    assert (ROOT / "docs" / "api.md").read_text() == page, "run `make generate`"
