"""The node agent's access to the API server: reading and patching one Node (credentials come
from pdd_kubeconfig, as for every process of the project).

Its own, not the operator's client: the node side needs two calls, none of the operator's
retries, caches or field manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELD_MANAGER = "pdd-topology-agent"


class KubernetesNodeClient:
    """The agent's NodeMetadataClient over the official client."""

    def __init__(self, core_v1: Any) -> None:
        self._core_v1 = core_v1

    def read_node_metadata(self, name: str) -> tuple[dict[str, str], dict[str, str]]:
        """The Node's (annotations, labels)."""
        metadata = self._core_v1.read_node(name).metadata
        return dict(metadata.annotations or {}), dict(metadata.labels or {})

    def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> None:
        self._core_v1.patch_node(
            name,
            dict(patch),
            field_manager=FIELD_MANAGER,
            _content_type="application/merge-patch+json",
        )
