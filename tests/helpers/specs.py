"""Hypothesis strategies for valid PDDeployment specs (valid by construction, CEL included)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

IMAGES = [
    "vllm/vllm-openai:v0.11.0",
    "lmsysorg/sglang:v0.5.0-cu126",
    "registry.example.com:5000/team/engine@sha256:" + "a" * 64,
    "engine",
]
RDMA_TLS = ["rc_x", "rc", "dc_x", "ud_x"]
OTHER_TLS = ["cuda_copy", "cuda_ipc", "gdr_copy", "sm", "self", "tcp"]
GPU_TLS = ["cuda_copy", "cuda_ipc", "gdr_copy"]

dns_label = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
names = st.one_of(
    dns_label,
    st.lists(dns_label, min_size=2, max_size=12).map(".".join).filter(lambda n: len(n) <= 253),
)
quantities = st.sampled_from(["1", "500m", "16Gi", "128Gi", "2", "64"])


@st.composite
def roles(draw: st.DrawFn) -> dict[str, Any]:
    role: dict[str, Any] = {
        "replicas": draw(st.integers(0, 16)),
        "gpusPerInstance": draw(st.integers(1, 8)),
    }
    if draw(st.booleans()):
        role["args"] = draw(
            st.lists(st.sampled_from(["--enforce-eager", "--max-num-seqs", "64"]), max_size=3)
        )
    if draw(st.booleans()):
        role["resources"] = {"requests": {"cpu": draw(quantities), "memory": draw(quantities)}}
    if draw(st.booleans()):
        role["nodeSelector"] = {"pool": draw(dns_label)}
    if draw(st.booleans()):
        role["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return role


@st.composite
def kv_transfer(draw: st.DrawFn, dra: bool, engine: str) -> dict[str, Any]:
    gpudirect = draw(st.sampled_from(["auto", "dmabuf", "peermem", "off"]))
    kv: dict[str, Any] = {"gpuDirect": gpudirect}
    wants_rdma = gpudirect in ("dmabuf", "peermem") or draw(st.booleans())
    if wants_rdma and not dra:
        kv["rdma"] = {
            "resourceName": "rdma/hca",
            "count": draw(st.integers(1, 4)),
            "networks": draw(st.lists(dns_label, max_size=2, unique=True)),
            "required": draw(st.booleans()),
        }
    if gpudirect in ("dmabuf", "peermem") and not dra and "rdma" not in kv:
        kv["rdma"] = {"resourceName": "rdma/hca"}
    if draw(st.booleans()):
        tls = draw(
            st.lists(st.sampled_from(RDMA_TLS + OTHER_TLS), min_size=1, max_size=5, unique=True)
        )
        if gpudirect in ("dmabuf", "peermem") and not set(tls) & set(RDMA_TLS):
            tls.append("rc_x")
        if not set(tls) & set(GPU_TLS):  # the KV cache is GPU memory
            tls.append("cuda_copy")
        if set(tls) <= set(GPU_TLS):  # UCX needs a transport that carries messages
            tls.append("tcp")
        kv["ucx"] = {"transports": tls}
    if draw(st.booleans()):
        gpus = draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
        kv["nicSelection"] = {
            "mode": "explicit",
            "map": [{"gpu": g, "devices": f"mlx5_{g}:1"} for g in gpus],
        }
    modes = ["sidecar", "etcd"] + (["engine"] if engine != "custom" else [])
    mode = draw(st.sampled_from(modes))
    kv["metadataExchange"] = {"mode": mode}
    if mode == "etcd":
        kv["metadataExchange"]["etcdEndpoints"] = ["http://etcd.kv.svc:2379"]
    kv["sharedMemorySize"] = draw(st.sampled_from(["1Gi", "16Gi", "64Gi"]))
    return kv


model_sources = st.one_of(
    st.none(),
    st.just({"huggingFace": {}}),
    st.builds(
        lambda secret, revision, cache: {
            "huggingFace": {
                "tokenSecretRef": {"name": secret},
                **({"revision": revision} if revision else {}),
                **({"cache": {"claimName": cache}} if cache else {}),
            }
        },
        names,
        st.sampled_from(["", "main", "0cb88a4f764b7a12671c53f0838cd831a0843b95"]),
        st.one_of(st.just(""), names),
    ),
    st.builds(
        lambda claim, sub: {"pvc": {"claimName": claim, **({"subPath": sub} if sub else {})}},
        names,
        st.sampled_from(["", "models/llama", "Llama-3.3-70B-Instruct"]),
    ),
    st.builds(lambda path: {"hostPath": {"path": path}}, st.sampled_from(["/mnt/m", "/data/x"])),
    st.builds(
        lambda ref, policy: {
            "image": {"reference": ref, **({"pullPolicy": policy} if policy else {})}
        },
        st.sampled_from(IMAGES),
        st.sampled_from(["", "Always", "IfNotPresent", "Never"]),
    ),
)


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    engine = draw(st.sampled_from(["vllm", "sglang", "custom"]))
    dra = draw(st.booleans())
    prefill, decode = draw(roles()), draw(roles())
    if prefill["replicas"] + decode["replicas"] == 0:
        decode["replicas"] = 1
    # vLLM's NIXL connector: the decode TP is a multiple of the prefill TP.
    if engine == "vllm" and decode["gpusPerInstance"] % prefill["gpusPerInstance"]:
        decode["gpusPerInstance"] = prefill["gpusPerInstance"]
    spec: dict[str, Any] = {
        "model": {"name": draw(st.sampled_from(["meta-llama/Llama-3.1-70B-Instruct", "m"]))},
        "engine": {
            "type": engine,
            "image": draw(st.sampled_from(IMAGES)),
            # Not a port the pod's sidecar or side channels take (refused at admission).
            "port": draw(st.integers(1, 65535).filter(lambda p: p not in (5600, 8099, 8998))),
        },
        "prefill": prefill,
        "decode": decode,
        "router": {"enabled": False}
        if draw(st.booleans())
        else {"image": "ghcr.io/llm-d/router:v1", "replicas": draw(st.integers(0, 3))},
        "kvTransfer": draw(kv_transfer(dra, engine)),
        "topology": {
            "placement": draw(st.sampled_from(["required", "preferred", "none"])),
            "dra": {"enabled": dra},
        },
    }
    if engine == "custom" and draw(st.booleans()):
        spec["engine"]["command"] = ["python3", "-m", "engine"]
    source = draw(model_sources)
    if source is not None:
        spec["model"]["source"] = source
    if draw(st.booleans()):
        spec["engine"]["startupTimeoutSeconds"] = draw(st.integers(60, 86400))
    return spec
