"""``--peer-address-map`` (pure): exact entries and CIDR ranges that keep the host bits, so a
local cluster's later pods (new simulated IPs) are dialled on loopback without a restart."""

from __future__ import annotations

import pytest

from pdd_sidecar.cli import _parser, build_source
from pdd_sidecar.peers import AddressMap, PodPeerSource


def test_exact_entries_and_unmapped_addresses() -> None:
    mapping = AddressMap.parse("198.18.0.7=127.0.0.9, 198.18.0.8=127.0.0.10")
    assert mapping.translate("198.18.0.7") == "127.0.0.9"
    assert mapping.translate("198.18.0.8") == "127.0.0.10"
    assert mapping.translate("10.0.0.1") == "10.0.0.1"
    assert mapping.translate("not-an-ip") == "not-an-ip"
    assert not AddressMap.parse("") and not AddressMap()


def test_a_range_keeps_the_host_bits() -> None:
    mapping = AddressMap.parse("198.18.0.0/15=127.18.0.0/15")
    assert mapping.translate("198.18.0.1") == "127.18.0.1"
    assert mapping.translate("198.18.3.200") == "127.18.3.200"
    assert mapping.translate("198.19.255.254") == "127.19.255.254"
    assert mapping.translate("198.20.0.1") == "198.20.0.1"  # outside the range
    assert mapping.translate("2001:db8::1") == "2001:db8::1"  # another IP version


def test_exact_beats_range_and_the_longest_prefix_wins() -> None:
    mapping = AddressMap.parse(
        "198.18.0.0/15=127.18.0.0/15,198.18.5.0/24=127.55.5.0/24,198.18.5.9=127.0.0.2"
    )
    assert mapping.translate("198.18.5.9") == "127.0.0.2"
    assert mapping.translate("198.18.5.10") == "127.55.5.10"
    assert mapping.translate("198.18.6.10") == "127.18.6.10"


def test_ipv6_ranges() -> None:
    mapping = AddressMap.parse("fd00:10::/64=fd00:99::/64")
    assert mapping.translate("fd00:10::abcd") == "fd00:99::abcd"


@pytest.mark.parametrize(
    "spec",
    [
        "198.18.0.1",  # no target
        "=127.0.0.1",
        "198.18.0.0/15=127.0.0.0/8",  # prefix lengths differ: host bits cannot be kept
        "198.18.0.0/15=::/15",  # IP versions differ
        "198.18.0.0/33=127.0.0.0/33",
        "198.18.0.1/15=127.18.0.0/15",  # host bits set in the network
    ],
)
def test_malformed_maps_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="peer address map entry"):
        AddressMap.parse(spec)


def test_the_cli_builds_the_k8s_source_with_the_map() -> None:
    args = _parser().parse_args(
        ["serve", "--role", "prefill", "--deployment", "kv", "--namespace", "ns",
         "--peer-address-map", "198.18.0.0/15=127.18.0.0/15,198.18.0.3=127.0.0.3"]
    )  # fmt: skip
    source = build_source(args)
    assert isinstance(source, PodPeerSource)
    translate = source._address_map.translate
    assert (translate("198.18.0.3"), translate("198.18.0.9")) == ("127.0.0.3", "127.18.0.9")
    with pytest.raises(SystemExit, match="--peer-address-map"):
        build_source(_parser().parse_args(["serve", "--peer-address-map", "1.2.3.0/24=::/24"]))
