#!/usr/bin/env bash
# Puts kubeconform, the validator GitOps pipelines run over manifests before they reach a
# cluster, into a cache outside the repo and prints its path.
# Built from its Go module on the Go module proxy (the one source of upstream code reachable
# where the tests run); built once per machine, a later run prints the cached path at once.
set -euo pipefail

KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.8.0}"
CACHE="${PDD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdd-operator}"
BIN="$CACHE/bin/kubeconform-$KUBECONFORM_VERSION"

log() { echo "[fetch-kubeconform] $*" >&2; }

if [ -x "$BIN/kubeconform" ]; then echo "$BIN/kubeconform"; exit 0; fi

mkdir -p "$BIN"
# Outside any module, so no go.mod around is read or changed.
cd "$CACHE"
log "go install kubeconform $KUBECONFORM_VERSION"
# GOBIN is a staging folder: an interrupted build never leaves a half-written binary behind.
staging="$BIN.tmp.$$"
trap 'rm -rf "$staging"' EXIT
GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOBIN="$staging" \
  go install -trimpath -ldflags "-s -w -X main.version=$KUBECONFORM_VERSION" \
  "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
mv "$staging/kubeconform" "$BIN/kubeconform"
echo "$BIN/kubeconform"
