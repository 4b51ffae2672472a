"""The two command lines the operator renders, parsed into one ``EngineConfig``.

vLLM: ``vllm serve MODEL --host H --port P --tensor-parallel-size N --kv-transfer-config JSON
[--served-model-name NAME] [--block-size N] [--enable-lora --lora-modules NAME=PATH ...]
[--kv-events-config JSON] [...]``;
the role, for the logs, is the config's ``kv_role`` (``kv_producer`` prefill, ``kv_consumer``
decode; either way each request's ``kv_transfer_params`` decide what it does), of the NIXL
connector itself or of a MultiConnector's NIXL child.

SGLang: ``sglang serve`` or ``python3 -m sglang.launch_server`` (the releases before 0.5.5),
then ``--model-path MODEL --host H --port P --tp N
--disaggregation-mode prefill|decode --disaggregation-transfer-backend nixl
--disaggregation-bootstrap-port B [--served-model-name NAME] [--page-size N] [--kv-cache-dtype D]
[--enable-lora] [--lora-paths NAME=PATH ...] [...]``. The image tag picks the protocol
generation each engine speaks (vLLM: ``kv_params``; SGLang: ``sglang_exchange``).

Flags the reference engine does not know (the user's own ``args``) are ignored with one warning:
a real engine would use them, a test double need not.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pdd_refengine.kv_params import Generation, protocol_generation
from pdd_refengine.layout import layout_for
from pdd_refengine.sglang_exchange import Generation as SglangGeneration
from pdd_refengine.sglang_exchange import protocol_generation as bootstrap_generation

# The image's tag (the local runtime sets it, as a build per tag would bake it in).
IMAGE_TAG_ENV = "PDD_REFENGINE_IMAGE_TAG"
REGION_BYTES_ENV = "PDD_REFENGINE_KV_REGION_BYTES"
MEMORY_ENV = "PDD_REFENGINE_KV_MEMORY"  # dram (default) | vram
DEFAULT_REGION_BYTES = 64 << 20
# Without PDD_REFENGINE_KV_REGION_BYTES the region holds at least this many blocks.
MIN_BLOCKS = 4
VLLM_BLOCK_TOKENS = 16  # vLLM's default --block-size
SGLANG_PAGE_TOKENS = 1  # SGLang's default --page-size
SGLANG_BOOTSTRAP_PORT = 8998


# vLLM's NIXL connectors and which way each moves the KV.
CONNECTORS = {"NixlConnector": "pull", "NixlPushConnector": "push"}


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class KvEventsConfig:
    """vLLM's ``--kv-events-config`` (0.33 ``vllm/config/kv_events.py``, ``KVEventsConfig``):
    where the engine publishes its prefix cache's KV events (``kv_events``)."""

    enable_kv_cache_events: bool = False
    # "null" | "zmq"; None (not given) is resolved per release by parse_args.
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def publishes(self) -> bool:
        """As vLLM's EventPublisherFactory: a ZMQ publisher only when both say so."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EngineConfig:
    engine: str  # "vllm" | "sglang"
    model: str
    served_name: str
    host: str
    port: int
    tp_size: int
    role: str  # "prefill" | "decode" | "both" (vLLM's kv_both: per request)
    block_tokens: int
    max_model_len: int | None = None
    bootstrap_port: int | None = None  # SGLang prefill: where decodes register their rooms
    region_bytes: int = DEFAULT_REGION_BYTES
    memory: str = "DRAM"  # DRAM | VRAM
    ignored: tuple[str, ...] = field(default=())
    # Which vLLM release's kv_transfer_params it speaks, from the image's tag (one image per
    # release, as vLLM's own): kv_params.protocol_generation.
    protocol: Generation = "0.11"
    # vLLM's connector: NixlConnector (the decode pulls: "pull") or NixlPushConnector (the
    # prefill pushes: "push", vllm_push).
    kv_mode: str = "pull"
    # Which SGLang release's bootstrap exchange it speaks, from the image's tag:
    # sglang_exchange.protocol_generation.
    bootstrap_protocol: SglangGeneration = "0.5.4"
    kv_cache_dtype: str = "auto"  # SGLang's --kv-cache-dtype: its decode refuses a mismatch
    # LoRA adapters by the name a request's `model` gives (vLLM's --lora-modules, SGLang's
    # --lora-paths), with the path each was given: served as the model itself (the double has
    # no weights to adapt), named in the answer and in /v1/models.
    adapters: tuple[tuple[str, str], ...] = ()
    kv_events: KvEventsConfig = KvEventsConfig()  # vLLM's --kv-events-config

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.served_name, *(name for name, _ in self.adapters))


def parse_args(argv: Sequence[str], environ: dict[str, str] | None = None) -> EngineConfig:
    """``argv`` starts with the engine: ``vllm serve ...`` or ``sglang ...``."""
    env = dict(os.environ if environ is None else environ)
    if not argv or argv[0] not in ("vllm", "sglang"):
        raise UsageError("usage: python -m pdd_refengine vllm serve MODEL ... | sglang ...")
    config = _parse_vllm(argv[1:]) if argv[0] == "vllm" else _parse_sglang(argv[1:])
    return _with_environment(config, env)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=False)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    return parser


def _parse_vllm(argv: Sequence[str]) -> EngineConfig:
    if not argv or argv[0] != "serve":
        raise UsageError("vllm: only `vllm serve MODEL ...` is supported")
    parser = _parser("vllm serve")
    parser.add_argument("model")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--kv-transfer-config", default=None)
    parser.add_argument("--block-size", type=int, default=VLLM_BLOCK_TOKENS)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-modules", nargs="+", default=[])
    parser.add_argument("--kv-events-config", default=None)
    known, unknown = _parse(parser, argv[1:])
    return EngineConfig(
        engine="vllm",
        model=known.model,
        served_name=_served_name(known.served_model_name, known.model),
        host=known.host,
        port=known.port,
        tp_size=known.tensor_parallel_size,
        role=_vllm_role(known.kv_transfer_config),
        kv_mode=_vllm_kv_mode(known.kv_transfer_config),
        block_tokens=known.block_size,
        max_model_len=known.max_model_len,
        adapters=_adapters("--lora-modules", known.lora_modules, known.enable_lora),
        kv_events=_kv_events(known.kv_events_config),
        ignored=tuple(unknown),
    )


def _kv_events(text: str | None) -> KvEventsConfig:
    """``--kv-events-config JSON``, checked as vLLM's config class checks it: known fields
    only, of the right types. An unset ``publisher`` stays None until the release is known
    (``_resolved_publisher``)."""
    if text is None:
        return KvEventsConfig()
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise UsageError("--kv-events-config must be a JSON object")
    unknown = sorted(set(given) - set(KvEventsConfig.__dataclass_fields__))
    if unknown:
        raise UsageError(f"--kv-events-config: unknown field(s) {', '.join(unknown)}")
    if given.get("publisher") not in (None, "null", "zmq"):
        raise UsageError(
            f'--kv-events-config: publisher must be "null" or "zmq", not {given["publisher"]!r}'
        )
    config = KvEventsConfig(**given)
    _check_kv_events_types(config)
    return config


def _check_kv_events_types(config: KvEventsConfig) -> None:
    expected: dict[str, tuple[type, ...]] = {
        "enable_kv_cache_events": (bool,),
        "endpoint": (str,),
        "replay_endpoint": (str, type(None)),
        "buffer_steps": (int,),
        "hwm": (int,),
        "max_queue_size": (int,),
        "topic": (str,),
    }
    for name, types in expected.items():
        value = getattr(config, name)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise UsageError(f"--kv-events-config: {name} has the wrong type ({value!r})")
    if config.buffer_steps < 1:
        raise UsageError("--kv-events-config: buffer_steps must be at least 1")


def _adapters(flag: str, entries: list[str], enabled: bool) -> tuple[tuple[str, str], ...]:
    """``name=path`` or JSON ``{"name"|"lora_name": ..., "path"|"lora_path": ...}`` entries,
    as vLLM's --lora-modules and SGLang's --lora-paths take them."""
    if entries and not enabled:
        raise UsageError(f"{flag} needs --enable-lora")
    adapters = []
    for entry in entries:
        if entry.startswith("{"):
            given = json.loads(entry)
            name, path = (
                given.get("name") or given["lora_name"],
                given.get("path") or given["lora_path"],
            )
        else:
            name, sep, path = entry.partition("=")
            if not sep:
                raise UsageError(f"{flag} {entry!r}: expected name=path")
        adapters.append((name, path))
    return tuple(adapters)


def _vllm_role(kv_transfer_config: str | None) -> str:
    if kv_transfer_config is None:
        return "both"
    config = _nixl_config(kv_transfer_config)
    if config.get("kv_connector") not in CONNECTORS:
        raise UsageError(
            "--kv-transfer-config: the reference engine speaks NixlConnector and "
            "NixlPushConnector only"
        )
    # vLLM's kv_role (vllm/config/kv_transfer.py): what the operator renders per role.
    roles = {"kv_producer": "prefill", "kv_consumer": "decode"}
    return roles.get(str(config.get("kv_role")), "both")


def _vllm_kv_mode(kv_transfer_config: str | None) -> str:
    if kv_transfer_config is None:
        return "pull"
    return CONNECTORS[_nixl_config(kv_transfer_config)["kv_connector"]]


def _nixl_config(kv_transfer_config: str) -> dict[str, Any]:
    """The config of the connector that moves KV between pods: the one given, or a
    MultiConnector's NIXL child (beside an offloading connector, which the double has no
    CPU tier for and leaves out)."""
    try:
        config = json.loads(kv_transfer_config)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kv-transfer-config is not JSON: {exc}") from None
    if config.get("kv_connector") != "MultiConnector":
        return dict(config)
    children = (config.get("kv_connector_extra_config") or {}).get("connectors") or []
    nixl = [c for c in children if c.get("kv_connector") in CONNECTORS]
    return dict(nixl[0]) if nixl else dict(config)


def _parse_sglang(argv: Sequence[str]) -> EngineConfig:
    parser = _parser("sglang.launch_server")
    parser.add_argument("--model-path", "--model", required=True)
    parser.add_argument("--tp", "--tp-size", type=int, default=1)
    parser.add_argument("--disaggregation-mode", default="null")
    parser.add_argument("--disaggregation-transfer-backend", default="nixl")
    parser.add_argument("--disaggregation-bootstrap-port", type=int, default=SGLANG_BOOTSTRAP_PORT)
    parser.add_argument("--page-size", type=int, default=SGLANG_PAGE_TOKENS)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-paths", nargs="*", default=[])
    # SGLang's switch for its /metrics, which the double always serves.
    parser.add_argument("--enable-metrics", action="store_true")
    known, unknown = _parse(parser, argv)
    if known.disaggregation_mode not in ("prefill", "decode"):
        raise UsageError("--disaggregation-mode must be prefill or decode")
    if known.disaggregation_transfer_backend != "nixl":
        raise UsageError("--disaggregation-transfer-backend: the reference engine speaks nixl")
    return EngineConfig(
        engine="sglang",
        model=known.model_path,
        served_name=_served_name(known.served_model_name, known.model_path),
        host=known.host,
        port=known.port,
        tp_size=known.tp,
        role=known.disaggregation_mode,
        block_tokens=known.page_size,
        max_model_len=known.max_model_len,
        bootstrap_port=known.disaggregation_bootstrap_port,
        kv_cache_dtype=known.kv_cache_dtype,
        # SGLang turns LoRA on for --lora-paths by itself (its help text).
        adapters=_adapters("--lora-paths", known.lora_paths, True),
        ignored=tuple(unknown),
    )


def _parse(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str]]:
    try:
        known, unknown = parser.parse_known_args(list(argv))
    except SystemExit:  # argparse exits on a missing or malformed argument
        raise UsageError(f"{parser.prog}: cannot parse {' '.join(argv)!r}") from None
    return known, unknown


def _served_name(names: list[str] | None, model: str) -> str:
    return names[0] if names else model


def default_region_bytes(config: EngineConfig) -> int:
    """64 MiB, or room for ``MIN_BLOCKS`` blocks where the model's blocks are larger (70B
    with the operator's 256-token blocks: 80 MiB each, whole-model KV)."""
    block = layout_for(config.model).bytes_per_token * max(1, config.block_tokens)
    return max(DEFAULT_REGION_BYTES, MIN_BLOCKS * block)


def _with_environment(config: EngineConfig, env: dict[str, str]) -> EngineConfig:
    region = int(env.get(REGION_BYTES_ENV) or default_region_bytes(config))
    memory = (env.get(MEMORY_ENV) or "dram").upper()
    if memory not in ("DRAM", "VRAM"):
        raise UsageError(f"{MEMORY_ENV} must be dram or vram, not {memory.lower()!r}")
    if config.block_tokens <= 0:
        raise UsageError("the block (page) size must be a positive number of tokens")
    tag = env.get(IMAGE_TAG_ENV, "")
    protocol = protocol_generation(tag)
    if config.kv_mode == "push" and protocol != "0.33":
        # As vLLM itself: no NixlPushConnector before 0.24 (the reference engine plays 0.33).
        raise UsageError(
            "--kv-transfer-config: NixlPushConnector needs vLLM 0.24 or later; this image "
            f"plays vLLM {protocol}"
        )
    return replace(
        config,
        region_bytes=region,
        memory=memory,
        protocol=protocol,
        bootstrap_protocol=bootstrap_generation(tag),
        kv_events=_resolved_publisher(config.kv_events, protocol),
    )


def _resolved_publisher(config: KvEventsConfig, protocol: Generation) -> KvEventsConfig:
    """An unset publisher: "zmq" when events are enabled from 0.33 on
    (``KVEventsConfig.__post_init__``); 0.11 defaults to "null" whatever the switch says
    (v0.11.0 ``vllm/config/kv_events.py``), so there events need ``"publisher": "zmq"``."""
    if config.publisher is not None:
        return config
    zmq = config.enable_kv_cache_events and protocol == "0.33"
    return replace(config, publisher="zmq" if zmq else "null")
