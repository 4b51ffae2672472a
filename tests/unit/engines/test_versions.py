"""The engine release a deployment runs: spec.engine.version over the image tag, the newest
supported wiring for an unknown or unsupported one, and the condition that tells the user."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.factories import make_pdd
from pdd_operator.engines.registry import adapter_for
from pdd_operator.engines.version import (
    SupportedVersions,
    Version,
    image_tag,
    parse_version,
    resolve_version,
)
from pdd_operator.status.conditions import event_for
from pdd_operator.status.spec_conditions.engine_version import CONDITION
from pdd_operator.status.spec_conditions.engine_version import condition as engine_version_condition

SUPPORTED = SupportedVersions(Version(0, 11, 0), Version(0, 33, 0))
NOW = "2026-12-04T00:00:00Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.33.0", Version(0, 33, 0)),
        ("v0.11.0", Version(0, 11, 0)),
        ("v0.5.4-cu129", Version(0, 5, 4)),
        ("0.5.23.post1", Version(0, 5, 23)),
        ("0.34", Version(0, 34, 0)),
        ("0.12.0rc1", Version(0, 12, 0)),
        ("latest", None),
        ("nightly-2026-12-01", None),
        ("", None),
    ],
)
def test_a_release_is_read_from_a_version_or_tag(text: str, expected: Version | None) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("vllm/vllm-openai:v0.33.0", "v0.33.0"),
        ("registry.example.com:5000/team/sglang:v0.5.23-cu129", "v0.5.23-cu129"),
        ("registry.example.com:5000/team/sglang", ""),
        ("vllm/vllm-openai@sha256:" + "a" * 64, ""),
        ("vllm/vllm-openai:v0.11.0@sha256:" + "a" * 64, "v0.11.0"),
    ],
)
def test_the_tag_is_what_follows_the_last_colon_of_the_name(image: str, tag: str) -> None:
    assert image_tag(image) == tag


def test_the_declared_version_wins_over_the_image_tag() -> None:
    resolved = resolve_version("0.11.0", "vllm/vllm-openai:v0.33.0", SUPPORTED)
    assert (resolved.wiring, resolved.source, resolved.supported) == (
        Version(0, 11, 0),
        "spec.engine.version",
        True,
    )


def test_patch_releases_of_the_newest_minor_are_supported() -> None:
    resolved = resolve_version(None, "vllm/vllm-openai:v0.33.2", SUPPORTED)
    assert resolved.supported and resolved.wiring == Version(0, 33, 2)


@pytest.mark.parametrize(
    ("declared", "image", "found"),
    [
        (None, "vllm/vllm-openai:latest", None),
        (None, "vllm/vllm-openai@sha256:" + "b" * 64, None),
        (None, "vllm/vllm-openai:v0.10.2", Version(0, 10, 2)),
        ("0.40.0", "vllm/vllm-openai:v0.33.0", Version(0, 40, 0)),
    ],
)
def test_an_unknown_or_unsupported_release_gets_the_newest_wiring(
    declared: str | None, image: str, found: Version | None
) -> None:
    resolved = resolve_version(declared, image, SUPPORTED)
    assert resolved.wiring == SUPPORTED.newest
    assert resolved.declared == found
    assert not resolved.supported


def _condition(engine: dict[str, Any]) -> Any:
    pdd = make_pdd({"engine": engine})
    (cond,) = engine_version_condition([], pdd.spec, 1, NOW)
    assert cond.type == CONDITION
    return cond


def test_a_supported_release_is_true_and_tells_no_event() -> None:
    cond = _condition({"type": "sglang", "image": "lmsysorg/sglang:v0.5.23-cu129"})
    assert (cond.status, cond.reason) == ("True", "Supported")
    assert "SGLang 0.5.23 (from the image tag)" in cond.message
    assert event_for(cond) is None


def test_latest_is_a_warning_that_names_the_field_to_set() -> None:
    cond = _condition({"type": "sglang", "image": "lmsysorg/sglang:latest"})
    assert (cond.status, cond.reason) == ("False", "VersionUnknown")
    assert "'lmsysorg/sglang:latest' names no SGLang release" in cond.message
    assert "rendered for SGLang 0.5.23" in cond.message
    assert "set spec.engine.version" in cond.message
    event = event_for(cond)
    assert event is not None and event.type == "Warning"


def test_an_old_release_is_named_with_the_range() -> None:
    cond = _condition({"type": "vllm", "image": "vllm/vllm-openai:v0.9.2"})
    assert (cond.status, cond.reason) == ("False", "VersionNotSupported")
    assert "vLLM 0.9.2 (from the image tag) is outside the supported 0.11.0 to 0.33.0" in (
        cond.message
    )


def test_a_custom_engine_has_no_version_condition() -> None:
    pdd = make_pdd({"engine": {"type": "custom", "image": "x/y:1", "command": ["e"]}})
    assert engine_version_condition([], pdd.spec, 1, NOW) == []
    assert adapter_for("custom").version(pdd.spec) is None
