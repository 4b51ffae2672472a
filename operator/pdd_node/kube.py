"""The node agent's access to the API server: credentials, and reading and patching one Node.

Its own, not the operator's client: the node side needs two calls, none of the operator's
retries, caches or field manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client, config

FIELD_MANAGER = "pdd-topology-agent"


def core_v1_api(kubeconfig: str | None) -> Any:
    """A CoreV1Api with in-cluster credentials in a pod, else the kubeconfig (the argument or
    KUBECONFIG)."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    return client.CoreV1Api(client.ApiClient(configuration))


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
