"""The YAML the operator prints (render, generated manifests) reads the same in every
Kubernetes tool: YAML 1.1 readers (kubectl, kubeconform) take a bare `y` or `n` for a boolean,
PyYAML does not, so strings that look like YAML 1.1 booleans must come out quoted."""

from __future__ import annotations

import re

import pytest
import yaml

from pdd_operator import manifest_yaml

# Every YAML 1.1 boolean spelling (https://yaml.org/type/bool.html).
YAML11_BOOLEANS = [
    spelling
    for word in ("y", "n", "yes", "no", "true", "false", "on", "off")
    for spelling in {word, word.capitalize(), word.upper()}
]


@pytest.mark.parametrize("value", sorted(YAML11_BOOLEANS))
def test_a_string_a_yaml_11_reader_takes_for_a_boolean_is_quoted(value: str) -> None:
    text = manifest_yaml.dump({"env": [{"name": "X", "value": value}]})
    assert re.search(rf"value: (['\"]){re.escape(value)}\1$", text, re.M), text
    assert yaml.safe_load(text)["env"][0]["value"] == value


@pytest.mark.parametrize("value", ["yy", "nixl", "y1", "Y-es", "0", "1.5", "~"])
def test_other_strings_keep_their_value(value: str) -> None:
    assert yaml.safe_load(manifest_yaml.dump({"v": value}))["v"] == value


def test_real_booleans_stay_booleans() -> None:
    assert manifest_yaml.dump({"a": True, "b": False}) == "a: true\nb: false\n"
