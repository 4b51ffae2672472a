"""The KV path between a prefill pod and a decode pod on one GPU machine: what the operator's
check reports for what it renders, and what each lane reaches.

Two steps, because the GPU machine has no Kubernetes libraries:

    # here: the preflight container of each engine's 70B deployment, as the operator renders it
    python bench/kv_boundary.py render --out rendered.json
    # on the GPU machine (NIXL wheels on PYTHONPATH, operator/ too)
    python bench/kv_boundary.py run --rendered rendered.json --out DIR
    # here: the status the operator writes for each rendered case's result, and a table
    python bench/kv_boundary.py status --results DIR/kv-boundary.json
    python bench/kv_boundary.py summary --results DIR/kv-boundary.json

`run` does, for each rendered case, what that preflight does (``pdd_node.kv_path``: the
engine's direction, its descriptor size, the peer beyond a pod boundary of its own), and then
a matrix of lanes: peer beyond a pod boundary, in the host's PID namespace with its own IPC
namespace (hostPID), in the host's PID and IPC namespaces (hostPID and hostIPC), or in the same
namespaces, READ and WRITE, at the 70B descriptors of TP 8 (8 KiB) and
TP 1 (64 KiB; 16-token vLLM blocks), 512 KiB (128-token blocks) and 16 MiB, with UCX's own
protocol table for the lane, and SGLang's 2 KiB (one token's K or V of one layer). Every
byte is verified.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

KIB, MIB = 1 << 10, 1 << 20
MATRIX_SIZES = [2 * KIB, 8 * KIB, 64 * KIB, 512 * KIB, 16 * MIB]
# The env the check reads from the rendered preflight container.
CHECK_ENV = ("UCX_TLS", "NIXL_UCX_SGL_ENABLE", "PDD_KV_OPERATION", "PDD_KV_PEER_BOUNDARY",
             "PDD_KV_DESCRIPTOR_BYTES", "UCX_IB_GPU_DIRECT_RDMA",
             "UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "PDD_KV_NIXL_THREADS",
             "PDD_KV_NIXL_SPLIT_BATCH")  # fmt: skip


# The rendered cases: each engine at its current release with the operator's defaults, as
# separate pods and with both roles in the host's PID namespace (and IPC namespace: the
# same-node lane an admin may opt into), 70B at TP 1 and TP 8 (one rank pair measured: each
# rank of a TP 8 instance moves its own share to its peer, on its own GPU).
RENDERED = {
    f"{engine}-tp{tp}{'-' + lane if lane else ''}": (engine, host, tp)
    for engine in ("vllm", "sglang")
    for tp in (1, 8)
    for lane, host in (
        ("", ()),
        ("hostpid", ("hostPID",)),
        ("hostpid-hostipc", ("hostPID", "hostIPC")),
    )
}
IMAGES = {"vllm": "vllm/vllm-openai:v0.33.0", "sglang": "lmsysorg/sglang:v0.5.23"}


def deployment(engine: str, host: tuple[str, ...] = (), tp: int = 1) -> dict[str, Any]:
    """A 70B deployment on one node without RDMA, ``tp`` GPUs per instance: the README's
    same-node shape, with the operator's defaults for everything else; ``host``: the host
    namespaces both roles' podTemplates join."""
    image = IMAGES[engine]
    template = {"podTemplate": {"spec": dict.fromkeys(host, True)}} if host else {}
    return {
        "apiVersion": "pdd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": f"llama-70b-{engine}", "namespace": "default"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "servedName": "llama-70b"},
            "engine": {"type": engine, "image": image},
            "prefill": {"replicas": 1, "gpusPerInstance": tp, **template},
            "decode": {"replicas": 1, "gpusPerInstance": tp, **template},
        },
    }


def render(out: Path) -> None:
    from pdd_operator.offline import render_documents

    cases = []
    for name, (engine, host, tp) in RENDERED.items():
        (rendered,) = render_documents([deployment(engine, host, tp)])
        sts = next(
            c
            for c in rendered.children
            if c["kind"] == "StatefulSet" and c["metadata"]["name"].endswith("-prefill")
        )
        (preflight,) = sts["spec"]["template"]["spec"]["initContainers"]
        env = {e["name"]: e["value"] for e in preflight["env"] if "value" in e}
        cases.append(
            {
                "case": name,
                "engine": engine,
                "deployment": deployment(engine, host, tp),
                "env": {k: v for k, v in env.items() if k in CHECK_ENV},
            }
        )
    out.write_text(json.dumps(cases, indent=1))
    print(json.dumps(cases, indent=1))


def run(
    rendered: Path, out: Path, only: set[str], sizes: list[int] = MATRIX_SIZES,
    matrix: str = "lanes",
) -> None:  # fmt: skip
    from pdd_node.kv_path import KvPathRequest, check_kv_path
    from pdd_probe.probe import ProbeSpec, run_local_probe

    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="ucx-proto-"))
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    cases = json.loads(rendered.read_text())
    report["rendered"] = []
    for case in cases:
        name = case.get("case", case["engine"])
        if only and f"rendered-{name}" not in only:
            continue
        env = {**os.environ, **case["env"], "PDD_PROBE_KEEP_UCX_LOG": str(logs / name)}
        request = KvPathRequest(
            gpus=1,
            descriptor_bytes=int(case["env"].get("PDD_KV_DESCRIPTOR_BYTES", "0")),
            operation=case["env"]["PDD_KV_OPERATION"],
            peer_boundary=case["env"]["PDD_KV_PEER_BOUNDARY"],
            nixl_threads=int(case["env"].get("PDD_KV_NIXL_THREADS", "0")),
            nixl_split_batch=int(case["env"].get("PDD_KV_NIXL_SPLIT_BATCH", "0")),
        )
        result = check_kv_path(request, env, out / f"check-{name}.json")
        report["rendered"].append({**case, "result": result.to_dict()})
        _line(f"rendered {name}", result.to_dict())
    base_env = dict(cases[0]["env"])
    report["matrix"] = []
    for row in _matrix() if matrix == "lanes" else _engine_matrix():
        name = row["name"]
        if only and name not in only:
            continue
        env = {**os.environ, "UCX_TLS": base_env["UCX_TLS"], "NIXL_UCX_SGL_ENABLE": "y",
               **row["env"], "PDD_PROBE_KEEP_UCX_LOG": str(logs / name)}  # fmt: skip
        spec = ProbeSpec(
            src_mem="VRAM", dst_mem="VRAM", block_sizes=sizes, bytes_per_size=64 * MIB,
            iterations=3, concurrency=row["concurrency"], nixl_threads=row["threads"],
            nixl_split_batch=row["split"], timeout_s=300, operation=row["operation"],
            peer_boundary=row["boundary"],
        )  # fmt: skip
        t0 = time.perf_counter()
        result = run_local_probe(spec, env=env).to_dict()
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        report["matrix"].append({**row, "result": result})
        _line(name, result)
    (out / "kv-boundary.json").write_text(json.dumps(report, indent=1))
    with tarfile.open(out / "ucx-proto.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="ucx-proto")


def _matrix() -> list[dict[str, Any]]:
    """Each lane: the peer beyond a pod boundary or not, each direction; then the settings
    that move WRITE's small descriptors (scatter-gather offload off, NIXL's thread pool)."""
    rows = []
    for boundary in ("pod", "none"):
        for operation in ("READ", "WRITE"):
            for concurrency in (8, 1):
                rows.append(_row(f"{boundary}-{operation}-c{concurrency}", boundary, operation,
                                 concurrency=concurrency))  # fmt: skip
    no_sgl = {"NIXL_UCX_SGL_ENABLE": "n"}
    for concurrency in (8, 1):
        rows.append(_row(f"pod-WRITE-c{concurrency}-sgl-off", "pod", "WRITE", env=no_sgl,
                         concurrency=concurrency))  # fmt: skip
    rows.append(_row("none-WRITE-c8-sgl-off", "none", "WRITE", env=no_sgl))
    rows.append(_row("none-WRITE-c8-threads4", "none", "WRITE", threads=4))
    # Two pods in the host's PID namespace (hostPID), each with its own IPC namespace, and
    # with the host's IPC namespace too (hostIPC): which same-node lanes each leaves.
    for boundary in ("host-pid", "host-pid-ipc"):
        for operation in ("READ", "WRITE"):
            rows.append(_row(f"{boundary}-{operation}-c8", boundary, operation))
        rows.append(_row(f"{boundary}-WRITE-c8-threads4", boundary, "WRITE", threads=4))
    rows.append(_row("host-pid-ipc-WRITE-c1", "host-pid-ipc", "WRITE", concurrency=1))
    # UCX turns cuda_ipc's zero-copy get off on a GPU without active NVLinks ("auto",
    # uct/cuda/cuda_ipc/cuda_ipc_iface.c); forced on, does READ (vLLM's pull) leave emulation
    # where the PID namespace is shared, and does it cross a pod boundary (it should not)?
    get_zcopy = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    for boundary in ("host-pid", "none", "pod"):
        rows.append(_row(f"{boundary}-READ-c8-getzcopy", boundary, "READ", env=get_zcopy))
    rows.append(_row("host-pid-READ-c8-threads4-getzcopy", "host-pid", "READ", threads=4,
                     env=get_zcopy))  # fmt: skip
    return rows


def _engine_matrix() -> list[dict[str, Any]]:
    """Each engine's own NIXL pattern between two pods that share the host's PID and IPC
    namespaces (hostPID and hostIPC on both roles; what two containers of one pod with
    shareProcessNamespace share too): one request in flight as one prompt's transfer is, and
    with four (several prompts at once), NIXL's thread pool as each engine configures it and
    NIXL's own split of a request between the threads (neither engine sets it).

    vLLM 0.33's NixlConnector READs with ``num_threads`` 4 (``kv_connector_extra_config``,
    ``nixl/base_worker.py``); its NixlPushConnector WRITEs with the same agent. SGLang 0.5.23's
    prefill WRITEs with 8 threads (``disaggregation/nixl/conn.py``), with NIXL's
    scatter-gather offload as the operator renders it and without."""
    get_zcopy = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    no_sgl = {"NIXL_UCX_SGL_ENABLE": "n"}
    boundary = "host-pid-ipc"
    rows = [_row("vllm-READ-t4-c1", boundary, "READ", concurrency=1, threads=4, split=0,
                 env=get_zcopy),
            _row("vllm-READ-t4-c4", boundary, "READ", concurrency=4, threads=4, split=0,
                 env=get_zcopy),
            _row("vllm-READ-t4-c1-split1", boundary, "READ", concurrency=1, threads=4,
                 env=get_zcopy),
            _row("vllm-push-WRITE-t4-c1", boundary, "WRITE", concurrency=1, threads=4, split=0),
            _row("sglang-WRITE-t8-c1", boundary, "WRITE", concurrency=1, threads=8, split=0),
            _row("sglang-WRITE-t8-c4", boundary, "WRITE", concurrency=4, threads=8, split=0),
            _row("sglang-WRITE-t8-c1-sgl-off", boundary, "WRITE", concurrency=1, threads=8,
                 split=0, env=no_sgl),
            # What SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS could change: NIXL's split.
            _row("sglang-WRITE-t8-c1-split1", boundary, "WRITE", concurrency=1, threads=8),
            _row("vllm-push-WRITE-t4-c1-hostpid", "host-pid", "WRITE", concurrency=1, threads=4,
                 split=0),
            _row("vllm-READ-t4-c1-pod", "pod", "READ", concurrency=1, threads=4, split=0,
                 env=get_zcopy)]  # fmt: skip
    return rows


def _row(
    name: str, boundary: str, operation: str, *, concurrency: int = 8, threads: int = 0,
    split: int = 1, env: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {"name": name, "boundary": boundary, "operation": operation,
            "concurrency": concurrency, "threads": threads, "split": split,
            "env": env or {}}  # fmt: skip


def _line(name: str, r: dict[str, Any]) -> None:
    sizes = {b["block_size"]: b["gbps"] for b in r.get("per_block_size") or []}
    print(
        f"{name}: {r.get('operation')} boundary={r.get('peer_boundary')} "
        f"transport={r.get('transport')} lanes={r.get('lanes')} emulated={r.get('emulated')} "
        f"verified={r.get('verified')} gbps={r.get('gbps')} per-size={sizes} "
        f"error={(r.get('error') or '')[:300]}",
        flush=True,
    )


def status(results: Path) -> None:
    """The status.transfer and KVTransferVerified the operator computes from each rendered
    case's result (the prober pod's answer), as `kubectl get pdd -o yaml` would show it."""
    from pdd_operator.api.v1alpha1 import PDDeployment
    from pdd_operator.status.observe import PodSummary
    from pdd_operator.status.transfer import transfer_outcome

    report = _load(results)
    for case in report["rendered"]:
        body = case["deployment"]
        meta = {**body["metadata"], "uid": "bench", "generation": 1}
        pdd = PDDeployment.from_body({**body, "metadata": meta})
        name = case["deployment"]["metadata"]["name"]
        prober = PodSummary(
            name=f"{name}-prefill-0", uid="", role="prefill", node="", ready=True, revision="",
            problem=None, probe_result=case["result"],
        )  # fmt: skip
        outcome = transfer_outcome(pdd, prober)
        assert outcome is not None
        label = case.get("case", case["engine"])
        print(f"--- {label}: KVTransferVerified={outcome.ok} reason={outcome.reason}")
        print(json.dumps(outcome.status.model_dump(exclude={"ranks"}), indent=1))


def summary(results: Path) -> None:
    """The results as a Markdown table: one row per case, GB/s per descriptor size."""
    report = _load(results)
    cases = [*report["rendered"], *report["matrix"]]
    sizes = sorted(
        {b["block_size"] for c in cases for b in c["result"].get("per_block_size") or []}
    )
    head = "| case | direction | peer | lane (UCX) | emulated | " + " | ".join(
        _size(n) for n in sizes
    )
    print(head + " | verified / error |")
    print("|" + "---|" * (6 + len(sizes)))
    rows = [(f"rendered {c.get('case', c['engine'])}", c["result"]) for c in report["rendered"]]
    rows += [(m["name"], m["result"]) for m in report["matrix"]]
    for name, r in rows:
        per = {b["block_size"]: b["gbps"] for b in r.get("per_block_size") or []}
        cells = " | ".join(f"{per[n]:g}" if n in per else "" for n in sizes)
        verdict = "yes" if r.get("verified") else (r.get("error") or "no").split(";")[0]
        lanes = ", ".join(r.get("lanes") or []) or "-"
        print(f"| {name} | {r.get('operation')} | {r.get('peer_boundary') or '?'} | {lanes} | "
              f"{'yes' if r.get('emulated') else 'no'} | {cells} | {verdict} |")  # fmt: skip


def _load(results: Path) -> dict[str, Any]:
    """A run's kv-boundary.json, or the .json.gz it is kept as under bench/results."""
    raw = results.read_bytes()
    loaded: dict[str, Any] = json.loads(gzip.decompress(raw) if results.suffix == ".gz" else raw)
    return loaded


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("render").add_argument("--out", type=Path, required=True)
    run_args = sub.add_parser("run")
    run_args.add_argument("--rendered", type=Path, required=True)
    run_args.add_argument("--out", type=Path, required=True)
    run_args.add_argument("--only", default="", help="comma-separated case names (default: all)")
    run_args.add_argument(
        "--sizes", default="", help="the matrix's descriptor sizes in KiB, comma-separated"
    )
    run_args.add_argument(
        "--matrix", choices=("lanes", "engines"), default="lanes",
        help="lanes: each lane and direction; engines: each engine's own NIXL pattern",
    )  # fmt: skip
    sub.add_parser("status").add_argument("--results", type=Path, required=True)
    sub.add_parser("summary").add_argument("--results", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "render":
        render(args.out)
    elif args.command == "run":
        sizes = [int(k) * KIB for k in args.sizes.split(",") if k] or MATRIX_SIZES
        only = set(filter(None, args.only.split(",")))
        run(args.rendered, args.out, only, sizes, args.matrix)
    elif args.command == "status":
        status(args.results)
    else:
        summary(args.results)


if __name__ == "__main__":
    main()
