#!/usr/bin/env bash
# The two-GPU NIXL measurements in docs/benchmarks.md, as run on the lent two-H200 machine
# (`nvidia-h200-x2`) from the repository root, with the NIXL wheels for its Python in .whl/:
#
#   OUT=/some/dir bash bench/nixl_two_gpu.sh            # every step
#   OUT=/some/dir STEPS="requests host" bash bench/nixl_two_gpu.sh
#
# Writes $OUT/nixl-two-gpu.tgz (every probe's JSON and table, UCX's protocol tables, the GPU
# topology) and prints the tables.
set -uo pipefail
OUT=${OUT:?set OUT to the output directory}
WORK=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:operator PYTHONUNBUFFERED=1
# The host's GPUs are shared: NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi topo -m >"$WORK/topology.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,clocks.max.mem --format=csv \
  >"$WORK/gpus.csv" 2>&1
STEPS=${STEPS:-requests threads large host engine sgl sglarge check preflight reqprobe request}
probe() { # name, then nixl_probe.py arguments
  local name=$1; shift
  [[ " $STEPS " == *" $name "* ]] || return 0
  echo "== $name: $*"
  PDD_PROBE_KEEP_UCX_LOG="$WORK/$name/ucx" timeout 420 python3 bench/nixl_probe.py \
    --out "$WORK/$name" --src-device 0 --dst-device 1 --timeout 120 "$@"
  echo "== $name rc=$?"
}
# 1. GPU0 -> GPU1 over the curve of block sizes, 1 to 16 requests in flight.
probe requests --paths VRAM-VRAM --concurrency 1,4,8,16 --bytes-per-size 268435456
# 2. NIXL's own UCX thread pool instead (one request, split over its threads).
probe threads --paths VRAM-VRAM --concurrency 1 --nixl-threads 4,8 --block-sizes 64K,1M,16M,64M
# 3. Large blocks, 2 GiB per size: what a whole prompt's KV moves.
probe large --paths VRAM-VRAM --concurrency 1,8 --block-sizes 16M,64M,256M \
  --bytes-per-size 2147483648 --iterations 5
# 4. Host memory <-> the other GPU: the baseline must be physically possible.
probe host --paths DRAM-VRAM,VRAM-DRAM --concurrency 1 --block-sizes 1M,16M \
  --bytes-per-size 67108864 --iterations 2
# 5. The engines' own descriptor sizes (pdd_operator.planning.kv_layout, Llama-3.1-70B): SGLang
#    page 1 TP 1, vLLM block 16 TP 8 and TP 1, vLLM block 128 TP 1.
probe engine --paths VRAM-VRAM --concurrency 1,8 --nixl-threads 0,8 --block-sizes 2K,8K,64K,512K \
  --bytes-per-size 67108864 --iterations 5
# 6. The same with NIXL's UCX scatter-gather offload (cuMemcpyBatchAsync), where built in.
NIXL_UCX_SGL_ENABLE=y probe sgl --paths VRAM-VRAM --concurrency 8 --block-sizes 8K,64K \
  --bytes-per-size 67108864 --iterations 5
# 7. The offload at large blocks too (the operator turns it on by default).
NIXL_UCX_SGL_ENABLE=y probe sglarge --paths VRAM-VRAM --concurrency 1,8 \
  --block-sizes 64K,1M,16M,64M --bytes-per-size 268435456 --iterations 5
# 8. The preflight's KV-path check with this machine's devices: two GPUs, then one.
if [[ " $STEPS " == *" check "* ]]; then
  mkdir -p "$WORK/check"
  python3 -m pdd_probe.device_check --gpus 2 --descriptor-bytes 65536 >"$WORK/check/two-gpus.json"
  echo "== check two-gpus rc=$?"
  CUDA_VISIBLE_DEVICES=0 python3 -m pdd_probe.device_check --gpus 1 --descriptor-bytes 65536 \
    >"$WORK/check/one-gpu.json"
  echo "== check one-gpu rc=$?"
fi
# 9. The preflight init container as the operator renders it (PDD_VERIFY_TRANSFER, the
#    engine's descriptor size, the scatter-gather offload), on this machine's real topology.
if [[ " $STEPS " == *" preflight "* ]]; then
  mkdir -p "$WORK/preflight"
  PDD_VERIFY_TRANSFER=true PDD_KV_DESCRIPTOR_BYTES=65536 NIXL_UCX_SGL_ENABLE=y \
    python3 -m pdd_node preflight --env-file "$WORK/preflight/transfer.env" \
    --termination-log "$WORK/preflight/termination-log" \
    --kv-path-file "$WORK/preflight/kv-path.json" >"$WORK/preflight/log.txt" 2>&1
  echo "== preflight rc=$?"
  cat "$WORK/preflight/log.txt"
fi
# 10. One request's KV through the request path: the real vllm-router, reference engines (the
#     test double of vLLM) with Llama-3.1-70B's KV in GPU memory, prefill GPU 0 -> decode GPU 1,
#     4,096 tokens = 1,342,177,280 B; beside the probe of the same bytes at the same block size
#     (16 tokens = 5 MiB), whose contiguous copy is the link time.
NIXL_UCX_SGL_ENABLE=y probe reqprobe --paths VRAM-VRAM --concurrency 1 --block-sizes 5M \
  --bytes-per-size 1342177280 --iterations 5
if [[ " $STEPS " == *" request "* ]]; then
  timeout 420 python3 bench/request_kv_two_gpu.py --out "$WORK/request" --tokens 4096 --requests 10
  echo "== request rc=$?"
  for f in "$WORK"/request/*.log; do echo "-- $f"; tail -5 "$f"; done
fi
tar czf "$OUT/nixl-two-gpu.tgz" -C "$WORK" .
