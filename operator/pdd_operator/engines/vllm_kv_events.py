"""vllm-router's `kv_aware` prefill policy and the KV events vLLM publishes for it (pure).

vllm-router 0.1.17 with ``--prefill-policy kv_aware`` learns which prefill holds a prompt's
blocks from each prefill's KV events, and sends a request to the prefill whose cached prefix
leaves the least to compute. It finds them through the worker itself, for every pod that
discovery adds (read in the 0.1.17 sdist, src/routers/http/pd_kv_state.rs and
src/kv_index/discovery.rs; the request-path tier runs it):

- ``GET /server_info?config_format=json`` gives the model and the KV block size. vLLM serves
  it only with ``VLLM_SERVER_DEV_MODE=1`` (0.33.0 entrypoints/launchers/api_server/routers.py),
  which also serves the engine's dev routes (prefix-cache reset, sleep, collective RPC) on its
  HTTP port: the NetworkPolicy already admits that port only from the deployment's own pods,
  its router and the metrics scrapers (docs/security.md).
- ``GET /kv_event_sources`` gives each data-parallel engine's ZMQ publisher, from
  ``--kv-events-config``; the router rewrites the wildcard host to the pod's IP, subscribes,
  and backfills from the replay endpoint what was published before it subscribed.

vLLM 0.11.0 has no ``/kv_event_sources`` and sends events as arrays the router refuses, so
there the router routes prefill by load alone (the verdict says so). A multi-node prefill
instance's ranks publish from their own pods while the router asks the leader, which
reports wildcard endpoints the router resolves to the leader: not rendered either.
"""

from __future__ import annotations

import json

from pdd_operator.api.v1alpha1 import PDDeploymentSpec
from pdd_operator.engines.base import EnginePort, EnvEntry, TierVerdict, env_value
from pdd_operator.engines.version import Version

KV_AWARE = "kv_aware"
KV_EVENTS_CONFIG = "--kv-events-config"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# The release read that serves /kv_event_sources and publishes events as the tagged maps the
# router decodes (0.33.0 distributed/kv_events.py); between 0.11.0 and it none were read.
KV_EVENT_SOURCES_SINCE = Version(0, 33, 0)
# vLLM's default publisher port; each data-parallel engine adds its index to both ports
# (0.33.0 kv_events.py, offset_endpoint_port), so the replay ports start past eight engines.
EVENTS_PORT, REPLAY_PORT = 5557, 5577
EVENTS_PORT_NAME, REPLAY_PORT_NAME = "kv-events", "kv-replay"
# The ZMQ topic; the router matches the first frame against it exactly.
TOPIC = "kv"


def chosen(spec: PDDeploymentSpec) -> bool:
    """Whether the prefill pods are routed by KV events (the CRD allows kv_aware only as
    spec.router.prefillPolicy, and only for vLLM)."""
    return spec.router.enabled and spec.router.prefillPolicy == KV_AWARE


def verdict(spec: PDDeploymentSpec, wiring: Version) -> TierVerdict:
    """Whether the prefill engines publish the events the router routes by, in words."""
    if wiring < KV_EVENT_SOURCES_SINCE:
        return TierVerdict(
            False,
            f"vLLM {wiring} serves no /kv_event_sources and publishes events vllm-router "
            "cannot read: the router sends each prefill request to the least loaded pod; "
            f"run vLLM {KV_EVENT_SOURCES_SINCE} or later, or choose cache_aware",
        )
    if spec.prefill.nodesPerInstance > 1:
        return TierVerdict(
            False,
            "a prefill instance spans several pods, whose ranks the router cannot subscribe "
            "to: the router sends each prefill request to the least loaded pod; choose "
            "cache_aware for multi-node prefill",
        )
    return TierVerdict(
        True,
        "each prefill engine publishes its KV events on port "
        f"{EVENTS_PORT} (replay {REPLAY_PORT}), and the router sends each request to the "
        "prefill with the least left to compute: its queued prompt tokens plus those of the "
        "request it does not hold",
    )


def events_config() -> str:
    """``--kv-events-config``: a ZMQ publisher bound on every address (vLLM binds only a
    wildcard endpoint and connects to any other), with a replay endpoint; vLLM offsets both
    ports per data-parallel engine itself."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{EVENTS_PORT}",
        "replay_endpoint": f"tcp://*:{REPLAY_PORT}",
        "topic": TOPIC,
    }
    return json.dumps(config, separators=(",", ":"))


def launch_args() -> tuple[str, ...]:
    return (KV_EVENTS_CONFIG, events_config())


def launch_env() -> tuple[EnvEntry, ...]:
    return (env_value(DEV_MODE_ENV, "1"),)


def ports(engines_per_pod: int) -> tuple[EnginePort, ...]:
    """Each engine's publisher and replay port: the router connects to both."""
    return tuple(
        EnginePort(_name(base_name, i), base + i)
        for base_name, base in ((EVENTS_PORT_NAME, EVENTS_PORT), (REPLAY_PORT_NAME, REPLAY_PORT))
        for i in range(engines_per_pod)
    )


def _name(base: str, index: int) -> str:
    """`kv-events`, `kv-events-1`, ...: container port names (15 characters at most)."""
    return base if index == 0 else f"{base}-{index}"
