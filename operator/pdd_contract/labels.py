"""Label and annotation keys that one package writes and another reads."""

from __future__ import annotations

from typing import Literal

# On every pod the operator renders. The router selects on them; a prefill pod pairs only
# with decode pods of its own revision (the sidecar gets it as PDD_REVISION).
LABEL_DEPLOYMENT = "pdd.dev/deployment"
LABEL_ROLE = "pdd.dev/role"
LABEL_REVISION = "pdd.dev/revision"

# The operator stamps a request id on the prober pod; that pod's sidecar answers with a
# `probe_result.ProbeResult` as JSON, plus `request_id`, on the same pod.
ANNOTATION_PROBE_REQUEST = "pdd.dev/probe-request"
ANNOTATION_PROBE_RESULT = "pdd.dev/probe-result"
# Where instances span nodes every prefill rank is asked, each with the decode pod it must
# measure against (its pair: same rank modulo the decode instance's ranks); absent: any peer.
ANNOTATION_PROBE_PEER = "pdd.dev/probe-peer"

# The node agent publishes these labels on its own Node; the operator's placement reads the
# GPUDirect label, node selectors and `kubectl get nodes -L` the others.
LABEL_GPUDIRECT = "pdd.dev/gpudirect"
LABEL_RDMA_NICS = "pdd.dev/rdma-nics"
LABEL_TOPOLOGY_VERSION = "pdd.dev/topology-version"

# The values of LABEL_GPUDIRECT: the GPUDirect RDMA flavour that works on the node.
GpuDirectMode = Literal["dmabuf", "peermem", "none"]

# The instance a pod belongs to when instances span nodes (its StatefulSet's index within
# the role); the rank is the StatefulSet controller's own pod-index label.
LABEL_INSTANCE = "pdd.dev/instance"
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"
