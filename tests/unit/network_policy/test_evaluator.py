"""The test-only NetworkPolicy evaluator (helpers/netpol.py) on small hand-written policies:
each case says what the Kubernetes API reference says an enforcing CNI does."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.netpol import External, Pod, ingress_allowed, selector_matches

NS = "team-a"
WEB = Pod(
    "web-0",
    {"app": "web", "tier": "front"},
    NS,
    ip="10.0.0.10",
    named_ports={"http": (8080, "TCP"), "dns": (53, "UDP")},
)
API = Pod("api-0", {"app": "api"}, NS, ip="10.0.0.11")
DB = Pod("db-0", {"app": "db"}, NS, ip="10.0.0.12")
BARE = Pod("bare", {}, NS, ip="10.0.0.13")
API_ELSEWHERE = Pod("api-0", {"app": "api"}, "team-b", ip="10.1.0.11")
MONITOR = Pod("prom-0", {"app": "prometheus"}, "monitoring", ip="10.2.0.5")
CLIENT = External("203.0.113.7")
NAMESPACES = {"monitoring": {"purpose": "observability"}, "team-b": {"purpose": "apps"}}


def policy(spec: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec}


WEB_ONLY = {"matchLabels": {"app": "web"}}


def allowed(policies: list[dict[str, Any]], source: Any, port: int, **kw: Any) -> bool:
    return ingress_allowed(policies, source, WEB, port, namespaces=NAMESPACES, **kw)


def test_no_policy_admits_everything() -> None:
    assert allowed([], CLIENT, 8080)
    assert allowed([], API, 1)


def test_a_policy_selecting_other_pods_leaves_this_one_open() -> None:
    deny_db = policy({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]})
    assert allowed([deny_db], API, 8080)
    assert not ingress_allowed([deny_db], API, DB, 5432)


def test_a_policy_in_another_namespace_does_not_select_this_pod() -> None:
    deny_all = policy({"podSelector": {}, "policyTypes": ["Ingress"]}, namespace="team-b")
    assert allowed([deny_all], API, 8080)
    assert not ingress_allowed([deny_all], API, API_ELSEWHERE, 8080)


@pytest.mark.parametrize(
    "spec",
    [
        {"podSelector": {}, "policyTypes": ["Ingress"]},
        {"podSelector": WEB_ONLY, "policyTypes": ["Ingress"], "ingress": []},
        {"podSelector": WEB_ONLY},  # policyTypes left out: Ingress
        {"podSelector": WEB_ONLY, "policyTypes": ["Ingress", "Egress"]},
    ],
)
def test_an_isolating_policy_without_rules_denies_everything(spec: dict[str, Any]) -> None:
    for source in (API, BARE, CLIENT, MONITOR):
        assert not allowed([policy(spec)], source, 8080)


def test_an_egress_only_policy_does_not_isolate_ingress() -> None:
    egress_only = policy({"podSelector": WEB_ONLY, "policyTypes": ["Egress"]})
    assert allowed([egress_only], CLIENT, 8080)


def test_empty_from_admits_every_source_and_missing_ports_every_port() -> None:
    anyone_on_8080 = policy({"podSelector": WEB_ONLY, "ingress": [{"ports": [{"port": 8080}]}]})
    for source in (API, BARE, CLIENT, MONITOR, API_ELSEWHERE):
        assert allowed([anyone_on_8080], source, 8080)
        assert not allowed([anyone_on_8080], source, 8081)
    api_anything = policy(
        {
            "podSelector": WEB_ONLY,
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}]}],
        }
    )
    for port in (1, 8080, 45000, 65535):
        assert allowed([api_anything], API, port)
        assert allowed([api_anything], API, port, protocol="UDP")
        assert not allowed([api_anything], DB, port)
    open_rule = policy({"podSelector": WEB_ONLY, "ingress": [{}]})
    assert allowed([open_rule], CLIENT, 12345)


def test_a_pod_selector_peer_matches_pods_of_the_policys_namespace_only() -> None:
    from_api = policy(
        {
            "podSelector": WEB_ONLY,
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}]}],
        }
    )
    assert allowed([from_api], API, 8080)
    assert not allowed([from_api], API_ELSEWHERE, 8080)
    assert not allowed([from_api], CLIENT, 8080)  # a selector names pods, not outsiders
    assert not allowed([from_api], BARE, 8080)


@pytest.mark.parametrize(
    ("expression", "matching", "not_matching"),
    [
        ({"key": "app", "operator": "In", "values": ["api", "db"]}, [API, DB], [BARE, WEB]),
        ({"key": "app", "operator": "NotIn", "values": ["api"]}, [DB, BARE], [API]),
        ({"key": "app", "operator": "Exists"}, [API, DB], [BARE]),
        ({"key": "app", "operator": "DoesNotExist"}, [BARE], [API, DB]),
    ],
)
def test_match_expressions(
    expression: dict[str, Any], matching: list[Pod], not_matching: list[Pod]
) -> None:
    spec = {
        "podSelector": WEB_ONLY,
        "ingress": [{"from": [{"podSelector": {"matchExpressions": [expression]}}]}],
    }
    for pod in matching:
        assert allowed([policy(spec)], pod, 8080), pod.name
    for pod in not_matching:
        assert not allowed([policy(spec)], pod, 8080), pod.name


def test_match_labels_and_expressions_must_all_hold() -> None:
    selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}],
    }
    assert selector_matches(selector, {"app": "web", "tier": "front"})
    assert not selector_matches(selector, {"app": "web", "tier": "back"})
    assert not selector_matches(selector, {"tier": "front"})
    assert selector_matches({}, {})  # the empty selector selects everything


def test_namespace_selector_alone_admits_every_pod_of_those_namespaces() -> None:
    spec = {
        "podSelector": WEB_ONLY,
        "ingress": [
            {"from": [{"namespaceSelector": {"matchLabels": {"purpose": "observability"}}}]}
        ],
    }
    assert allowed([policy(spec)], MONITOR, 8080)
    assert not allowed([policy(spec)], API, 8080)  # its own namespace is not selected
    assert not allowed([policy(spec)], API_ELSEWHERE, 8080)


def test_namespace_and_pod_selector_in_one_peer_must_both_hold_in_two_peers_either() -> None:
    both = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-b"}},
        "podSelector": {"matchLabels": {"app": "api"}},
    }
    one_peer = policy({"podSelector": WEB_ONLY, "ingress": [{"from": [both]}]})
    assert allowed([one_peer], API_ELSEWHERE, 8080)
    assert not allowed([one_peer], API, 8080)  # right pod, wrong namespace
    two_peers = policy(
        {
            "podSelector": WEB_ONLY,
            "ingress": [
                {
                    "from": [
                        {"namespaceSelector": both["namespaceSelector"]},
                        {"podSelector": both["podSelector"]},
                    ]
                }
            ],
        }
    )
    assert allowed([two_peers], API, 8080)
    assert allowed([two_peers], Pod("x", {}, "team-b"), 8080)


def test_ip_block_with_except() -> None:
    spec = {
        "podSelector": WEB_ONLY,
        "ingress": [
            {"from": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.0/30"]}}]}
        ],
    }
    assert allowed([policy(spec)], CLIENT, 8080)
    assert not allowed([policy(spec)], External("203.0.113.3"), 8080)
    assert not allowed([policy(spec)], External("198.51.100.1"), 8080)
    assert not allowed([policy(spec)], Pod("no-ip", {}, NS), 8080)


@pytest.mark.parametrize(
    ("ports", "admitted", "denied"),
    [
        ([{"port": 8080}], [(8080, "TCP")], [(8081, "TCP"), (8080, "UDP")]),
        ([{"port": 53, "protocol": "UDP"}], [(53, "UDP")], [(53, "TCP")]),
        ([{"port": 32000, "endPort": 32010}], [(32000, "TCP"), (32010, "TCP")], [(32011, "TCP")]),
        ([{"protocol": "TCP"}], [(1, "TCP"), (65535, "TCP")], [(53, "UDP"), (9, "SCTP")]),
        # A named port: the destination's container port of that name and protocol.
        ([{"port": "http"}], [(8080, "TCP")], [(80, "TCP"), (8080, "UDP")]),
        ([{"port": "dns", "protocol": "UDP"}], [(53, "UDP")], [(53, "TCP")]),
        ([{"port": "dns"}], [], [(53, "TCP"), (53, "UDP")]),  # TCP named port: none
        ([{"port": "grpc"}], [], [(8080, "TCP"), (9090, "TCP")]),  # the pod has no such name
        ([{"port": 80}, {"port": 443}], [(80, "TCP"), (443, "TCP")], [(8080, "TCP")]),
    ],
)
def test_ports(
    ports: list[dict[str, Any]], admitted: list[tuple[int, str]], denied: list[tuple[int, str]]
) -> None:
    spec = {"podSelector": WEB_ONLY, "ingress": [{"ports": ports}]}
    for port, protocol in admitted:
        assert allowed([policy(spec)], API, port, protocol=protocol), (port, protocol)
    for port, protocol in denied:
        assert not allowed([policy(spec)], API, port, protocol=protocol), (port, protocol)


def test_source_and_port_of_one_rule_must_both_hold() -> None:
    spec = {
        "podSelector": WEB_ONLY,
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"app": "api"}}}], "ports": [{"port": 8080}]}
        ],
    }
    assert allowed([policy(spec)], API, 8080)
    assert not allowed([policy(spec)], API, 9090)
    assert not allowed([policy(spec)], DB, 8080)


def test_rules_and_policies_add_up() -> None:
    api_on_8080 = policy(
        {
            "podSelector": WEB_ONLY,
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "api"}}}],
                    "ports": [{"port": 8080}],
                }
            ],
        }
    )
    db_on_9090 = policy(
        {
            "podSelector": {},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                    "ports": [{"port": 9090}],
                }
            ],
        }
    )
    both = [api_on_8080, db_on_9090]
    assert allowed(both, API, 8080) and allowed(both, DB, 9090)
    assert not allowed(both, API, 9090) and not allowed(both, DB, 8080)
    # A deny-all beside them takes nothing away.
    deny_all = policy({"podSelector": {}, "policyTypes": ["Ingress"]})
    assert allowed([*both, deny_all], API, 8080)


@pytest.mark.parametrize(
    "bad",
    [
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Like", "values": ["x"]}]}},
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        {
            "podSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
            }
        },
        {"podSelector": {"matchLabel": {"a": "b"}}},
        {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}},
        {},
    ],
)
def test_malformed_peers_are_refused_not_guessed(bad: dict[str, Any]) -> None:
    spec = {"podSelector": WEB_ONLY, "ingress": [{"from": [bad]}]}
    with pytest.raises(ValueError):
        allowed([policy(spec)], API, 8080)


@pytest.mark.parametrize(
    "ports",
    [
        [{"port": 8080, "protocol": "ICMP"}],
        [{"port": "http", "endPort": 9000}],
        [{"endPort": 9000}],
        [{"port": 9000, "endPort": 8000}],
        [{"number": 8080}],
    ],
)
def test_malformed_ports_are_refused_not_guessed(ports: list[dict[str, Any]]) -> None:
    spec = {"podSelector": WEB_ONLY, "ingress": [{"ports": ports}]}
    with pytest.raises(ValueError):
        allowed([policy(spec)], API, 8080)
