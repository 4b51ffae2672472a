"""Reading Pod Security admission's refusals: which rules a pod broke."""

from __future__ import annotations

ENFORCE = "pod-security.kubernetes.io/enforce"
# One level stricter than each level but the strictest.
STRICTER = {"privileged": "baseline", "baseline": "restricted"}
_VIOLATES = "violates PodSecurity "


def violated_rules(message: str) -> set[str]:
    """The rules a refusal names, without their details: from `... violates PodSecurity
    "restricted:latest": runAsNonRoot != true (pod or container "engine" must set ...),
    seccompProfile (...)` the set {"runAsNonRoot != true", "seccompProfile"}. The details
    hold commas of their own, so only commas outside parentheses separate rules."""
    _, found, rest = message.partition(_VIOLATES)
    assert found, f"not a Pod Security refusal: {message}"
    rest = rest.split(": ", 1)[1]
    rules, current, depth = set(), "", 0
    for char in rest:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char == ",":
            rules.add(current)
            current = ""
            continue
        current += char
    rules.add(current)
    return {rule.split(" (", 1)[0].strip() for rule in rules if rule.strip()}
