from __future__ import annotations

import re

import pytest

from pdd_operator.api import names

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    "name",
    ["llama", "a" * 63, "x" * 253, "model.v2.prod", "9lives", "llama-70b-instruct-" + "q" * 200],
)
def test_child_names_fit_every_limit(name: str) -> None:
    instance = names.instance_id(name)
    assert len(instance) <= names.MAX_INSTANCE_ID
    for role in ("prefill", "decode", "router"):
        child = names.role_name(name, role)
        assert DNS1035.match(child), child
        # StatefulSet pods carry controller-revision-hash=<name>-<10 chars>: a 63-char label.
        assert len(child) + 11 <= 63
    for value in names.common_labels(name, "prefill").values():
        assert len(value) <= 63


def test_short_names_are_kept_readable() -> None:
    assert names.instance_id("llama") == "llama"
    assert names.role_name("llama", "prefill") == "llama-prefill"


def test_long_names_with_the_same_prefix_do_not_collide() -> None:
    a = names.instance_id("p" * 60 + "a")
    b = names.instance_id("p" * 60 + "b")
    assert a != b
    assert a.startswith("p" * 10)
