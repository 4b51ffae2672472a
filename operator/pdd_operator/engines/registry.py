"""Every engine adapter, keyed by its ``spec.engine.type`` value, and the CRD rules they own.

Each module of this package other than ``base``, ``cel_rules``, ``version``, this one and an
adapter's own parts (``vllm_kv_events``) is an engine and defines ``ADAPTER``; they are found
by listing the package, so adding an engine is adding its module (and its value to
``EngineSpec.type``). tests/unit/engines checks the two lists agree.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

import pdd_operator.engines as _package
from pdd_operator.api.v1alpha1 import SPEC_RULES
from pdd_operator.engines.base import EngineAdapter

_NOT_ENGINES = frozenset(
    {"base", "cel_rules", "registry", "version", "vllm_disk_tier", "vllm_kv_events"}
)


def _discover() -> Mapping[str, EngineAdapter]:
    found: dict[str, EngineAdapter] = {}
    for info in sorted(pkgutil.iter_modules(_package.__path__), key=lambda i: i.name):
        if info.name in _NOT_ENGINES:
            continue
        module = importlib.import_module(f"{_package.__name__}.{info.name}")
        adapter = getattr(module, "ADAPTER", None)
        if not isinstance(adapter, EngineAdapter):
            raise TypeError(f"{module.__name__} must define ADAPTER, an EngineAdapter")
        if adapter.type in found:
            raise ValueError(f"two engine adapters for type {adapter.type!r}")
        found[adapter.type] = adapter
    return MappingProxyType(found)


ENGINES: Mapping[str, EngineAdapter] = _discover()


def adapter_for(engine_type: str, engines: Mapping[str, EngineAdapter] = ENGINES) -> EngineAdapter:
    try:
        return engines[engine_type]
    except KeyError:
        known = ", ".join(sorted(engines))
        raise ValueError(f"no engine adapter for type {engine_type!r} (known: {known})") from None


def spec_rules(engines: Mapping[str, EngineAdapter] = ENGINES) -> list[tuple[str, str]]:
    """Every CEL rule on a PDDeployment's spec: the API's own (those that hold for every
    engine), then each engine's (``EngineAdapter.spec_rules``)."""
    common = [(v["rule"], v["message"]) for v in SPEC_RULES["x-kubernetes-validations"]]
    return [*common, *(rule for adapter in engines.values() for rule in adapter.spec_rules())]
