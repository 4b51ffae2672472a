"""A small NetworkPolicy evaluator for tests: would an enforcing CNI admit this connection?

No CNI runs in the test clusters, so nothing enforces a rendered NetworkPolicy; this decides
what one that did would admit, by the ingress rules of networking.k8s.io/v1:

- A policy applies to the pods of its own namespace that ``spec.podSelector`` selects (an
  empty selector: all of them).
- A pod is isolated for ingress when a policy that applies to it has ``Ingress`` in
  ``policyTypes`` (left out: ``Ingress``, plus ``Egress`` where egress rules are given). A pod
  that no such policy selects admits every connection.
- A connection to an isolated pod is admitted when any ingress rule of any of those policies
  admits it: rules and policies only ever add, none takes away.
- A rule admits a source when its ``from`` is missing or empty (every source, in the cluster
  or outside it), or when one of its peers matches: ``podSelector`` alone, pods of the policy's
  namespace; ``namespaceSelector`` alone, every pod of the matching namespaces; both, the pods
  matching ``podSelector`` in the matching namespaces; ``ipBlock``, a source IP inside
  ``cidr`` and outside each of its ``except`` CIDRs.
- A rule admits a port when its ``ports`` is missing or empty, or when one entry matches: the
  protocol (default TCP) is the connection's, and ``port`` is missing (every port of that
  protocol), a number (or the range ``port``..``endPort``), or a name that the destination
  pod has on a container port of that protocol.

Not modelled: egress (the caller asks about ingress only), and the rule that a pod's own node
may always reach it (the kubelet's probes), which no rendered policy needs to grant.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Policy = Mapping[str, Any]  # a NetworkPolicy object as the API spells it


@dataclass(frozen=True)
class Pod:
    """A pod as policies see it: labels and namespace; its IP for ipBlock peers; its
    container ports by name (``name -> (number, protocol)``) for named ports."""

    name: str
    labels: Mapping[str, str]
    namespace: str = "default"
    ip: str | None = None
    named_ports: Mapping[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class External:
    """A client outside the cluster: no labels, no namespace, only an IP."""

    ip: str


Source = Pod | External


def pod_from_workload(workload: Mapping[str, Any], name: str | None = None) -> Pod:
    """A pod of a rendered StatefulSet or Deployment: its template's labels and every
    container's named ports, in the workload's namespace."""
    template = workload["spec"]["template"]
    named = {
        port["name"]: (int(port["containerPort"]), port.get("protocol", "TCP"))
        for container in template["spec"]["containers"]
        for port in container.get("ports", [])
        if "name" in port
    }
    return Pod(
        name=name or f"{workload['metadata']['name']}-0",
        labels=dict(template["metadata"]["labels"]),
        namespace=workload["metadata"]["namespace"],
        named_ports=named,
    )


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every matchExpression holds."""
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"unknown label selector fields {sorted(unknown)}")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_expression_holds(e, labels) for e in selector.get("matchExpressions") or [])


def _expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"{operator} on {key} needs values")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"{operator} on {key} takes no values")
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unknown selector operator {operator!r}")


def applies_to(policy: Policy, pod: Pod) -> bool:
    """The policy's podSelector selects the pod, in the policy's own namespace."""
    meta, spec = policy["metadata"], policy["spec"]
    return meta.get("namespace", "default") == pod.namespace and selector_matches(
        spec["podSelector"], pod.labels
    )


def isolates_ingress(policy: Policy) -> bool:
    spec = policy["spec"]
    types = spec.get("policyTypes")
    if types is None:
        return True  # the API defaults Ingress always, Egress only where egress rules exist
    unknown = set(types) - {"Ingress", "Egress"}
    if unknown:
        raise ValueError(f"unknown policyTypes {sorted(unknown)}")
    return "Ingress" in types


def ingress_allowed(
    policies: Iterable[Policy],
    source: Source,
    destination: Pod,
    port: int,
    protocol: str = "TCP",
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
) -> bool:
    """Would a connection from ``source`` to ``destination``'s ``port``/``protocol`` be
    admitted? ``namespaces`` gives namespace labels for namespaceSelector peers (each
    namespace also carries ``kubernetes.io/metadata.name``, as the API server sets it)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    isolating = [p for p in policies if isolates_ingress(p) and applies_to(p, destination)]
    if not isolating:
        return True
    return any(
        _rule_admits(rule, policy, source, destination, port, protocol, namespaces or {})
        for policy in isolating
        for rule in policy["spec"].get("ingress") or []
    )


def _rule_admits(
    rule: Mapping[str, Any],
    policy: Policy,
    source: Source,
    destination: Pod,
    port: int,
    protocol: str,
    namespaces: Mapping[str, Mapping[str, str]],
) -> bool:
    unknown = set(rule) - {"from", "ports"}
    if unknown:
        raise ValueError(f"unknown ingress rule fields {sorted(unknown)}")
    peers = rule.get("from") or []
    policy_namespace = policy["metadata"].get("namespace", "default")
    source_ok = not peers or any(
        _peer_matches(peer, policy_namespace, source, namespaces) for peer in peers
    )
    ports = rule.get("ports") or []
    port_ok = not ports or any(_port_matches(entry, destination, port, protocol) for entry in ports)
    return source_ok and port_ok


def _peer_matches(
    peer: Mapping[str, Any],
    policy_namespace: str,
    source: Source,
    namespaces: Mapping[str, Mapping[str, str]],
) -> bool:
    unknown = set(peer) - {"podSelector", "namespaceSelector", "ipBlock"}
    if unknown or not peer:
        raise ValueError(f"a peer needs podSelector, namespaceSelector or ipBlock, got {peer}")
    if "ipBlock" in peer:
        if len(peer) > 1:
            raise ValueError("ipBlock cannot be combined with a selector in one peer")
        return _ip_in_block(peer["ipBlock"], source.ip)
    if not isinstance(source, Pod):
        return False  # selectors name pods; a client outside the cluster is none
    if "namespaceSelector" in peer:
        labels = {
            **namespaces.get(source.namespace, {}),
            "kubernetes.io/metadata.name": source.namespace,
        }
        if not selector_matches(peer["namespaceSelector"], labels):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector") or {}, source.labels)


def _ip_in_block(block: Mapping[str, Any], ip: str | None) -> bool:
    if ip is None:
        return False
    address = ipaddress.ip_address(ip)
    if address not in ipaddress.ip_network(block["cidr"]):
        return False
    return not any(address in ipaddress.ip_network(e) for e in block.get("except") or [])


def _port_matches(entry: Mapping[str, Any], destination: Pod, port: int, protocol: str) -> bool:
    unknown = set(entry) - {"port", "endPort", "protocol"}
    if unknown:
        raise ValueError(f"unknown port fields {sorted(unknown)}")
    entry_protocol = entry.get("protocol", "TCP")
    if entry_protocol not in ("TCP", "UDP", "SCTP"):
        raise ValueError(f"unknown protocol {entry_protocol!r}")
    if entry_protocol != protocol:
        return False
    wanted = entry.get("port")
    if wanted is None:
        if "endPort" in entry:
            raise ValueError("endPort needs a port")
        return True
    if isinstance(wanted, str):
        if "endPort" in entry:
            raise ValueError("endPort needs a numeric port")
        named = destination.named_ports.get(wanted)
        return named is not None and named == (port, protocol)
    end = entry.get("endPort", wanted)
    if end < wanted:
        raise ValueError(f"endPort {end} is below port {wanted}")
    return bool(wanted <= port <= end)
