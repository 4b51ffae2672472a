#!/usr/bin/env bash
# `make images`: builds every image target of the Dockerfile (operator, sidecar, router), tagged
# ghcr.io/pdd-dev/pdd-<target>:<the chart's appVersion>, with docker where it answers, else
# podman (installed from Debian's packages where it is missing and we are root); prints each
# image's size and what it holds.
#
# The base: the Dockerfile's pinned python image where the engine can pull it. Where it cannot
# (no Docker Hub from this machine), a base made from Debian's packages (mmdebstrap: python3
# and its venv module, bookworm like the pinned one) stands in; it trusts the CA bundle of the
# machine that builds it, so that pip inside the build reaches PyPI through this machine's
# proxy. Such images are for local tests only; the release workflow builds from the pinned base.
#
# Cached by what goes in: each image carries the hash of its inputs (the build context as
# .dockerignore admits it, and the base image's id) as the label pdd.dev/inputs; an image whose
# label matches is not built again, so a warm run takes seconds.
#
#   hack/images.sh            # build what changed, print the table
#   hack/images.sh --print    # only the table (nothing is built)
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(operator sidecar router)
REGISTRY=ghcr.io/pdd-dev
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/pdd-operator/Chart.yaml)
PINNED_BASE=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
LOCAL_BASE=localhost/pdd-python-base:bookworm
log() { echo "[images] $*" >&2; }

pick_engine() {
  if [ -n "${CONTAINER_ENGINE:-}" ]; then echo "$CONTAINER_ENGINE"; return; fi
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; return; fi
  if ! command -v podman >/dev/null; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
      || { log "neither docker nor podman: install one"; exit 1; }
    log "installing podman, runc and mmdebstrap (Debian packages)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      podman runc mmdebstrap uidmap >/dev/null
  fi
  echo podman
}

ENGINE=$(pick_engine)
BUILD_FLAGS=()
if [ "$ENGINE" = podman ]; then
  # This machine's sandbox refuses the default rlimits, crun its cgroup layout; builds run
  # with chroot isolation and the host's network (hack/containers.conf says why per line).
  export CONTAINERS_CONF="$PWD/hack/containers.conf"
  BUILD_FLAGS=(--isolation chroot --network host)
fi

image_id() { "$ENGINE" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

local_base() {
  if [ -n "$(image_id "$LOCAL_BASE")" ]; then echo "$LOCAL_BASE"; return; fi
  command -v mmdebstrap >/dev/null || apt-get install -y -qq mmdebstrap >/dev/null
  local tar
  tar=$(mktemp --suffix=.tar)
  log "making $LOCAL_BASE from Debian packages (mmdebstrap)"
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/' \
    bookworm "$tar"
  "$ENGINE" import --change 'CMD ["python3"]' "$tar" "$LOCAL_BASE" >/dev/null
  rm -f "$tar"
  echo "$LOCAL_BASE"
}

base_image() {
  if [ -n "${PYTHON_IMAGE:-}" ]; then echo "$PYTHON_IMAGE"; return; fi
  if [ -n "$(image_id "$PINNED_BASE")" ] || "$ENGINE" pull -q "$PINNED_BASE" >/dev/null 2>&1; then
    echo "$PINNED_BASE"
  else
    log "cannot pull $PINNED_BASE: building from a Debian base instead"
    local_base
  fi
}

# What a target is built from: the router only its pinned wheels (the Dockerfile and
# hack/constraints.txt), the others the whole build context as .dockerignore admits it
# (pyproject.toml, README.md, hack/constraints.txt, operator/: tracked and untracked files).
inputs_hash() {
  local target=$1 base_id=$2 files=(Dockerfile hack/constraints.txt)
  [ "$target" = router ] || files+=(pyproject.toml README.md operator)
  {
    echo "$base_id"
    git ls-files -co --exclude-standard -- "${files[@]}" | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -c1-16
}

build() {
  local target=$1 base=$2 inputs=$3 tag="$REGISTRY/pdd-$1:$VERSION"
  local have
  have=$("$ENGINE" image inspect --format '{{index .Config.Labels "pdd.dev/inputs"}}' "$tag" \
    2>/dev/null || true)
  if [ "$have" = "$inputs" ]; then log "$tag is up to date ($inputs)"; return; fi
  log "building $tag"
  "$ENGINE" build "${BUILD_FLAGS[@]}" --quiet --target "$target" \
    --build-arg "PYTHON_IMAGE=$base" --label "pdd.dev/inputs=$inputs" -t "$tag" . >/dev/null
}

# What each image holds, asked of the image itself: its own python, run as the chart runs the
# containers (user 65532, read-only root, no capabilities).
CONTENTS='
import importlib.metadata as m, platform
have = {d.metadata["Name"].lower(): d.version for d in m.distributions()}
shown = ["pdd-operator", "kopf", "kubernetes", "nixl", "nixl-cu12", "vllm-router", "smg"]
print("python " + platform.python_version() + "; " + ", ".join(
    f"{n} {have[n]}" for n in shown if n in have))
'

print_table() {
  printf '%-40s %8s  %s\n' image size contents
  for target in "${TARGETS[@]}"; do
    local tag="$REGISTRY/pdd-$target:$VERSION" size contents
    size=$("$ENGINE" image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0fMB", $1/1e6}')
    contents=$("$ENGINE" run --rm --network none --user 65532:65532 --read-only \
      --cap-drop ALL --security-opt no-new-privileges --entrypoint python "$tag" -c "$CONTENTS")
    printf '%-40s %8s  %s\n' "$tag" "$size" "$contents"
  done
}

if [ "${1:-}" != --print ]; then
  base=$(base_image)
  base_id=$(image_id "$base")
  for target in "${TARGETS[@]}"; do
    build "$target" "$base" "$(inputs_hash "$target" "$base_id")"
  done
fi
print_table
