"""Merge a user's pod-template fragment over the rendered template.

Maps merge recursively; lists of named items (containers, volumes, env, ports) merge by name,
so a fragment can change one container without restating the others; other lists replace.
`merge_pod_template` then puts back what the operator injects, whatever the fragment said.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

CONTAINER_LISTS = ("initContainers", "containers")


def merge_pod_template(
    base: dict[str, Any],
    patch: dict[str, Any],
    injected: Collection[str],
    settable: Collection[str],
) -> dict[str, Any]:
    """`merge_template`, except that each injected container of `base`, and every volume it
    mounts, stays as rendered but for the `settable` fields the patch gave the container.
    The models refuse such a patch already; this holds even where that check was bypassed (an
    older operator stored the object, a render from a file), because a changed command or
    mount in the sidecar would run the user's code beside the deployment's token."""
    merged = merge_template(base, patch)
    base_spec, merged_spec = base.get("spec", {}), merged.get("spec")
    if not isinstance(merged_spec, dict):
        merged["spec"] = merged_spec = {}
    mounted: set[str] = set()
    for list_name in CONTAINER_LISTS:
        for original in base_spec.get(list_name, []):
            if original["name"] in injected:
                merged_spec[list_name] = _restore(merged_spec.get(list_name), original, settable)
                mounted.update(m["name"] for m in original.get("volumeMounts", []))
    # What an injected container mounts stays as rendered too: a volume of the same name in
    # the patch would change what the sidecar or the preflight reads.
    for volume in base_spec.get("volumes", []):
        if volume["name"] in mounted:
            merged_spec["volumes"] = _restore(merged_spec.get("volumes"), volume, ("name",))
    return merged


def _restore(
    containers: Any, original: dict[str, Any], settable: Collection[str]
) -> list[dict[str, Any]]:
    """The list with `original` back in place of its namesake (appended where the patch
    replaced the whole list), keeping only the patch's `settable` fields."""
    items = [c for c in containers if isinstance(c, dict)] if isinstance(containers, list) else []
    names = [c.get("name") for c in items]
    restored = copy.deepcopy(original)
    if original["name"] not in names:
        return [*items, restored]
    index = names.index(original["name"])
    restored.update({k: v for k, v in items[index].items() if k in settable})
    items[index] = restored
    return items


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
