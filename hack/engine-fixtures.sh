#!/usr/bin/env bash
# Dump what each supported engine release's own argument parser accepts into
# tests/fixtures/engines/<engine>-<version>.json (hack/engine_parser_dump.py), for the unit
# tests that check every rendered engine command line against it. Not part of `make test`:
# vLLM's parser needs its full install (torch and the CUDA libraries, about 9 GB per release);
# SGLang's runs from its wheel without dependencies plus what its argument code imports.
#
#   hack/engine-fixtures.sh                  # every release in SUPPORTED below
#   hack/engine-fixtures.sh sglang 0.5.23    # one
#
# The environments are kept under $ENGINE_ENVS (default /tmp/pdd-engine-envs) for reruns.
set -euo pipefail
cd "$(dirname "$0")/.."

SUPPORTED=("vllm 0.11.0" "vllm 0.33.0" "sglang 0.5.4" "sglang 0.5.23")
ENVS=${ENGINE_ENVS:-/tmp/pdd-engine-envs}
PYTHON=${PYTHON:-python3}
# What sglang/srt/server_args.py imports, beyond the standard library, in 0.5.4 and 0.5.23
# (0.5.4 also needs the second line).
SGLANG_ARG_IMPORTS=(numpy orjson psutil pybase64 requests torch packaging pillow starlette
  msgspec pydantic pyzmq tqdm ipython aiohttp
  safetensors fastapi openai xgrammar partial_json_parser torchvision sentencepiece)

dump() {
  local engine=$1 version=$2 env="$ENVS/$1-$2"
  if [ ! -x "$env/bin/python" ]; then
    "$PYTHON" -m venv "$env"
    if [ "$engine" = vllm ]; then
      "$env/bin/pip" install -q "vllm==$version"
    else
      "$env/bin/pip" install -q --no-deps "sglang==$version"
      "$env/bin/pip" install -q "${SGLANG_ARG_IMPORTS[@]}"
    fi
  fi
  mkdir -p tests/fixtures/engines
    VLLM_TARGET_DEVICE=cpu "$env/bin/python" hack/engine_parser_dump.py "$engine" \
    "tests/fixtures/engines/$engine-$version.json" >"$env/dump.log" 2>&1
  echo "wrote tests/fixtures/engines/$engine-$version.json"
}

if [ $# -eq 2 ]; then
  dump "$1" "$2"
else
  for entry in "${SUPPORTED[@]}"; do
    # shellcheck disable=SC2086
    dump $entry
  done
fi
