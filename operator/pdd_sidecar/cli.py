"""``pdd-sidecar``: serve | probe. (The preflight and the node agent are ``pdd-node``'s.)

Every ``serve`` flag has an environment variable (the operator renders env, not args), and
the pod identity comes from the downward API (POD_NAME, POD_UID, POD_IP, POD_NAMESPACE).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from pdd_contract.env import (
    NIXL_ETCD_ENDPOINTS,
    NIXL_ETCD_NAMESPACE,
    PDD_DECODE_SERVICE,
    PDD_DEPLOYMENT,
    PDD_PREFILL_SERVICE,
    PDD_PROBER_POD,
    PDD_REVISION,
    PDD_ROLE,
    PDD_SIDE_CHANNEL,
    PDD_SIDE_CHANNEL_PORTS,
    PDD_SIDE_CHANNEL_RANK_PORTS,
    PDD_SIDE_CHANNEL_ROLES,
    PDD_SIDECAR_TOKEN_FILE,
    PDD_SIDECAR_URL,
    POD_IP,
    POD_NAME,
    POD_UID,
)
from pdd_contract.paths import TOKEN_FILE
from pdd_contract.ports import (
    NO_SIDE_CHANNEL,
    SGLANG_BOOTSTRAP_PORT,
    VLLM_SIDE_CHANNEL_BASE_PORT,
    default_side_channel_ports,
    parse_rank_ports,
)
from pdd_probe.probe import (
    DEFAULT_BLOCK_SIZES,
    MEMORY_KINDS,
    ProbeSpec,
    classify_probe,
    run_local_probe,
)
from pdd_sidecar.config import (
    DEFAULT_PORT,
    ROLES,
    EtcdSettings,
    Identity,
    SidecarConfig,
)
from pdd_sidecar.etcd_mode import DEFAULT_NAMESPACE
from pdd_sidecar.peers import (
    AddressMap,
    FilePeerSource,
    PeerSource,
    PodPeerSource,
    StaticPeerSource,
)
from pdd_sidecar.reachability import side_channel_for
from pdd_sidecar.token import TokenFile


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parsed = _parser().parse_args(args)
    logging.basicConfig(
        level=getattr(logging, parsed.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(parsed.func(parsed))


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _env_num(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value else default


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdd-sidecar", description=__doc__)
    parser.add_argument("--log-level", default=_env("PDD_LOG_LEVEL", "info"))
    commands = parser.add_subparsers(dest="command", required=True)
    _add_serve(commands.add_parser("serve", help="run the sidecar HTTP server"))
    _add_probe(commands.add_parser("probe", help="run the NIXL transfer probe"))
    return parser


def _add_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=_env("PDD_SIDECAR_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(_env_num("PDD_SIDECAR_PORT", DEFAULT_PORT)))
    p.add_argument("--unix-socket", default=_env("PDD_SIDECAR_UNIX_SOCKET"))
    p.add_argument("--token-file", default=_env(PDD_SIDECAR_TOKEN_FILE, TOKEN_FILE))
    p.add_argument("--role", choices=ROLES, default=_env(PDD_ROLE))
    p.add_argument("--deployment", default=_env(PDD_DEPLOYMENT, ""))
    p.add_argument("--namespace", default=_env("POD_NAMESPACE", "default"))
    p.add_argument("--pod-name", default=_env(POD_NAME, ""))
    p.add_argument("--pod-uid", default=_env(POD_UID, ""))
    p.add_argument("--pod-ip", default=_env(POD_IP, ""))
    p.add_argument(
        "--revision",
        default=_env(PDD_REVISION, ""),
        help="this pod's engine revision (pdd.dev/revision); pair only with peers of the other "
        "role that report the same one. Empty: no filtering",
    )
    p.add_argument(
        "--exchange", choices=("sidecar", "etcd"), default=_env("PDD_EXCHANGE", "sidecar")
    )
    p.add_argument(
        "--peer-source",
        default=_env("PDD_PEER_SOURCE", "k8s"),
        help="k8s | static:ROLE=HOST:PORT,... | file:PATH (JSON list of endpoints)",
    )
    p.add_argument(
        "--peer-address-map",
        default=_env("PDD_PEER_ADDRESS_MAP", ""),
        help="POD_IP=ADDRESS or CIDR=CIDR (same prefix length, host bits kept), comma-"
        "separated: what to dial instead of pod IPs (local clusters)",
    )
    p.add_argument("--prefill-service", default=_env(PDD_PREFILL_SERVICE))
    p.add_argument("--decode-service", default=_env(PDD_DECODE_SERVICE))
    p.add_argument("--etcd-endpoints", default=_env(NIXL_ETCD_ENDPOINTS, ""))
    p.add_argument("--etcd-namespace", default=_env(NIXL_ETCD_NAMESPACE, DEFAULT_NAMESPACE))
    p.add_argument(
        "--side-channel",
        default=_env(PDD_SIDE_CHANNEL, NO_SIDE_CHANNEL),
        help=f"the engine side channel to check: vllm, sglang, another name with "
        f"--side-channel-roles, or {NO_SIDE_CHANNEL}",
    )
    base = VLLM_SIDE_CHANNEL_BASE_PORT
    p.add_argument(
        "--side-channel-ports",
        default=_env(PDD_SIDE_CHANNEL_PORTS, ""),
        help=f"comma-separated; default {base}..{base}+dp-1 (vllm) or {SGLANG_BOOTSTRAP_PORT} "
        "(sglang)",
    )
    p.add_argument(
        "--side-channel-roles",
        default=_env(PDD_SIDE_CHANNEL_ROLES, ""),
        help="comma-separated roles whose pods serve the side channel; default: prefill,decode "
        "(vllm) or prefill (sglang)",
    )
    p.add_argument(
        "--side-channel-rank-ports",
        default=_env(PDD_SIDE_CHANNEL_RANK_PORTS, ""),
        help="the ports per rank of the roles whose pods do not all listen on "
        '--side-channel-ports (instances over several nodes), e.g. {"prefill": [[5600], [5601]]}',
    )
    p.add_argument("--vllm-dp-size", type=int, default=int(_env_num("PDD_VLLM_DP_SIZE", 1)))
    p.add_argument(
        "--peer-grace-seconds",
        type=float,
        default=_env_num("PDD_PEER_GRACE_SECONDS", 15),
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=_env_num("PDD_SIDECAR_DRAIN_SECONDS", 55),
        help="after SIGTERM, serve while the engine still has agents published, at most this "
        "long (the pod's grace period ends it anyway)",
    )
    p.add_argument("--resync-seconds", type=float, default=_env_num("PDD_RESYNC_SECONDS", 10))
    p.add_argument(
        "--reachability-interval-seconds",
        type=float,
        default=_env_num("PDD_REACHABILITY_INTERVAL_SECONDS", 10),
    )
    p.add_argument(
        "--prober-pod",
        default=_env(PDD_PROBER_POD, ""),
        help="the pod that answers the operator's probe requests; this one if the names match",
    )
    p.add_argument("--access-log", action="store_true")
    p.set_defaults(func=_serve)


def _add_probe(p: argparse.ArgumentParser) -> None:
    modes = p.add_subparsers(dest="probe_mode", required=True)
    loopback = modes.add_parser("loopback", help="target and initiator as two local processes")
    _add_spec_flags(loopback)
    loopback.set_defaults(func=_probe_loopback)
    run = modes.add_parser("run", help="ask the local sidecar to probe a peer pod")
    run.add_argument("--peer", required=True, help="peer pod name")
    run.add_argument("--url", default=_env(PDD_SIDECAR_URL, f"http://127.0.0.1:{DEFAULT_PORT}"))
    run.add_argument("--token-file", default=_env(PDD_SIDECAR_TOKEN_FILE, TOKEN_FILE))
    _add_spec_flags(run)
    run.set_defaults(func=_probe_run)
    classify = modes.add_parser("classify", help="verdict for a result JSON read from stdin")
    classify.add_argument("--expected-gbps", type=float, required=True)
    classify.add_argument("--min-fraction", type=float, default=0.8)
    classify.set_defaults(func=_probe_classify)


def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src-mem", choices=MEMORY_KINDS, default="auto")
    p.add_argument("--dst-mem", choices=MEMORY_KINDS, default="auto")
    p.add_argument("--block-sizes", default=",".join(str(s) for s in DEFAULT_BLOCK_SIZES))
    p.add_argument("--bytes-per-size", type=int, default=32 << 20)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--src-device", type=int, default=0)
    p.add_argument("--dst-device", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)


def _spec_from(args: argparse.Namespace) -> ProbeSpec:
    spec = ProbeSpec(
        src_mem=args.src_mem,
        dst_mem=args.dst_mem,
        block_sizes=[int(s) for s in args.block_sizes.split(",") if s],
        bytes_per_size=args.bytes_per_size,
        iterations=args.iterations,
        src_device=args.src_device,
        dst_device=args.dst_device,
        timeout_s=args.timeout,
    )
    spec.validate()
    return spec


def read_token(path: str) -> TokenFile:
    try:
        return TokenFile(path)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc


def build_config(args: argparse.Namespace) -> SidecarConfig:
    if not args.role:
        raise SystemExit(f"--role (or {PDD_ROLE}) is required: prefill or decode")
    identity = Identity(
        deployment=args.deployment,
        namespace=args.namespace,
        role=args.role,
        pod_name=args.pod_name or os.uname().nodename,
        pod_uid=args.pod_uid,
        pod_ip=args.pod_ip,
        revision=args.revision.strip(),
    )
    etcd = None
    if args.exchange == "etcd":
        endpoints = tuple(e.strip() for e in args.etcd_endpoints.split(",") if e.strip())
        if not endpoints:
            raise SystemExit(f"--exchange etcd needs --etcd-endpoints (or {NIXL_ETCD_ENDPOINTS})")
        etcd = EtcdSettings(endpoints, args.etcd_namespace)
    ports = tuple(int(p) for p in args.side_channel_ports.split(",") if p.strip())
    ports = ports or default_side_channel_ports(args.side_channel, args.vllm_dp_size)
    side_roles = tuple(r.strip() for r in args.side_channel_roles.split(",") if r.strip())
    if unknown := [r for r in side_roles if r not in ROLES]:
        raise SystemExit(f"--side-channel-roles: {', '.join(unknown)} is not prefill or decode")
    try:
        rank_ports = parse_rank_ports(args.side_channel_rank_ports or "{}")
    except ValueError as exc:
        raise SystemExit(f"--side-channel-rank-ports: {exc}") from exc
    try:
        side_channel_for(args.side_channel, args.role, ports, side_roles, rank_ports)
    except ValueError as exc:
        raise SystemExit(f"--side-channel: {exc}") from exc
    return SidecarConfig(
        identity=identity,
        token=read_token(args.token_file),
        exchange=args.exchange,
        host=args.host,
        port=args.port,
        unix_socket=args.unix_socket,
        etcd=etcd,
        side_channel=args.side_channel,
        side_channel_ports=ports,
        side_channel_roles=side_roles,
        side_channel_rank_ports=rank_ports,
        peer_grace_s=args.peer_grace_seconds,
        drain_s=args.drain_seconds,
        resync_s=args.resync_seconds,
        reachability_interval_s=args.reachability_interval_seconds,
        prober=bool(args.prober_pod) and args.prober_pod == identity.pod_name,
    )


def build_source(args: argparse.Namespace) -> PeerSource:
    spec: str = args.peer_source
    if spec.startswith("static:"):
        return StaticPeerSource.parse(spec.removeprefix("static:"))
    if spec.startswith("file:"):
        return FilePeerSource(spec.removeprefix("file:"))
    if spec == "k8s":
        workloads = {
            args.prefill_service or f"{args.deployment}-prefill": "prefill",
            args.decode_service or f"{args.deployment}-decode": "decode",
        }
        try:
            address_map = AddressMap.parse(args.peer_address_map)
        except ValueError as exc:
            raise SystemExit(f"--peer-address-map: {exc}") from exc
        return PodPeerSource(args.namespace, args.deployment, workloads, args.port, address_map)
    raise SystemExit(f"unknown --peer-source {spec!r}: k8s, static:... or file:...")


def _serve(args: argparse.Namespace) -> int:
    from pdd_sidecar.server import serve

    asyncio.run(serve(build_config(args), build_source(args), access_log=args.access_log))
    return 0


def _probe_loopback(args: argparse.Namespace) -> int:
    result = run_local_probe(_spec_from(args))
    print(json.dumps(result.to_dict(), indent=2))
    return 0 if result.verified and not result.error else 1


def _probe_run(args: argparse.Namespace) -> int:
    from pdd_sidecar.client import SidecarClient, SidecarError

    client = SidecarClient(args.url, token=read_token(args.token_file), timeout_s=args.timeout + 60)
    try:
        result = client.probe(args.peer, **_spec_from(args).to_dict())
    except (SidecarError, OSError) as exc:
        result = {"peer": args.peer, "verified": False, "error": str(exc)}
    print(json.dumps(result, indent=2))
    return 0 if result.get("verified") and not result.get("error") else 1


def _probe_classify(args: argparse.Namespace) -> int:
    ok, reason, message = classify_probe(
        json.load(sys.stdin), args.expected_gbps, args.min_fraction
    )
    print(json.dumps({"ok": ok, "reason": reason, "message": message}, ensure_ascii=False))
    return 0 if ok else 1
