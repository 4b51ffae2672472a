"""The reference engine's KV events hold to each vLLM release's own wire format: the msgspec
Structs of that release's vllm/distributed/kv_events.py, dumped by hack/kv_events_fixture.py
into tests/fixtures/engines/vllm-<version>.kv-events.json. Its options (tagged maps or arrays,
defaults left out) must be the release's, its required fields the release's in the release's
order, and its optional fields among the release's, in order: a router decodes what vLLM
sends, and vllm-router 0.1.17 refuses a batch with a field it does not know."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pdd_refengine import kv_events

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
DOUBLES: dict[str, dict[str, type[msgspec.Struct]]] = {
    "0.33.0": {
        "BlockStored": kv_events.BlockStored,
        "BlockRemoved": kv_events.BlockRemoved,
        "AllBlocksCleared": kv_events.AllBlocksCleared,
        "KVEventBatch": kv_events.KvEventBatch,
    },
    "0.11.0": {
        "BlockStored": kv_events.BlockStored011,
        "BlockRemoved": kv_events.BlockRemoved011,
        "AllBlocksCleared": kv_events.AllBlocksCleared011,
        "KVEventBatch": kv_events.KvEventBatch011,
    },
}
CASES = [(v, name) for v, classes in DOUBLES.items() for name in classes]


def upstream(version: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"vllm-{version}.kv-events.json").read_text()))


def options(struct: type[msgspec.Struct]) -> dict[str, Any]:
    config = struct.__struct_config__
    tag = config.tag is not None  # True, or the class name spelled out: both tag by name
    return {"array_like": config.array_like, "omit_defaults": config.omit_defaults, "tag": tag}


@pytest.mark.parametrize(("version", "name"), CASES, ids=[f"{v}-{n}" for v, n in CASES])
def test_each_struct_has_the_releases_options_and_fields(version: str, name: str) -> None:
    wanted = upstream(version)[name]
    double = DOUBLES[version][name]
    assert options(double) == {k: wanted["options"].get(k, False) for k in options(double)}
    fields = msgspec.structs.fields(double)
    required = [f.name for f in fields if f.required]
    assert required == [f["name"] for f in wanted["fields"] if f["required"]]
    optional = [f.name for f in fields if not f.required]
    upstream_optional = [f["name"] for f in wanted["fields"] if not f["required"]]
    assert optional == [n for n in upstream_optional if n in optional], (
        optional,
        upstream_optional,
    )


@pytest.mark.parametrize("version", sorted(DOUBLES))
def test_a_tagged_event_is_named_by_its_class(version: str) -> None:
    """A tag of True is the class name; the 0.11 doubles spell it out, being named apart."""
    for name, double in DOUBLES[version].items():
        if double.__struct_config__.tag is not None:
            assert double.__struct_config__.tag == name, name
