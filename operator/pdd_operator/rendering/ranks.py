"""The ranks of an instance that spans nodes (spec.<role>.nodesPerInstance > 1), pure.

Each instance is a StatefulSet of nodesPerInstance pods; a pod's rank is its ordinal, which
the StatefulSet controller puts on the pod as the `apps.kubernetes.io/pod-index` label. All
ranks share one pod template, so what differs by rank is computed in the pod at start: the
downward API gives the engine PDD_NODE_RANK, and the engine's start shell appends the rank's
flags (the adapter's RankFlags and worker-only arguments) before it execs the engine.
"""

from __future__ import annotations

import shlex
from typing import Any

from pdd_contract.env import PDD_LEADER_ADDRESS, PDD_NNODES, PDD_NODE_RANK
from pdd_contract.ports import MULTINODE_RENDEZVOUS_PORT
from pdd_operator.api import names
from pdd_operator.api.v1alpha1 import PDDeployment
from pdd_operator.engines.base import HealthCheck, MultiNodeLaunch, Rendezvous, role_spec


def is_multinode(pdd: PDDeployment, role: str) -> bool:
    return role_spec(pdd.spec, role).nodesPerInstance > 1


def rendezvous(pdd: PDDeployment, role: str, index: int) -> Rendezvous:
    """Rank 0 of the instance by its stable DNS name: `<pod>.<instance Service>.<ns>.svc`."""
    instance = names.instance_name(pdd.name, role, index)
    return Rendezvous(
        nodes=role_spec(pdd.spec, role).nodesPerInstance,
        leader_host=f"{instance}-0.{instance}.{pdd.namespace}.svc",
        port=MULTINODE_RENDEZVOUS_PORT,
    )


def rank_env(meet: Rendezvous) -> list[dict[str, Any]]:
    label = f"metadata.labels['{names.LABEL_POD_INDEX}']"
    return [
        {"name": PDD_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": label}}},
        {"name": PDD_NNODES, "value": str(meet.nodes)},
        {"name": PDD_LEADER_ADDRESS, "value": meet.address},
    ]


def rank_script(launch: MultiNodeLaunch) -> str:
    """Shell that appends the rank's flags to "$@" (PDD_NODE_RANK is a number: the ordinal)."""
    every = [_rank_flag(f.flag, f.per_rank) for f in launch.rank_flags if not f.workers_only]
    workers = [shlex.quote(a) for a in launch.worker_args] + [
        _rank_flag(f.flag, f.per_rank) for f in launch.rank_flags if f.workers_only
    ]
    script = f'R="${{{PDD_NODE_RANK}:-0}}"; '
    if every:
        script += f'set -- "$@" {" ".join(every)}; '
    if workers:
        script += f'if [ "$R" != 0 ]; then set -- "$@" {" ".join(workers)}; fi; '
    return script


def _rank_flag(flag: str, per_rank: int) -> str:
    return f'{shlex.quote(flag)} "$((R * {per_rank}))"'


# What the rank-0 check allows the engine's answer at least: what it allowed before adapters
# declared a timeout, so no engine's multi-node probe got stricter. Longer where the adapter
# asks for longer.
LEADER_ANSWER_MIN_S = 5
# python3 starting in the engine container before the check sends its request.
INTERPRETER_START_S = 5


def leader_only_probe(health: HealthCheck, port: int, failure_threshold: int) -> dict[str, Any]:
    """The engine's HTTP health check on rank 0 only: the other ranks serve no HTTP (vLLM's
    --headless, SGLang's node-rank > 0) and are healthy while they run; the leader fails
    its check when a rank it drives is gone. The engine images (vLLM, SGLang) hold python3."""
    url = f"http://127.0.0.1:{port}{health.path}"
    answer_s = max(health.timeout_s, LEADER_ANSWER_MIN_S)
    check = f"import urllib.request; urllib.request.urlopen({url!r}, timeout={answer_s})"
    script = f'[ "${{{PDD_NODE_RANK}:-0}}" != 0 ] || exec python3 -c {shlex.quote(check)}'
    return {
        "exec": {"command": ["/bin/sh", "-c", script]},
        "periodSeconds": health.period_s,
        "timeoutSeconds": answer_s + INTERPRETER_START_S,
        "failureThreshold": failure_threshold,
    }
