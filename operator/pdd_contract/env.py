"""Environment variables one package sets and another reads.

Each constant is spelled like its value, so code that sets or reads one reads like the
environment it builds.
"""

from __future__ import annotations

from typing import Literal

# --- set by the operator on the engine and sidecar containers -------------------------------

PDD_ROLE = "PDD_ROLE"  # prefill | decode
PDD_DEPLOYMENT = "PDD_DEPLOYMENT"  # the deployment's instance id (the child-name prefix)
PDD_REVISION = "PDD_REVISION"  # the pod's labels.LABEL_REVISION
PDD_PROBER_POD = "PDD_PROBER_POD"  # the pod whose sidecar answers probe requests
PDD_SIDECAR_URL = "PDD_SIDECAR_URL"  # where the engine finds its sidecar
PDD_SIDECAR_TOKEN_FILE = "PDD_SIDECAR_TOKEN_FILE"
# Which engine side channel the sidecar checks for reachability (a name, or ports.py's
# NO_SIDE_CHANNEL), its ports, and the roles whose pods serve it (all comma-separated; see
# ports.py for the channels whose ports and roles need not be given).
PDD_SIDE_CHANNEL = "PDD_SIDE_CHANNEL"
PDD_SIDE_CHANNEL_PORTS = "PDD_SIDE_CHANNEL_PORTS"
PDD_SIDE_CHANNEL_ROLES = "PDD_SIDE_CHANNEL_ROLES"
# Only where a role's pods differ from PDD_SIDE_CHANNEL_PORTS: that role's ports per rank of
# an instance over several nodes (ports.format_rank_ports).
PDD_SIDE_CHANNEL_RANK_PORTS = "PDD_SIDE_CHANNEL_RANK_PORTS"

# The router's and a custom engine's view of the deployment.
PDD_PREFILL_SERVICE = "PDD_PREFILL_SERVICE"
PDD_DECODE_SERVICE = "PDD_DECODE_SERVICE"
PDD_ENGINE_PORT = "PDD_ENGINE_PORT"
PDD_MODEL = "PDD_MODEL"

# The downward API: who the pod is.
POD_NAME = "POD_NAME"
POD_UID = "POD_UID"
POD_IP = "POD_IP"

# --- set by the operator, read by the preflight init container on the node ----------------

# The preflight measures the KV path with the pod's devices (true | false), at the engine's
# KV descriptor size too when the operator knows it (bytes).
PDD_VERIFY_TRANSFER = "PDD_VERIFY_TRANSFER"
PDD_KV_DESCRIPTOR_BYTES = "PDD_KV_DESCRIPTOR_BYTES"
# ... in the engine's direction (WRITE: prefill pushes, READ: decode pulls) ...
PDD_KV_OPERATION = "PDD_KV_OPERATION"
KvOperation = Literal["WRITE", "READ"]
# ... with the engine's NIXL thread pool (NIXL's UCX ``num_threads``; 0: none) and its share of
# a request per thread (``split_batch_size``; 0: NIXL's default), one request in flight ...
PDD_KV_NIXL_THREADS = "PDD_KV_NIXL_THREADS"
PDD_KV_NIXL_SPLIT_BATCH = "PDD_KV_NIXL_SPLIT_BATCH"
# ... and across the boundary between the prefill and decode engines: "pod" (separate pods,
# each in its own PID, IPC and mount namespaces: the check's peer runs beyond one),
# "host-pid" (separate pods that both run in the host's PID namespace: still each its own IPC
# and mount namespaces and /dev/shm), "host-pid-ipc" (both in the host's PID and IPC
# namespaces: only the mount namespace apart) or "none" (no boundary: one set of namespaces).
PDD_KV_PEER_BOUNDARY = "PDD_KV_PEER_BOUNDARY"
KvPeerBoundary = Literal["pod", "host-pid", "host-pid-ipc", "none"]
PDD_GPUDIRECT = "PDD_GPUDIRECT"
GpuDirectRequest = Literal["auto", "dmabuf", "peermem", "off"]
PDD_REQUIRE_RDMA = "PDD_REQUIRE_RDMA"  # true | false
PDD_NIC_SELECTION = "PDD_NIC_SELECTION"
NicSelectionMode = Literal["auto", "explicit"]
# `<gpu index>=<device>:<port>[,<device>:<port>...]` entries joined by `;`, e.g.
# `0=mlx5_0:1;1=mlx5_1:1`; the GPU index is the node's (nvidia-smi's).
PDD_NIC_MAP = "PDD_NIC_MAP"

# --- written by the preflight into paths.ENV_FILE, sourced by the engine --------------------

PDD_GPU_NIC_MAP = "PDD_GPU_NIC_MAP"  # `0:mlx5_0:1,1:mlx5_1:1` (CUDA ordinal -> port)
PDD_GPUDIRECT_MODE = "PDD_GPUDIRECT_MODE"  # a labels.GpuDirectMode, or `off`

# --- UCX and NIXL: set by the operator or the preflight, reported by the transfer probe -----

UCX_TLS = "UCX_TLS"
UCX_NET_DEVICES = "UCX_NET_DEVICES"
UCX_IB_GPU_DIRECT_RDMA = "UCX_IB_GPU_DIRECT_RDMA"
UCX_CUDA_IPC_ENABLE_GET_ZCOPY = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"
NIXL_ETCD_ENDPOINTS = "NIXL_ETCD_ENDPOINTS"
NIXL_ETCD_NAMESPACE = "NIXL_ETCD_NAMESPACE"
NIXL_UCX_SGL_ENABLE = "NIXL_UCX_SGL_ENABLE"

# --- vLLM's NixlConnector side channel, set by the operator on the engine --------------------

VLLM_NIXL_SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
VLLM_NIXL_SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"

# Where the model comes from (spec.model.source): the Hugging Face cache, token and offline switch.
HF_HOME = "HF_HOME"
HF_TOKEN = "HF_TOKEN"
HF_HUB_OFFLINE = "HF_HUB_OFFLINE"

# An instance over several nodes (spec.<role>.nodesPerInstance > 1): every rank's pod gets its
# rank (the StatefulSet ordinal; 0 leads), the instance's node count and the leader's
# host:port where the ranks meet. A custom engine starts its multi-node launch from these.
PDD_NODE_RANK = "PDD_NODE_RANK"
PDD_NNODES = "PDD_NNODES"
PDD_LEADER_ADDRESS = "PDD_LEADER_ADDRESS"
