"""How the informers decode a watch event or a list page: whole, or only what is read of it.

Pods are most of what the operator's watches bring (at 100 deployments 56 of 68 MB, 17 KB an
event), and a pass reads a few hundred bytes of each: labels, annotations, owners, the node,
the GPU requests, the status. Building a dict of the whole object (its managedFields, every
container's command, env and mounts) and freeing it again was most of the watch threads' time.
`PODS` decodes only the fields below into plain dicts, skipping the rest while it parses;
what it returns reads like the whole object to everything that reads a pod (status.observe,
planning.compact), and tests/unit/test_decoding.py checks that each of them summarises the
same from both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

Decode = Callable[[bytes], Any]

# Every field is optional (omit_defaults): one absent or null is left out of the result, and
# the readers' `.get(name)` reads the same from it as from the whole object.


class _Container(msgspec.Struct, omit_defaults=True):
    name: Any = None
    resources: Any = None
    restartPolicy: Any = None  # an init container's: "Always" makes it a sidecar


class _PodSpec(msgspec.Struct, omit_defaults=True):
    nodeName: Any = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    overhead: Any = None


class _Metadata(msgspec.Struct, omit_defaults=True):
    name: Any = None
    namespace: Any = None
    uid: Any = None
    resourceVersion: Any = None
    labels: Any = None
    annotations: Any = None
    ownerReferences: Any = None
    deletionTimestamp: Any = None


class _Pod(msgspec.Struct, omit_defaults=True):
    apiVersion: Any = None
    kind: Any = None
    metadata: _Metadata | None = None
    spec: _PodSpec | None = None
    status: Any = None  # whole: why a pod cannot serve is told from many of its fields
    # A Status (the object of a watch's ERROR event) in the same shape: what ends a watch.
    code: Any = None
    reason: Any = None
    message: Any = None


class _PodEvent(msgspec.Struct, omit_defaults=True):
    type: Any = None
    object: _Pod | None = None


class _PodList(msgspec.Struct, omit_defaults=True):
    apiVersion: Any = None
    kind: Any = None
    metadata: Any = None
    items: list[_Pod] | None = None


def _pruned(shape: type[msgspec.Struct]) -> Decode:
    decoder = msgspec.json.Decoder(shape)
    return lambda data: msgspec.to_builtins(decoder.decode(data))


@dataclass(frozen=True)
class Decoding:
    event: Decode  # one line of a watch stream
    page: Decode  # one page of a list


WHOLE = Decoding(orjson.loads, orjson.loads)
PODS = Decoding(_pruned(_PodEvent), _pruned(_PodList))
