"""Merge a user's pod-template fragment over the rendered template.

Maps merge recursively; lists of named items (containers, volumes, env, ports) merge by name,
so a fragment can change one container without restating the others; other lists replace.
"""

from __future__ import annotations

import copy
from typing import Any


def merge_template(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = merge_template(current, value)
        elif isinstance(current, list) and _named_list(current) and _named_list(value):
            merged[key] = _merge_by_name(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value)


def _merge_by_name(base: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name = {item["name"]: item for item in base}
    order = [item["name"] for item in base]
    for item in patch:
        name = item["name"]
        by_name[name] = (
            merge_template(by_name[name], item) if name in by_name else copy.deepcopy(item)
        )
        if name not in order:
            order.append(name)
    return [by_name[name] for name in order]
