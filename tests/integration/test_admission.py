"""Invalid PDDeployments are refused by the real API server (CEL and schema in the generated
CRD) with a message that names the field and says what to do."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helpers.factories import pdd_body, sample_spec
from helpers.operator_proc import install_crd

GROUP, VERSION, PLURAL = "pdd.dev", "v1alpha1", "pddeployments"

# The sample's required fields only: everything else is left to the API server's defaults.
VALID: dict[str, Any] = {key: sample_spec()[key] for key in ("model", "engine", "router")}
RDMA = {"resourceName": "rdma/hca"}

# (case id, spec fields to set (dotted path -> value), substrings the message must contain)
INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "engine port on the sidecar's",
        {"engine.port": 8099},
        ["spec.engine.port must differ", "sidecar's port 8099"],
    ),
    (
        "engine port on the side channel",
        {"engine.port": 5600},
        ["spec.engine.port must differ", "sideChannelPort"],
    ),
    (
        "vllm tp sizes that do not divide",
        {"prefill.gpusPerInstance": 3, "decode.gpusPerInstance": 4},
        ["spec.prefill.gpusPerInstance and spec.decode.gpusPerInstance", "not 3 and 4"],
    ),
    ("negative replicas", {"prefill.replicas": -1}, ["spec.prefill.replicas", "between 0 and 512"]),
    ("absurd replicas", {"decode.replicas": 100000}, ["spec.decode.replicas", "between 0 and 512"]),
    (
        "zero gpus",
        {"prefill.gpusPerInstance": 0},
        ["spec.prefill.gpusPerInstance", "between 1 and 8"],
    ),
    ("too many gpus", {"decode.gpusPerInstance": 16}, ["spec.decode.gpusPerInstance", "one node"]),
    ("unknown engine", {"engine.type": "trtllm"}, ["spec.engine.type", "vllm", "sglang", "custom"]),
    (
        "malformed image",
        {"engine.image": "Not An Image!"},
        ["spec.engine.image", "image reference"],
    ),
    (
        "bad digest",
        {"engine.image": "vllm/vllm-openai@sha256:abc"},
        ["spec.engine.image", "sha256"],
    ),
    ("uppercase repo", {"engine.image": "VLLM/engine:1"}, ["spec.engine.image", "lowercase"]),
    ("port zero", {"engine.port": 0}, ["spec.engine.port", "between 1 and 65535"]),
    ("port too big", {"engine.port": 70000}, ["spec.engine.port", "between 1 and 65535"]),
    (
        # The default image's routers need an engine protocol they know: vLLM's or SGLang's.
        "custom engine with the default router",
        {"engine.type": "custom", "router": {"enabled": True}},
        ["custom engine has no router", "spec.router.command", "enabled to false"],
    ),
    (
        "negative router replicas",
        {"router.replicas": -1},
        ["spec.router.replicas", "between 0 and 64"],
    ),
    (
        "unknown ucx transport",
        {"kvTransfer.ucx.transports": ["rc_x", "infiniband"]},
        ["spec.kvTransfer.ucx.transports", "unknown UCX transport"],
    ),
    (
        "auto mixed with tokens",
        {"kvTransfer.ucx.transports": ["auto", "tcp"]},
        ["'auto' stands alone"],
    ),
    ("empty transports", {"kvTransfer.ucx.transports": []}, ["spec.kvTransfer.ucx.transports"]),
    (
        "dmabuf over tcp only",
        {
            "kvTransfer.gpuDirect": "dmabuf",
            "kvTransfer.rdma": RDMA,
            "kvTransfer.ucx.transports": ["tcp", "cuda_copy"],
        },
        ["spec.kvTransfer.gpuDirect", "no RDMA transport", "rc_x"],
    ),
    (
        "dmabuf without a NIC",
        {"kvTransfer.gpuDirect": "dmabuf"},
        ["spec.kvTransfer.rdma.resourceName"],
    ),
    ("unknown gpudirect mode", {"kvTransfer.gpuDirect": "always"}, ["spec.kvTransfer.gpuDirect"]),
    (
        "explicit nics without map",
        {"kvTransfer.nicSelection.mode": "explicit"},
        ["spec.kvTransfer.nicSelection.map"],
    ),
    (
        "malformed nic list",
        {"kvTransfer.nicSelection": {"mode": "explicit", "map": [{"gpu": 0, "devices": "mlx5_0"}]}},
        ["nicSelection.map[].devices", "mlx5_3:1"],
    ),
    (
        "nic map gpu out of range",
        {
            "kvTransfer.nicSelection": {
                "mode": "explicit",
                "map": [{"gpu": 99, "devices": "mlx5_0:1"}],
            }
        },
        ["nicSelection.map[].gpu"],
    ),
    (
        "unparsable shm size",
        {"kvTransfer.sharedMemorySize": "lots"},
        ["spec.kvTransfer.sharedMemorySize", "quantity"],
    ),
    (
        "unparsable cpu request",
        {"prefill.resources": {"requests": {"cpu": "two"}}},
        ["resources.requests", "quantity"],
    ),
    (
        "rdma resource without domain",
        {"kvTransfer.rdma": {"resourceName": "rdma"}},
        ["spec.kvTransfer.rdma.resourceName", "extended resource"],
    ),
    (
        "zero rdma devices",
        {"kvTransfer.rdma": {"resourceName": "rdma/hca", "count": 0}},
        ["spec.kvTransfer.rdma.count"],
    ),
    (
        "etcd mode without endpoints",
        {"kvTransfer.metadataExchange.mode": "etcd"},
        ["etcdEndpoints"],
    ),
    (
        "etcd endpoint without scheme",
        {"kvTransfer.metadataExchange": {"mode": "etcd", "etcdEndpoints": ["etcd:2379"]}},
        ["etcdEndpoints", "http(s)://"],
    ),
    (
        "custom engine without side channel",
        {"engine.type": "custom", "kvTransfer.metadataExchange.mode": "engine"},
        ["metadataExchange.mode", "sidecar or etcd"],
    ),
    (
        "no instances at all",
        {"prefill.replicas": 0, "decode.replicas": 0},
        ["at least one instance"],
    ),
    (
        "dra and device plugin nic",
        {"topology.dra.enabled": True, "kvTransfer.rdma": RDMA},
        ["spec.topology.dra.enabled", "remove spec.kvTransfer.rdma.resourceName"],
    ),
    (
        "non-ucx extra env",
        {"kvTransfer.ucx.extraEnv": [{"name": "LD_PRELOAD", "value": "x"}]},
        ["extraEnv[].name", "UCX_"],
    ),
    (
        "privileged side channel port",
        {"kvTransfer.sideChannelPort": 80},
        ["spec.kvTransfer.sideChannelPort"],
    ),
    ("fraction above one", {"kvTransfer.verification.minFraction": 1.5}, ["minFraction"]),
    (
        "probe interval too short",
        {"kvTransfer.verification.intervalSeconds": 10},
        ["intervalSeconds", ">= 60"],
    ),
    ("empty model", {"model.name": ""}, ["spec.model.name"]),
    ("unknown placement", {"topology.placement": "always"}, ["spec.topology.placement"]),
    ("bad topology level", {"topology.levels": ["Not A Label!"]}, ["spec.topology.levels"]),
    (
        "env value and valueFrom",
        {
            "engine.env": [
                {
                    "name": "A",
                    "value": "1",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                }
            ]
        },
        ["value or valueFrom"],
    ),
    ("unknown field", {"prefil": {"replicas": 1}}, ["unknown field", "spec.prefil"]),
    (
        "no model source",
        {"model.source": {}},
        ["spec.model.source: set exactly one of huggingFace, pvc, hostPath or image"],
    ),
    (
        "two model sources",
        {"model.source": {"huggingFace": {}, "pvc": {"claimName": "m"}}},
        ["spec.model.source: set exactly one of huggingFace, pvc, hostPath or image"],
    ),
    (
        "bad token secret name",
        {"model.source": {"huggingFace": {"tokenSecretRef": {"name": "HF_Token"}}}},
        ["spec.model.source.huggingFace.tokenSecretRef.name must be the name of a Secret"],
    ),
    (
        "bad token secret key",
        {"model.source": {"huggingFace": {"tokenSecretRef": {"name": "t", "key": "a b"}}}},
        ["tokenSecretRef.key must be a Secret key"],
    ),
    (
        "bad revision",
        {"model.source": {"huggingFace": {"revision": "-bad"}}},
        ["spec.model.source.huggingFace.revision"],
    ),
    (
        "bad cache claim name",
        {"model.source": {"huggingFace": {"cache": {"claimName": "Cache!"}}}},
        ["spec.model.source.huggingFace.cache.claimName must be the name of a PersistentVolume"],
    ),
    (
        "parent segment in subPath",
        {"model.source": {"pvc": {"claimName": "m", "subPath": "models/../../etc"}}},
        ["spec.model.source.pvc.subPath", "without '..' segments"],
    ),
    (
        "absolute subPath",
        {"model.source": {"image": {"reference": "m:v1", "subPath": "/models"}}},
        ["spec.model.source.image.subPath must be a relative path"],
    ),
    (
        "relative hostPath",
        {"model.source": {"hostPath": {"path": "mnt/models"}}},
        ["spec.model.source.hostPath.path must be an absolute directory"],
    ),
    (
        "hostPath of the root",
        {"model.source": {"hostPath": {"path": "/"}}},
        ["other than '/'"],
    ),
    (
        "bad model image",
        {"model.source": {"image": {"reference": "Not An Image"}}},
        ["spec.model.source.image.reference must be an image reference"],
    ),
    (
        "startup timeout too short",
        {"engine.startupTimeoutSeconds": 10},
        ["spec.engine.startupTimeoutSeconds must be between 60 and 86400"],
    ),
]


def spec_with(changes: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(VALID)
    for path, value in changes.items():
        node = spec
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return spec


def create(
    api_client: client.ApiClient, namespace: str, spec: dict[str, Any], name: str = "bad"
) -> None:
    body = {**pdd_body(name, namespace), "spec": spec}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict"
    )


@pytest.fixture(scope="module")
def crd(api_client: client.ApiClient) -> None:
    install_crd(api_client)


@pytest.mark.parametrize(
    "changes,expected", [(c, e) for _, c, e in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_spec_is_refused_with_a_message_naming_the_field(
    crd: None,
    api_client: client.ApiClient,
    namespace: str,
    changes: dict[str, Any],
    expected: list[str],
) -> None:
    with pytest.raises(ApiException) as raised:
        create(api_client, namespace, spec_with(changes))
    assert raised.value.status in (400, 422)
    message = json.loads(raised.value.body)["message"]
    for fragment in expected:
        assert fragment in message, message


def test_the_valid_base_and_the_example_are_accepted(
    crd: None, api_client: client.ApiClient, namespace: str
) -> None:
    import yaml

    from helpers.operator_proc import ROOT

    create(api_client, namespace, spec_with({}))
    example = yaml.safe_load((ROOT / "examples" / "vllm-2p4d.yaml").read_text())
    create(api_client, namespace, example["spec"], name=example["metadata"]["name"])


def test_defaults_are_filled_in_by_the_api_server(
    crd: None, api_client: client.ApiClient, namespace: str
) -> None:
    body = {**pdd_body("defaults", namespace), "spec": VALID}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
    )
    spec = created["spec"]
    assert spec["engine"]["type"] == "vllm"
    assert spec["prefill"]["replicas"] == 1
    assert spec["kvTransfer"]["ucx"]["transports"] == ["auto"]
    assert spec["kvTransfer"]["sharedMemorySize"] == "16Gi"
    assert spec["topology"]["levels"][0] == "nvidia.com/gpu.clique"
    router = spec["router"]
    assert (router["metricsPort"], router["requestTimeoutSeconds"]) == (29000, 1800)
    assert router["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"memory": "2Gi"},
    }


def test_a_253_character_name_is_accepted_and_derives_valid_child_names(
    crd: None, api_client: client.ApiClient, namespace: str
) -> None:
    from pdd_operator.api import names

    long_name = "a" * 120 + "." + "b" * 132
    create(api_client, namespace, spec_with({}), name=long_name)
    assert len(names.role_name(long_name, "prefill")) <= 52


def test_the_engine_type_cannot_change_on_update(
    crd: None, api_client: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api_client)
    body = {**pdd_body("immutable", namespace), "spec": spec_with({})}
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    patch = {"spec": {"engine": {"type": "sglang"}}}
    with pytest.raises(ApiException) as raised:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "immutable", patch
        )
    message = json.loads(raised.value.body)["message"]
    assert "spec.engine.type is immutable" in message and "create a new PDDeployment" in message
    # Everything else stays changeable.
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "immutable", {"spec": {"decode": {"replicas": 3}}}
    )


@pytest.mark.parametrize(
    "source",
    [
        {"huggingFace": {}},
        {
            "huggingFace": {
                "tokenSecretRef": {"name": "hf-token"},
                "revision": "0cb88a4f764b7a12671c53f0838cd831a0843b95",
                "cache": {"claimName": "hf-cache"},
            }
        },
        {"pvc": {"claimName": "llama-70b", "subPath": "meta-llama/Llama-3.3-70B-Instruct"}},
        {"hostPath": {"path": "/mnt/models/llama-3.3-70b"}},
        {"image": {"reference": "registry.example.com/models/llama:v1", "pullPolicy": "Always"}},
    ],
    ids=["huggingFace default", "huggingFace full", "pvc", "hostPath", "image"],
)
def test_each_model_source_is_accepted(
    crd: None, api_client: client.ApiClient, namespace: str, source: dict[str, Any]
) -> None:
    create(api_client, namespace, spec_with({"model.source": source}))


def test_a_spec_without_a_model_source_stays_without_one(
    crd: None, api_client: client.ApiClient, namespace: str
) -> None:
    """Existing objects keep their meaning: no source is a Hugging Face download, and the
    API server adds none (a defaulted `source: {}` would break the one-of rule)."""
    body = {**pdd_body("no-source", namespace), "spec": VALID}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
    )
    assert "source" not in created["spec"]["model"]
    token = {"huggingFace": {"tokenSecretRef": {"name": "t"}}}
    body = {**pdd_body("token", namespace), "spec": spec_with({"model.source": token})}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
    )
    assert created["spec"]["model"]["source"]["huggingFace"]["tokenSecretRef"]["key"] == "HF_TOKEN"
