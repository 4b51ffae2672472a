"""Where every process of the project finds the API server and its credentials.

One rule for the operator, the sidecar and the node agent: the kubeconfig they were given;
without one, the pod's ServiceAccount (in-cluster); outside a pod, the client library's default
kubeconfig (KUBECONFIG, else ~/.kube/config). A package of its own, beside pdd_contract (which
is standard library only) and outside the rooms, which import none of each other.
"""

from __future__ import annotations

from kubernetes import client, config


def load_configuration(
    kubeconfig: str | None = None, configuration: client.Configuration | None = None
) -> client.Configuration:
    """`configuration` (a fresh one if None) filled from the kubeconfig, else in-cluster
    credentials, else the default kubeconfig."""
    configuration = configuration if configuration is not None else client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return configuration
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return configuration


def core_v1_api(kubeconfig: str | None = None) -> client.CoreV1Api:
    """A CoreV1Api on a connection of its own, configured as load_configuration says."""
    return client.CoreV1Api(client.ApiClient(load_configuration(kubeconfig)))
