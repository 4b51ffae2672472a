"""docs/install.md and docs/gitops.md stay true to the chart: every value is documented, and
every YAML example parses."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from .support import CHART, ROOT

DOCS = [ROOT / "docs" / "install.md", ROOT / "docs" / "gitops.md"]


def documented_values() -> set[str]:
    table = (ROOT / "docs" / "install.md").read_text()
    return set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", table, flags=re.MULTILINE))


def undocumented(values: dict[str, Any], documented: set[str], prefix: str = "") -> list[str]:
    """Value paths with no row: a documented path covers everything below it."""
    missing = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if path in documented:
            continue
        if isinstance(value, dict) and value:
            missing += undocumented(value, documented, f"{path}.")
        else:
            missing.append(path)
    return missing


def test_every_value_is_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert undocumented(values, documented_values()) == []


def test_documented_values_exist() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in documented_values():
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"{path} is not a chart value"
            node = node[part]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_yaml_examples_parse(doc: Any) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.DOTALL)
    assert blocks
    for block in blocks:
        for obj in yaml.safe_load_all(block):
            assert isinstance(obj, dict) and ("kind" in obj or "apiVersion" in obj), block


def test_gitops_paths_exist() -> None:
    text = (ROOT / "docs" / "gitops.md").read_text()
    for path in re.findall(r"path: \.?/?((?:charts|manifests)[\w/-]*)", text):
        assert (ROOT / path).exists(), path
    assert "resource.customizations.health.pdd.dev_PDDeployment" in text
