"""The generated CRD is structural and carries the defaults and rules users rely on."""

from __future__ import annotations

from typing import Any

from pdd_operator.api.crd import generate_crd
from pdd_operator.engines.registry import spec_rules


def spec_schema() -> dict[str, Any]:
    crd = generate_crd(spec_rules())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.get("properties", {}).items():
            out += walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            out += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


def test_schema_is_structural() -> None:
    for path, node in walk(spec_schema(), "spec"):
        assert "$ref" not in node and "anyOf" not in node and "const" not in node, path
        assert "type" in node, f"{path} has no type"


def test_defaults_live_in_the_schema() -> None:
    spec = spec_schema()["properties"]
    assert spec["engine"]["properties"]["type"]["default"] == "vllm"
    assert spec["prefill"]["default"] == {}
    assert spec["prefill"]["properties"]["replicas"]["default"] == 1
    kv = spec["kvTransfer"]["properties"]
    assert kv["ucx"]["properties"]["transports"]["default"] == ["auto"]
    assert kv["sharedMemorySize"]["default"] == "16Gi"
    assert kv["sideChannelPort"]["default"] == 5600


def test_every_list_and_string_with_a_rule_is_bounded_for_cel_cost() -> None:
    for path, node in walk(spec_schema(), "spec"):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_printer_columns_and_status_subresource() -> None:
    version = generate_crd(spec_rules())["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:2] == ["Model", "Prefill"] and "Ready" in columns and columns[-1] == "Age"
    assert generate_crd(spec_rules())["spec"]["names"]["shortNames"] == ["pdd"]
