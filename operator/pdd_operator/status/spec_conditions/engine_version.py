"""EngineVersionSupported: whether the operator knows the engine release it renders for.

False is a Warning, not a stop: the pods run with the newest supported release's wiring, which
a newer engine usually keeps, and the message names the field that makes it certain.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdd_operator.api import condition_reasons as reasons
from pdd_operator.api import condition_types
from pdd_operator.api.v1alpha1 import Condition, PDDeploymentSpec
from pdd_operator.engines.registry import adapter_for
from pdd_operator.engines.version import ResolvedVersion
from pdd_operator.status.conditions import set_condition

CONDITION = condition_types.ENGINE_VERSION_SUPPORTED


def condition(
    previous: Sequence[Condition], spec: PDDeploymentSpec, gen: int, now: str
) -> list[Condition]:
    """None for an engine whose wiring has no versions (custom)."""
    adapter = adapter_for(spec.engine.type)
    resolved = adapter.version(spec)
    if resolved is None or adapter.versions is None:
        return []
    reason, message = version_verdict(spec, resolved, adapter.display_name, str(adapter.versions))
    return [set_condition(previous, CONDITION, resolved.supported, reason, message, gen, now)]


def version_verdict(
    spec: PDDeploymentSpec, resolved: ResolvedVersion, engine: str, supported: str
) -> tuple[str, str]:
    """(reason, message) in words a user acts on."""
    wiring = f"rendered for {engine} {resolved.wiring}, the newest supported ({supported})"
    if resolved.supported:
        return reasons.SUPPORTED, f"{engine} {resolved.wiring} (from the {resolved.source})"
    if resolved.declared is None:
        where = (
            f"spec.engine.version {spec.engine.version!r}"
            if resolved.source == "spec.engine.version"
            else f"the tag of spec.engine.image {spec.engine.image!r}"
        )
        return (
            reasons.VERSION_UNKNOWN,
            f"{where} names no {engine} release: {wiring}; set spec.engine.version to the "
            "release the image runs",
        )
    return (
        reasons.VERSION_NOT_SUPPORTED,
        f"{engine} {resolved.declared} (from the {resolved.source}) is outside the supported "
        f"{supported}: {wiring}, whose flags this release may not accept; run a supported "
        "release (docs/engines.md)",
    )
