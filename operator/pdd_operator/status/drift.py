"""Fingerprints of the fields the operator owns in a child: as rendered, and as they are live.

Drift (a child changed by hand) is found by comparing two fingerprints of the same canonical
form: one of the rendered object, one of the live object projected onto the fields this
operator's field manager owns, as the object's `managedFields` list them.

Why `managedFields` and not a plain "rendered ⊆ live" walk: the index that keeps children
sees each live object alone, without the render, and keeps only a short digest of it (the
objects are tens of KiB each). The server already records which fields the operator applied;
projecting the live object onto that set gives exactly the owned fields, server defaults and
foreign additions (a label a user adds, a field another controller sets) left out. Whatever
someone else changes in an owned field moves its ownership to them (an update takes ownership
of the fields it changes; a removed field leaves every set), so such a change drops the field
from the projection even where its new value would compare equal after normalisation.

The canonical form only has to absorb how the server re-spells what was applied: quantities
("1024Mi" comes back "1Gi"), numbers as strings, omitted empty values, list order. Where the
server re-spells something this form does not know, the fingerprints differ for an undrifted
child; the reconciler then applies once and accepts the fingerprint that apply produced
(reconcile/children.py), so such a gap costs one write per child and operator start, never a loop.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any

import orjson

# Set by the server, or not part of the owned fields (identity is in the URL).
_NOT_OWNED_TOP = ("apiVersion", "kind", "status")
_NOT_OWNED_META = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
)

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def rendered_fingerprint(obj: Mapping[str, Any]) -> str:
    """The digest of the fields a rendered child sets (what an apply makes the operator own)."""
    return _digest(_canonical(_owned_part(obj)))


def live_fingerprint(body: Mapping[str, Any], field_manager: str) -> str:
    """The digest of the live values of the fields `field_manager` owns by apply; equal to
    `rendered_fingerprint` of what was applied as long as nobody else changed them.

    Runs for every watch event of a child (a StatefulSet's status changes with every pod), so
    it walks the object once, building the canonical text as it goes."""
    fields = owned_fields(body, field_manager)
    if not fields:
        return ""
    return _digest(_projected(_owned_part(body), fields))


class LiveDigests:
    """`live_fingerprint` by object uid, reused while the object's generation and metadata
    stay the same.

    Most events of a StatefulSet or Deployment only change its status (every pod that starts
    or becomes ready), and walking one costs about a millisecond. The owned values can only
    change with the spec (which bumps the generation of every kind that has a status) or the
    metadata; a change of ownership alone, with the values kept, is no drift. Kinds without a
    generation have no status and change rarely: they are walked every time. Bounded: the
    oldest entries go first (a deleted object's entry is never looked up again)."""

    def __init__(self, max_entries: int = 16384) -> None:
        self.max_entries = max_entries
        self._entries: dict[str, tuple[int, bytes, str]] = {}

    def fingerprint(self, body: Mapping[str, Any], field_manager: str) -> str:
        meta = body.get("metadata", {})
        uid, generation = meta.get("uid"), meta.get("generation")
        if not uid or not generation:
            return live_fingerprint(body, field_manager)
        seen_meta = _metadata_digest(meta)
        cached = self._entries.pop(uid, None)
        if cached is not None and cached[:2] == (generation, seen_meta):
            digest = cached[2]
        else:
            digest = live_fingerprint(body, field_manager)
        self._entries[uid] = (generation, seen_meta, digest)
        if len(self._entries) > self.max_entries:
            del self._entries[next(iter(self._entries))]
        return digest


def _metadata_digest(meta: Mapping[str, Any]) -> bytes:
    parts = [meta.get(k) for k in ("labels", "annotations", "ownerReferences", "finalizers")]
    return hashlib.blake2b(orjson.dumps(parts), digest_size=8).digest()


def owned_fields(body: Mapping[str, Any], field_manager: str) -> Mapping[str, Any]:
    """The fieldsV1 set `field_manager` holds by apply on the main resource (a union, should
    the server ever list it more than once)."""
    sets = [
        entry.get("fieldsV1") or {}
        for entry in body.get("metadata", {}).get("managedFields") or []
        if entry.get("manager") == field_manager
        and entry.get("operation") == "Apply"
        and not entry.get("subresource")
        and entry.get("fieldsType", "FieldsV1") == "FieldsV1"
    ]
    if len(sets) == 1:
        return sets[0]
    merged: dict[str, Any] = {}
    for fields in sets:
        _merge(merged, fields)
    return merged


def _merge(into: dict[str, Any], fields: Mapping[str, Any]) -> None:
    for name, sub in fields.items():
        _merge(into.setdefault(name, {}), sub)


def _owned_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k not in _NOT_OWNED_TOP}
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        out["metadata"] = {k: v for k, v in meta.items() if k not in _NOT_OWNED_META}
    return out


def _digest(canonical: str | None) -> str:
    return hashlib.sha256((canonical or "null").encode()).hexdigest()[:16]


# The canonical form is JSON text: object keys sorted, list items sorted, scalars spelled by
# _scalar, and every empty value (null, "", [], {}) left out, as the server leaves it out.
# None stands for "empty".


def _canonical(value: Any, parent: str = "") -> str | None:
    if isinstance(value, Mapping):
        return _object(((str(k), _canonical(v, str(k))) for k, v in value.items()), parent)
    if isinstance(value, list):
        return _array(_canonical(v, parent) for v in value)
    return _scalar(value)


def _projected(value: Any, fields: Mapping[str, Any], parent: str = "") -> str | None:
    """The canonical text of the parts of `value` named by a fieldsV1 set. A leaf (an empty
    set) owns the whole value beneath it: a scalar, an atomic list or struct, or a map
    applied empty."""
    if not fields:
        return _canonical(value, parent)
    if isinstance(value, Mapping):
        return _object(
            (
                (name[2:], _projected(value[name[2:]], sub, name[2:]))
                for name, sub in fields.items()
                if name.startswith("f:") and name[2:] in value
            ),
            parent,
        )
    if isinstance(value, list):
        return _array(
            _projected(item, sub, parent)
            for name, sub in fields.items()
            if (item := _list_member(value, name)) is not None
        )
    return _scalar(value)


def _object(members: Any, parent: str) -> str | None:
    defaults = _ATOMIC_DEFAULTS.get(parent)
    parts = sorted(
        (key, text)
        for key, text in members
        if text is not None and not (defaults and defaults.get(key) == text)
    )
    if not parts:
        return None
    return "{" + ",".join(f"{encode_basestring(key)}:{text}" for key, text in parts) + "}"


def _array(items: Any) -> str | None:
    # Sorted: the server keeps an applied list's order, but merges in items of other
    # managers; a reordered atomic list is still seen (its ownership moves away).
    texts = sorted(text for text in items if text is not None)
    return "[" + ",".join(texts) + "]" if texts else None


def _list_member(items: list[Any], name: str) -> Any:
    """The item of a list a fieldsV1 member names: `k:{keys}`, `v:value` or `i:index`."""
    kind, wanted = _member_name(name)
    if kind == "k":
        for item in items:
            if isinstance(item, Mapping) and all(item.get(k) == v for k, v in wanted.items()):
                return item
    elif kind == "v" and wanted in items:
        return wanted
    elif kind == "i" and 0 <= wanted < len(items):
        return items[wanted]
    return None


@lru_cache(maxsize=4096)
def _member_name(name: str) -> tuple[str, Any]:
    """Parsed once: the same names come back in every event of every child."""
    try:
        if name.startswith("k:") or name.startswith("v:"):
            return name[0], json.loads(name[2:])
        if name.startswith("i:"):
            return "i", int(name[2:])
    except ValueError:
        pass
    return "", None


def _scalar(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return encode_basestring(_number(value) if value[0] in _NUMBER_START else value)
    if isinstance(value, int | float):
        return encode_basestring(_number(str(value)))
    return encode_basestring(str(value))


_NUMBER_START = frozenset("0123456789+-.")


def _number(text: str) -> str:
    """A number or quantity as one spelling ("1Gi" and "1024Mi", 2 and "2" alike); any other
    string as itself. Applied to both sides, so a string taken for a quantity by mistake only
    equals another spelling of the same quantity."""
    match = _QUANTITY.match(text)
    if match is None:
        return text
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number + (exponent or ""))
        if suffix:
            amount *= _SUFFIX[suffix]
        return "#" + format(amount.normalize(), "f")
    except ArithmeticError:  # InvalidOperation, or Overflow: a hash such as '1297e39167626459'
        return text


# Defaults the server writes inside values owned as a whole (atomic structs and lists), which a
# render may leave out: dropped on both sides. Found by the dry-run property test
# (tests/integration/test_dry_run_properties.py), which fails when one is missing here.
_SERVER_DEFAULTS: dict[str, dict[str, Any]] = {
    "fieldRef": {"apiVersion": "v1"},  # env valueFrom, downward API volumes
    "exactly": {"allocationMode": "ExactCount", "count": 1},  # DRA device requests
}
_ATOMIC_DEFAULTS = {
    parent: {key: _scalar(value) for key, value in defaults.items()}
    for parent, defaults in _SERVER_DEFAULTS.items()
}
