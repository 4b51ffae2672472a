from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# Pairs of names that the first scheme (keep a short safe name, else hash) mapped to the same
# instance id, and so to the same children: the second is the first's hashed id spelled out.
def _hashed_twin(name: str) -> str:
    return names.instance_id(name)


@pytest.mark.parametrize(
    "name",
    ["a.b", "llama.v2", "9lives", "Model", "p" * 60, "x" * 41, "svc.prod.eu-west-1"],
)
def test_a_name_spelled_like_another_names_hashed_id_gets_its_own_id(name: str) -> None:
    twin = _hashed_twin(name)
    assert twin != name  # hashed: the name itself is not a label-safe short id
    assert names.instance_id(twin) != twin
    assert names.instance_id(twin) != names.instance_id(name)
    for role in ("prefill", "decode", "router"):
        assert names.role_name(twin, role) != names.role_name(name, role)


@pytest.mark.parametrize("name", ["kv-deadbeef", "a-00000000", "llama-1234abcd"])
def test_names_ending_like_a_hash_are_hashed_and_still_fit(name: str) -> None:
    instance = names.instance_id(name)
    assert instance != name and len(instance) <= names.MAX_INSTANCE_ID
    assert DNS1035.match(instance)


@pytest.mark.parametrize("name", ["kv-dead", "a-0000000g", "llama-1234abcde", "x-abcdef1"])
def test_names_that_only_resemble_a_hash_are_kept(name: str) -> None:
    assert names.instance_id(name) == name


def test_every_child_suffix_is_distinct_from_the_end_of_another() -> None:
    """Distinct ids give distinct children only if no suffix ends another one: `x` with
    `-sidecar-token` must not be `x-sidecar` with `-token`."""
    base = "n"
    made = [
        names.role_name(base, "prefill"),
        names.role_name(base, "decode"),
        names.router_account_name(base),
        names.sidecar_account_name(base),
        names.token_secret_name(base, "0123456789"),
        names.network_policy_name(base),
        names.claim_template_name(base, "prefill"),
        names.claim_template_name(base, "decode"),
    ]
    suffixes = {child[len(base) :] for child in made}
    for a in suffixes:
        for b in suffixes:
            assert a == b or not a.endswith(b), (a, b)


def test_ids_of_many_names_are_unique() -> None:
    candidates = [f"m{i}" for i in range(300)] + [f"m{i}.x" for i in range(300)]
    candidates += [names.instance_id(n) for n in candidates]
    ids = {names.instance_id(n) for n in set(candidates)}
    assert len(ids) == len(set(candidates))


# A PDDeployment's name: a DNS-1123 subdomain (what the API server admits for a custom
# resource), kept to 80 characters so that both the short and the hashed schemes are reached.
PDD_NAME = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,78}[a-z0-9])?", fullmatch=True).filter(
    lambda n: ".." not in n and ".-" not in n and "-." not in n
)


def _look_alikes(name: str) -> list[str]:
    """Names a user could pick next to `name` that an id scheme could confuse with it: its
    own hashed id spelled out (#41's `ab.cd` and `ab-cd-61074630`), dots as dashes, and the
    name with a hash-like tail added."""
    return [names.instance_id(name), name.replace(".", "-"), f"{name}-0123abcd"[:253]]


@settings(max_examples=300, deadline=None)
@given(PDD_NAME)
def test_no_two_names_of_one_namespace_share_a_child(name: str) -> None:
    """Property: distinct names never map to the same child, look-alikes included."""
    for other in _look_alikes(name):
        if other == name:
            continue
        assert names.instance_id(other) != names.instance_id(name), (name, other)
        for role in ("prefill", "decode", "router"):
            assert names.role_name(other, role) != names.role_name(name, role), (name, other)
