"""One request's KV through the request path, prefill on GPU 0 and decode on GPU 1.

Starts what a 1-prefill/1-decode PDDeployment runs, as local processes on loopback: two pdd
sidecars (static peers), two reference engines (the test double of vLLM: no model, but the KV
bytes of the model it is told to serve, here Llama-3.1-70B at 327,680 B per token, in GPU
memory) and the real vllm-router in PD mode with the NIXL connector. Then sends completions with
a prompt of --tokens tokens through the router. The decode pulls the prompt's KV from the
prefill's GPU with NIXL (READ, as vLLM's NixlConnector does), checks every byte, and reports the
transfer time in the answer (``pdd_refengine.kv_seconds``).

    python3 bench/request_kv_two_gpu.py --out DIR [--tokens 4096] [--requests 10]

Writes DIR/request-kv.json: per request the end-to-end seconds, KV bytes, KV seconds and GB/s.
Run it on a machine with two GPUs (bench/nixl_two_gpu.sh step `request` does, beside a probe of
the same bytes and block size, whose contiguous copy is the link time).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
TOKEN = "bench-request-kv"
HOSTS = {"prefill": "127.0.0.11", "decode": "127.0.0.12"}
GPU = {"prefill": "0", "decode": "1"}
SIDECAR_PORT, ENGINE_PORT, SIDE_CHANNEL_PORT = 8099, 8000, 5600
ROUTER = ("127.0.0.1", 30080, 29080)
BYTES_PER_CHAR_TOKEN = 4  # the reference engine cuts a text prompt into 4-byte tokens


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--region-bytes", type=int, default=3 << 30)
    parser.add_argument("--memory", choices=("vram", "dram"), default="vram", help="dram: no GPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        results = run(args, procs)
    finally:
        for proc in reversed(procs):
            stop(proc)
    (args.out / "request-kv.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results["summary"], indent=1))
    return 0 if results["summary"]["succeeded"] == args.requests else 1


def run(args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    token_file = args.out / "token"
    token_file.write_text(TOKEN + "\n")
    for role, host in HOSTS.items():
        other = "decode" if role == "prefill" else "prefill"
        peers = f"{other}={HOSTS[other]}:{SIDECAR_PORT}"
        procs.append(sidecar(role, host, peers, token_file, args))
    for role, host in HOSTS.items():
        procs.append(engine(role, host, token_file, args))
    for role, host in HOSTS.items():
        wait_ok(f"http://{host}:{ENGINE_PORT}/health", 300, f"{role} engine", procs)
    procs.append(router(args))
    url = f"http://{ROUTER[0]}:{ROUTER[1]}"
    wait_ok(f"{url}/readiness", 120, "vllm-router", procs)
    warmup = complete(url, prompt(args.tokens, -1))
    measured = [complete(url, prompt(args.tokens, i)) for i in range(args.requests)]
    return {"model": MODEL, "tokens": args.tokens, "memory": args.memory, "warmup": warmup,
            "requests": measured, "summary": summarize(measured),
            "router": router_version()}  # fmt: skip


def prompt(tokens: int, index: int) -> str:
    head = f"request {index}: "
    return (head + "x" * (tokens * BYTES_PER_CHAR_TOKEN))[: tokens * BYTES_PER_CHAR_TOKEN]


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    image = ROOT / "operator" / "pdd_refengine" / "image"
    # The image's `vllm` first, then this interpreter's directory (its python3 runs the engine).
    python_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([str(image / "bin"), python_dir, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(image / "python")])
    env.update(extra)
    return env


def sidecar(role: str, host: str, peers: str, token_file: Path, args: argparse.Namespace) -> Any:
    argv = [sys.executable, "-m", "pdd_sidecar", "serve", "--host", host, "--port",
            str(SIDECAR_PORT), "--pod-ip", host, "--role", role, "--pod-name", f"{role}-0",
            "--pod-uid", f"uid-{role}", "--deployment", "bench", "--namespace", "bench",
            "--token-file", str(token_file), "--peer-source", f"static:{peers}"]  # fmt: skip
    return spawn(f"sidecar-{role}", argv, base_env(), args.out)


def engine(role: str, host: str, token_file: Path, args: argparse.Namespace) -> Any:
    # The command line the operator renders for vLLM (kv_both; the router's params decide).
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"pdd_role": role}}  # fmt: skip
    argv = ["vllm", "serve", MODEL, "--host", host, "--port", str(ENGINE_PORT),
            "--kv-transfer-config", json.dumps(config),
            "--served-model-name", "llama-70b"]  # fmt: skip
    env = base_env(
        POD_NAME=f"{role}-0",
        PDD_SIDECAR_URL=f"http://{host}:{SIDECAR_PORT}",
        PDD_SIDECAR_TOKEN_FILE=str(token_file),
        VLLM_NIXL_SIDE_CHANNEL_HOST=host,
        VLLM_NIXL_SIDE_CHANNEL_PORT=str(SIDE_CHANNEL_PORT),
        CUDA_VISIBLE_DEVICES=GPU[role],
        PDD_REFENGINE_KV_MEMORY=args.memory,
        PDD_REFENGINE_KV_REGION_BYTES=str(args.region_bytes),
        PDD_REFENGINE_KV_TIMEOUT_S="120",
        NIXL_UCX_SGL_ENABLE="y",  # the operator's default (spec.kvTransfer.ucx.scatterGather)
    )
    return spawn(f"engine-{role}", argv, env, args.out)


def router(args: argparse.Namespace) -> Any:
    host, port, metrics = ROUTER
    # The console script may not be on PATH (pip --target); the module is the same router.
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--host", host, "--port",
            str(port), "--prometheus-host", host, "--prometheus-port", str(metrics),
            "--vllm-pd-disaggregation", "--prefill",
            f"http://{HOSTS['prefill']}:{ENGINE_PORT}", "--decode",
            f"http://{HOSTS['decode']}:{ENGINE_PORT}", "--kv-connector", "nixl",
            "--request-timeout-secs", "600", "--worker-startup-timeout-secs", "300"]  # fmt: skip
    return spawn("router", argv, base_env(), args.out)


def router_version() -> str:
    from importlib.metadata import version

    return f"vllm-router {version('vllm-router')}"


def spawn(name: str, argv: list[str], env: dict[str, str], out: Path) -> Any:
    log = open(out / f"{name}.log", "wb")  # noqa: SIM115 (kept open for the process's life)
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_ok(url: str, timeout: float, what: str, procs: list[Any]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise SystemExit(f"exited while waiting for {what}: {dead}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} not ready after {timeout:.0f}s ({url})")


def complete(url: str, text: str) -> dict[str, Any]:
    body = json.dumps({"model": "llama-70b", "prompt": text, "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            answer = json.loads(response.read())
    except (OSError, urllib.error.HTTPError) as err:
        return {"ok": False, "error": str(err), "seconds": time.monotonic() - started}
    served = answer.get("pdd_refengine") or {}
    kv_bytes, kv_seconds = served.get("kv_bytes", 0), served.get("kv_seconds", 0.0)
    return {
        "ok": bool(answer.get("choices")) and served.get("kv_verified") is True,
        "seconds": round(time.monotonic() - started, 4),
        "kv_bytes": kv_bytes,
        "kv_seconds": kv_seconds,
        "kv_gbps": round(kv_bytes / kv_seconds / 1e9, 2) if kv_seconds else None,
        "served": served,
        "text": answer["choices"][0]["text"] if answer.get("choices") else None,
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in results if r["ok"]]
    summary: dict[str, Any] = {"requests": len(results), "succeeded": len(good)}
    if good:
        seconds = [r["kv_seconds"] for r in good]
        summary |= {
            "kv_bytes": good[0]["kv_bytes"],
            "kv_seconds_median": statistics.median(seconds),
            "kv_seconds_min": min(seconds),
            "kv_gbps_median": round(good[0]["kv_bytes"] / statistics.median(seconds) / 1e9, 2),
            "end_to_end_seconds_median": statistics.median(r["seconds"] for r in good),
        }
    return summary


if __name__ == "__main__":
    sys.exit(main())
