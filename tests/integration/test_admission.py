"""Invalid PDDeployments are refused by the real API server (CEL and schema in the generated
CRD) with a message that names the field and says what to do."""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
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
        [
            "spec.prefill and spec.decode TP sizes (parallelism.tensor, else gpusPerInstance)",
            "not 3 and 4",
        ],
    ),
    (
        "LoRA adapters with one name twice",
        {
            "model.adapters": [
                {"name": "sql", "source": {"pvc": {"claimName": "a"}}},
                {"name": "sql", "source": {"pvc": {"claimName": "b"}}},
            ]
        },
        ["spec.model.adapters: each adapter needs a name of its own"],
    ),
    (
        "LoRA adapter named like the model",
        {
            "model.servedName": "llama",
            "model.adapters": [{"name": "llama", "source": {"pvc": {"claimName": "a"}}}],
        },
        ["spec.model.adapters[].name must differ from the model's served name"],
    ),
    (
        "LoRA adapter with two sources",
        {
            "model.adapters": [
                {
                    "name": "sql",
                    "source": {"pvc": {"claimName": "a"}, "huggingFace": {"repo": "org/sql"}},
                }
            ]
        },
        ["spec.model.adapters[].source: set exactly one of huggingFace, pvc or image"],
    ),
    (
        "LoRA adapter from the Hub beside a model on a claim",
        {
            "model.source": {"pvc": {"claimName": "weights"}},
            "model.adapters": [{"name": "sql", "source": {"huggingFace": {"repo": "org/sql"}}}],
        },
        ["an adapter from the Hugging Face Hub needs the model from the Hub too"],
    ),
    (
        "LoRA adapter name with a colon",
        {"model.adapters": [{"name": "llama:sql", "source": {"pvc": {"claimName": "a"}}}]},
        ["spec.model.adapters[].name must be letters, digits"],
    ),
    (
        "LoRA flags in args beside the adapters field",
        {
            "model.adapters": [{"name": "sql", "source": {"pvc": {"claimName": "a"}}}],
            "engine.args": ["--lora-modules", "x=/y"],
        },
        ["spec.model.adapters renders the vllm engine's LoRA flags: remove"],
    ),
    (
        "LoRA adapters for a custom engine",
        {
            "engine.type": "custom",
            "model.adapters": [{"name": "sql", "source": {"pvc": {"claimName": "a"}}}],
        },
        ["spec.model.adapters is rendered for vllm and sglang engines"],
    ),
    (
        "KV offload tier below 1Gi",
        {"kvCache.offload.cpu": "512Mi"},
        ["spec.kvCache.offload.cpu must be at least 1Gi"],
    ),
    (
        "KV offload tier not a quantity",
        {"kvCache.offload.cpu": "lots"},
        ["spec.kvCache.offload.cpu must be a quantity such as 64Gi"],
    ),
    (
        "KV offload for a custom engine",
        {"engine.type": "custom", "kvCache.offload.cpu": "64Gi"},
        ["spec.kvCache.offload is rendered for vllm and sglang engines"],
    ),
    (
        "SGLang hierarchical cache in args beside the offload field",
        {
            "engine.type": "sglang",
            "kvCache.offload.cpu": "64Gi",
            "prefill.args": ["--hicache-ratio=2"],
        },
        ["spec.kvCache.offload.cpu renders SGLang's hierarchical cache: remove"],
    ),
    (
        "KV disk tier below 1Gi",
        {"engine.type": "sglang", "kvCache.offload.disk": {"size": "100Mi"}},
        ["spec.kvCache.offload.disk.size must be at least 1Gi"],
    ),
    (
        "KV disk tier for a custom engine",
        {"engine.type": "custom", "kvCache.offload.disk": {"size": "100Gi"}},
        ["spec.kvCache.offload is rendered for vllm and sglang engines"],
    ),
    (
        "SGLang storage backend in args beside the disk tier",
        {
            "engine.type": "sglang",
            "kvCache.offload": {"cpu": "64Gi", "disk": {"size": "200Gi"}},
            "prefill.args": ["--hicache-storage-backend", "mooncake"],
        },
        ["spec.kvCache.offload.disk renders SGLang's hierarchical cache storage: remove"],
    ),
    (
        "SGLang storage tier's size in env beside the disk tier",
        {
            "engine.type": "sglang",
            "kvCache.offload": {"cpu": "64Gi", "disk": {"size": "200Gi"}},
            "prefill.env": [{"name": "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE", "value": "1T"}],
        },
        ["spec.kvCache.offload.disk sets where SGLang's storage tier is and its size: remove"],
    ),
    (
        "vLLM prefix cache turned off beside the disk tier",
        {
            "kvCache.offload.disk": {"size": "200Gi"},
            "prefill.args": ["--no-enable-prefix-caching"],
        },
        ["vLLM's disk tier keeps the prefix cache's blocks", "remove --no-enable-prefix-caching"],
    ),
    (
        "vLLM offload flag that replaces the NIXL connector",
        {"engine.args": ["--kv-offloading-size", "64"]},
        ["--kv-offloading-size (spec.kvCache.offload.cpu)"],
    ),
    (
        "router policy the engine's router lacks",
        {"router.policy": "prefix_hash"},
        ["spec.router.policy must be one of the vllm router's policies", "cache_aware"],
    ),
    (
        "kv_aware for both roles",
        {"router.policy": "kv_aware"},
        ["spec.router.policy: kv_aware routes the prefill pods", "spec.router.prefillPolicy"],
    ),
    (
        "kv_aware for decode",
        {"router.decodePolicy": "kv_aware"},
        ["spec.router.decodePolicy: kv_aware", "decode pods publish none"],
    ),
    (
        "KV events of your own beside kv_aware",
        {
            "router.prefillPolicy": "kv_aware",
            "prefill.args": ["--kv-events-config", '{"enable_kv_cache_events":true}'],
        },
        ["renders the prefill engines' KV event publishers", "remove --kv-events-config"],
    ),
    (
        "router policy for a router of your own",
        {"router.command": ["my-router"], "router.decodePolicy": "round_robin"},
        ["with a custom engine or spec.router.command", "spec.router.args"],
    ),
    ("negative replicas", {"prefill.replicas": -1}, ["spec.prefill.replicas", "between 0 and 512"]),
    ("absurd replicas", {"decode.replicas": 100000}, ["spec.decode.replicas", "between 0 and 512"]),
    (
        "zero gpus",
        {"prefill.gpusPerInstance": 0},
        ["spec.prefill.gpusPerInstance", "between 1 and 8"],
    ),
    ("too many gpus", {"decode.gpusPerInstance": 16}, ["spec.decode.gpusPerInstance", "one node"]),
    (
        "vllm layout that does not cover the instance's GPUs",
        {
            "prefill.gpusPerInstance": 8,
            "prefill.nodesPerInstance": 2,
            "prefill.parallelism": {"tensor": 8, "data": 1},
        },
        ["spec.prefill.parallelism", "tensor x pipeline x data must equal"],
    ),
    (
        "vllm data-parallel rank split over nodes",
        {
            "decode.gpusPerInstance": 4,
            "decode.nodesPerInstance": 2,
            "decode.parallelism": {"tensor": 8, "data": 1},
        },
        ["spec.decode.parallelism", "must fit on one node"],
    ),
    (
        "sglang dp attention that does not divide tp",
        {
            "engine.type": "sglang",
            "prefill.gpusPerInstance": 8,
            "prefill.nodesPerInstance": 2,
            "prefill.parallelism": {"tensor": 16, "data": 3},
        },
        ["spec.prefill.parallelism", "must each divide tensor"],
    ),
    (
        "too many nodes per instance",
        {"decode.nodesPerInstance": 17},
        ["spec.decode.nodesPerInstance", "between 1 and 16"],
    ),
    (
        "kueue without a queue",
        {"scheduling": {"gang": "kueue"}},
        ["spec.scheduling.gang is kueue", "queueName"],
    ),
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
    *[
        (
            f"{name} in {field}",
            {field: [{"name": name, "value": "x"}]},
            [f'spec.{field}[0].name: Invalid value: "{name}"', "the operator sets", fix],
        )
        for field, name, fix in [
            ("engine.env", "UCX_TLS", "spec.kvTransfer.ucx.transports"),
            ("engine.env", "UCX_NET_DEVICES", "spec.kvTransfer.nicSelection"),
            ("engine.env", "VLLM_NIXL_SIDE_CHANNEL_PORT", "spec.kvTransfer.sideChannelPort"),
            ("engine.env", "VLLM_NIXL_SIDE_CHANNEL_HOST", "pod IP"),
            ("engine.env", "UCX_IB_GPU_DIRECT_RDMA", "spec.kvTransfer.gpuDirect"),
            ("engine.env", "NIXL_UCX_SGL_ENABLE", "spec.kvTransfer.ucx.scatterGather"),
            ("engine.env", "NIXL_ETCD_ENDPOINTS", "spec.kvTransfer.metadataExchange"),
            ("engine.env", "POD_IP", "downward API"),
            ("engine.env", "PDD_ROLE", "PDD_*"),
            ("prefill.env", "PDD_SIDECAR_URL", "PDD_*"),
            ("decode.env", "UCX_TLS", "spec.kvTransfer.ucx.transports"),
            ("router.env", "PDD_PREFILL_SERVICE", "PDD_*"),
        ]
    ],
    (
        "reserved env by valueFrom",
        {"engine.env": [{"name": "PDD_DEPLOYMENT", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
        ['Invalid value: "PDD_DEPLOYMENT"', "the operator sets this variable"],
    ),
    (
        "ucx extra env overriding UCX_TLS",
        {"kvTransfer.ucx.extraEnv": [{"name": "UCX_TLS", "value": "tcp"}]},
        ["extraEnv[].name", "spec.kvTransfer.ucx.transports"],
    ),
    (
        "ucx extra env overriding UCX_NET_DEVICES",
        {"kvTransfer.ucx.extraEnv": [{"name": "UCX_NET_DEVICES", "value": "mlx5_9:1"}]},
        ["extraEnv[].name", "spec.kvTransfer.nicSelection"],
    ),
    (
        "ucx extra env twice",
        {
            "kvTransfer.ucx.extraEnv": [
                {"name": "UCX_RNDV_THRESH", "value": "1"},
                {"name": "UCX_RNDV_THRESH", "value": "2"},
            ]
        },
        ["spec.kvTransfer.ucx.extraEnv", "each variable once"],
    ),
    (
        "comma-joined transports in one token",
        {"kvTransfer.ucx.transports": ["rc_x,cuda_copy"]},
        ["unknown UCX transport"],
    ),
    (
        "caret inside a token",
        {"kvTransfer.ucx.transports": ["rc^_x", "cuda_copy"]},
        ["unknown UCX transport"],
    ),
    ("double caret", {"kvTransfer.ucx.transports": ["^^tcp"]}, ["unknown UCX transport"]),
    (
        "caret on a later token",
        {"kvTransfer.ucx.transports": ["rc_x", "cuda_copy", "^tcp"]},
        ["'^' (all but) may only start the first token"],
    ),
    (
        "caret on two tokens",
        {"kvTransfer.ucx.transports": ["^tcp", "^sm"]},
        ["'^' (all but) may only start the first token"],
    ),
    (
        "duplicate transport",
        {"kvTransfer.ucx.transports": ["rc_x", "cuda_copy", "rc_x"]},
        ["each transport once"],
    ),
    (
        "no gpu memory transport",
        {"kvTransfer.ucx.transports": ["rc_x", "ud_x", "sm"]},
        ["no transport for GPU memory", "cuda_copy"],
    ),
    (
        "copy transports only",
        {"kvTransfer.ucx.transports": ["cuda_copy", "cuda_ipc"]},
        ["only copy transports", "rc_x"],
    ),
    ("empty transport token", {"kvTransfer.ucx.transports": [""]}, ["unknown UCX transport"]),
    (
        "model name that is a flag",
        {"model.name": "--trust-remote-code"},
        ["spec.model.name", "'-'"],
    ),
    ("model name with a newline", {"model.name": "llama\n--x"}, ["spec.model.name", "spaces"]),
    ("model name with a space", {"model.name": "llama --x"}, ["spec.model.name", "spaces"]),
    ("served name that is a flag", {"model.servedName": "-x"}, ["spec.model.servedName", "'-'"]),
    (
        "gpu mapped twice",
        {
            "kvTransfer.nicSelection": {
                "mode": "explicit",
                "map": [{"gpu": 0, "devices": "mlx5_0:1"}, {"gpu": 0, "devices": "mlx5_1:1"}],
            }
        },
        ["nicSelection.map", "listed twice"],
    ),
    *[
        (
            f"network {bad!r}",
            {"kvTransfer.rdma": {"resourceName": "rdma/hca", "networks": [bad]}},
            ["spec.kvTransfer.rdma.networks[]", "[namespace/]name[@interface]"],
        )
        for bad in [
            "net-a,kube-system/host-net",
            '[{"name":"evil"}]',
            "net a",
            "Net",
            "a/b/c",
            "",
            "net@",
        ]
    ],
    (
        "network listed twice",
        {"kvTransfer.rdma": {"resourceName": "rdma/hca", "networks": ["n1", "n1"]}},
        ["networks", "each entry once"],
    ),
    (
        "vllm prefill tp larger than decode tp",
        {"prefill.gpusPerInstance": 4, "decode.gpusPerInstance": 2},
        ["decode TP to be a multiple of the prefill TP", "not 4 and 2"],
    ),
    (
        "vllm prefill tp larger than decode tp by parallelism",
        {
            "prefill.gpusPerInstance": 4,
            "prefill.parallelism": {"tensor": 4},
            "decode.gpusPerInstance": 4,
            "decode.parallelism": {"tensor": 2, "data": 2},
        },
        ["decode TP to be a multiple of the prefill TP", "parallelism.tensor"],
    ),
    (
        "vllm prefill tp 8 decode tp 1",
        {"prefill.gpusPerInstance": 8, "decode.gpusPerInstance": 1},
        ["decode TP to be a multiple"],
    ),
    *[
        (f"vllm flag {flag} in {field}", {field: flag_args}, [flag.split("=")[0], fix])
        for field, flag, flag_args, fix in [
            (
                "engine.args",
                "--tensor-parallel-size",
                ["--tensor-parallel-size", "8"],
                "parallelism.tensor",
            ),
            ("prefill.args", "-tp", ["-tp", "2"], "parallelism.tensor"),
            (
                "decode.args",
                "--tensor-parallel-size=4",
                ["--tensor-parallel-size=4"],
                "parallelism.tensor",
            ),
            (
                "engine.args",
                "--pipeline-parallel-size",
                ["--pipeline-parallel-size", "2"],
                "parallelism.pipeline",
            ),
            (
                "engine.args",
                "--data-parallel-size",
                ["--data-parallel-size", "2"],
                "parallelism.data",
            ),
            ("engine.args", "--headless", ["--headless"], "the pod's rank"),
            (
                "engine.args",
                "--kv-transfer-config",
                ["--kv-transfer-config", "{}"],
                "spec.kvTransfer",
            ),
            ("engine.args", "--port", ["--port", "9000"], "spec.engine.port"),
            ("engine.args", "--block-size", ["--block-size", "32"], "spec.engine.kvBlockSize"),
            (
                "engine.args",
                "--served-model-name",
                ["--served-model-name=x"],
                "spec.model.servedName",
            ),
        ]
    ],
    *[
        (
            f"sglang flag {flag}",
            {"engine.type": "sglang", "engine.args": [flag, "1"]},
            [flag, fix],
        )
        for flag, fix in [
            ("--tp-size", "parallelism.tensor"),
            ("--tp", "parallelism.tensor"),
            ("--node-rank", "the pod's rank"),
            ("--dist-init-addr", "the instance's leader"),
            ("--disaggregation-mode", "the role"),
            ("--disaggregation-bootstrap-port", "spec.kvTransfer.bootstrapPort"),
            ("--page-size", "spec.engine.kvBlockSize"),
            ("--model-path", "spec.model.name"),
        ]
    ],
    (
        "tp that does not divide the given attention heads",
        {
            "model.kvCache": {"layers": 80, "kvHeads": 8, "headDim": 128, "attentionHeads": 64},
            "prefill.gpusPerInstance": 3,
            "decode.gpusPerInstance": 3,
        },
        [
            "spec.prefill's tensor-parallel size (parallelism.tensor, else gpusPerInstance",
            "must divide spec.model.kvCache.attentionHeads",
            "1, 2, 4 or 8 for 64 heads",
        ],
    ),
    (
        "tp and given kv heads that do not divide one another",
        {
            "model.kvCache": {"layers": 32, "kvHeads": 8, "headDim": 128},
            "prefill.gpusPerInstance": 6,
            "decode.gpusPerInstance": 6,
        },
        [
            "spec.decode's tensor-parallel size",
            "spec.model.kvCache.kvHeads must divide one another",
        ],
    ),
    (
        "sglang dp attention over heads that do not divide",
        {
            "engine.type": "sglang",
            "model.kvCache": {"layers": 80, "kvHeads": 8, "headDim": 128, "attentionHeads": 64},
            "prefill.gpusPerInstance": 8,
            "prefill.nodesPerInstance": 3,
            "prefill.parallelism": {"tensor": 24, "data": 2},
        },
        [
            "SGLang: tensor / data with DP attention",
            "must divide spec.model.kvCache.attentionHeads",
        ],
    ),
    (
        "sglang ep that does not divide the given experts",
        {
            "engine.type": "sglang",
            "model.kvCache": {
                "layers": 94,
                "kvHeads": 4,
                "headDim": 128,
                "attentionHeads": 64,
                "experts": 128,
            },
            "prefill.gpusPerInstance": 8,
            "prefill.nodesPerInstance": 3,
            "prefill.parallelism": {"tensor": 24, "data": 3, "expert": 24},
        },
        ["spec.prefill.parallelism.expert must divide spec.model.kvCache.experts for SGLang"],
    ),
]

# Specs that look close to a refused one and are accepted: the rules refuse what cannot work,
# nothing more.
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    (
        "a routing policy per role",
        {"router.prefillPolicy": "cache_aware", "router.decodePolicy": "power_of_two"},
    ),
    ("prefill routed by KV events", {"router.prefillPolicy": "kv_aware"}),
    (
        "vLLM's KV events in args without kv_aware",
        {"prefill.args": ["--kv-events-config", '{"enable_kv_cache_events":true}']},
    ),
    ("a CPU tier of the KV cache", {"kvCache.offload.cpu": "64Gi"}),
    (
        "LoRA adapters from the Hub, a claim and an image",
        {
            "model.adapters": [
                {"name": "sql", "source": {"huggingFace": {"repo": "org/sql-lora"}}},
                {"name": "chat.v2", "source": {"pvc": {"claimName": "a", "subPath": "v2"}}},
                {"name": "ner", "source": {"image": {"reference": "registry.example/ner:1"}}},
            ]
        },
    ),
    (
        "vLLM's LoRA flags in args without the adapters field",
        {"engine.args": ["--enable-lora", "--max-lora-rank", "64"]},
    ),
    (
        "SGLang's hierarchical cache in args without the offload field",
        {"engine.type": "sglang", "prefill.args": ["--enable-hierarchical-cache"]},
    ),
    ("other UCX variables in env", {"engine.env": [{"name": "UCX_RNDV_THRESH", "value": "8k"}]}),
    ("PDD-like but not PDD_", {"engine.env": [{"name": "PDDX", "value": "1"}]}),
    ("exclusion list", {"kvTransfer.ucx.transports": ["^tcp", "cuda_ipc"]}),
    ("explicit transports", {"kvTransfer.ucx.transports": ["rc_x", "ud_x", "cuda_copy"]}),
    ("all", {"kvTransfer.ucx.transports": ["all"]}),
    ("vllm decode tp a multiple", {"prefill.gpusPerInstance": 2, "decode.gpusPerInstance": 8}),
    (
        # The TP sizes are 2 and 2: prefill's other two GPUs are a second data-parallel rank.
        "vllm decode tp a multiple by parallelism",
        {
            "prefill.gpusPerInstance": 4,
            "prefill.parallelism": {"tensor": 2, "data": 2},
            "decode.gpusPerInstance": 2,
        },
    ),
    (
        "sglang prefill tp larger",
        {"engine.type": "sglang", "prefill.gpusPerInstance": 4, "decode.gpusPerInstance": 2},
    ),
    (
        "custom engine flags are its own",
        {
            "engine.type": "custom",
            "router.enabled": False,
            "engine.args": ["--tp", "8", "--port", "1"],
        },
    ),
    ("a flag's value that looks like one", {"engine.args": ["--max-model-len", "8192"]}),
    ("model path", {"model.name": "/models/llama-3.1"}),
    (
        "networks with namespace and interface",
        {"kvTransfer.rdma": {"resourceName": "rdma/hca", "networks": ["infra/rdma-a@net1", "b"]}},
    ),
    (
        "distinct gpus",
        {
            "kvTransfer.nicSelection": {
                "mode": "explicit",
                "map": [{"gpu": 0, "devices": "mlx5_0:1"}, {"gpu": 1, "devices": "mlx5_1:1"}],
            }
        },
    ),
    (
        # 8 ranks, 4 KV heads: each KV head is copied to two ranks.
        "more tp ranks than given kv heads",
        {
            "model.kvCache": {"layers": 28, "kvHeads": 4, "headDim": 128, "attentionHeads": 32},
            "prefill.gpusPerInstance": 8,
            "decode.gpusPerInstance": 8,
        },
    ),
    (
        # SGLang's DP attention splits the heads over tensor / data = 8 ranks, not 24.
        "sglang dp attention over heads that divide",
        {
            "engine.type": "sglang",
            "model.kvCache": {"layers": 80, "kvHeads": 8, "headDim": 128, "attentionHeads": 64},
            "prefill.gpusPerInstance": 8,
            "prefill.nodesPerInstance": 3,
            "prefill.parallelism": {"tensor": 24, "data": 3},
        },
    ),
    (
        # vLLM gives the first 128 % 24 expert-parallel ranks one expert more.
        "vllm ep over experts that do not divide",
        {
            "model.kvCache": {
                "layers": 94,
                "kvHeads": 4,
                "headDim": 128,
                "attentionHeads": 64,
                "experts": 128,
            },
            "prefill.gpusPerInstance": 8,
            "prefill.nodesPerInstance": 3,
            "prefill.parallelism": {"tensor": 8, "data": 3, "expert": 24},
            "decode.gpusPerInstance": 8,
        },
    ),
    (
        # Multi-head latent attention keeps one latent per token: no KV heads are split.
        "mla with kv heads the tp does not divide",
        {
            "model.kvCache": {
                "layers": 61,
                "kvHeads": 3,
                "headDim": 576,
                "latent": True,
                "attentionHeads": 128,
            },
            "prefill.gpusPerInstance": 8,
            "decode.gpusPerInstance": 8,
        },
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


@pytest.fixture(scope="module")
def dry_run_namespace(api_client: client.ApiClient) -> Iterator[str]:
    """One namespace for the module's dry runs: they store nothing, so they cannot see each
    other, and a custom object needs no ServiceAccount, so nothing waits for the
    ServiceAccount controller (a namespace per test waited for it once per test). The
    namespace only has to exist (NamespaceLifecycle admission). A test that stores an object
    takes the per-test `namespace`."""
    core = client.CoreV1Api(api_client)
    name = f"t-admission-dry-runs-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


RELIABILITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def documented_answers() -> dict[str, str]:
    """docs/reliability.md's "Bad input" table: case -> the answer it quotes."""
    rows = (line.split(" | ") for line in RELIABILITY_DOC.read_text().splitlines())
    return {row[0][2:]: row[2].removesuffix(" |") for row in rows if len(row) == 3}


@pytest.mark.parametrize("case,changes,expected", INVALID, ids=[i for i, _, _ in INVALID])
def test_invalid_spec_is_refused_with_a_message_naming_the_field(
    crd: None,
    api_client: client.ApiClient,
    dry_run_namespace: str,
    case: str,
    changes: dict[str, Any],
    expected: list[str],
) -> None:
    with pytest.raises(ApiException) as raised:
        create(api_client, dry_run_namespace, spec_with(changes))
    assert raised.value.status in (400, 422)
    message = json.loads(raised.value.body)["message"]
    for fragment in expected:
        assert fragment in message, message
    # The answer docs/reliability.md shows is this one (`make reliability` writes it).
    quoted = f"{raised.value.status}: {message}".replace("|", "\\|").replace("\n", " ")
    assert documented_answers().get(case) == quoted, "docs/reliability.md: run make reliability"


@pytest.mark.parametrize("changes", [c for _, c in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_close_but_valid_specs_are_accepted(
    crd: None, api_client: client.ApiClient, dry_run_namespace: str, changes: dict[str, Any]
) -> None:
    create(api_client, dry_run_namespace, spec_with(changes))


def test_the_valid_base_and_the_example_are_accepted(
    crd: None, api_client: client.ApiClient, dry_run_namespace: str
) -> None:
    import yaml

    from helpers.operator_proc import ROOT

    create(api_client, dry_run_namespace, spec_with({}))
    example = yaml.safe_load((ROOT / "examples" / "vllm-2p4d.yaml").read_text())
    create(api_client, dry_run_namespace, example["spec"], name=example["metadata"]["name"])


def test_defaults_are_filled_in_by_the_api_server(
    crd: None, api_client: client.ApiClient, dry_run_namespace: str
) -> None:
    body = {**pdd_body("defaults", dry_run_namespace), "spec": VALID}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, dry_run_namespace, PLURAL, body, dry_run="All"
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
    crd: None, api_client: client.ApiClient, dry_run_namespace: str
) -> None:
    from pdd_operator.api import names

    long_name = "a" * 120 + "." + "b" * 132
    create(api_client, dry_run_namespace, spec_with({}), name=long_name)
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
    crd: None, api_client: client.ApiClient, dry_run_namespace: str, source: dict[str, Any]
) -> None:
    create(api_client, dry_run_namespace, spec_with({"model.source": source}))


def test_a_spec_without_a_model_source_stays_without_one(
    crd: None, api_client: client.ApiClient, dry_run_namespace: str
) -> None:
    """Existing objects keep their meaning: no source is a Hugging Face download, and the
    API server adds none (a defaulted `source: {}` would break the one-of rule)."""
    body = {**pdd_body("no-source", dry_run_namespace), "spec": VALID}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, dry_run_namespace, PLURAL, body, dry_run="All"
    )
    assert "source" not in created["spec"]["model"]
    token = {"huggingFace": {"tokenSecretRef": {"name": "t"}}}
    body = {**pdd_body("token", dry_run_namespace), "spec": spec_with({"model.source": token})}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, dry_run_namespace, PLURAL, body, dry_run="All"
    )
    assert created["spec"]["model"]["source"]["huggingFace"]["tokenSecretRef"]["key"] == "HF_TOKEN"
