#!/usr/bin/env bash
# Puts a Go command-line tool, built from its module on the Go module proxy (the one source of
# upstream code reachable where the tests run), into a cache outside the repo and prints its
# path. Built once per machine and version; a later run prints the cached path at once.
#
#   hack/go-tool.sh NAME PACKAGE VERSION     # hack/go-tool.sh kubeconform \
#                                            #   github.com/yannh/kubeconform/cmd/kubeconform v0.8.0
set -euo pipefail

NAME=$1 PACKAGE=$2 VERSION=$3
CACHE="${PDD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdd-operator}"
BIN="$CACHE/bin/$NAME-$VERSION"

if [ -x "$BIN/$NAME" ]; then echo "$BIN/$NAME"; exit 0; fi

mkdir -p "$BIN"
# Outside any module, so no go.mod around is read or changed.
cd "$CACHE"
echo "[go-tool] go install $PACKAGE@$VERSION" >&2
# GOBIN is a staging folder: an interrupted build never leaves a half-written binary behind.
staging="$BIN.tmp.$$"
trap 'rm -rf "$staging"' EXIT
GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOBIN="$staging" \
  go install -trimpath -ldflags "-s -w -X main.version=$VERSION" "$PACKAGE@$VERSION"
mv "$staging/$NAME" "$BIN/$NAME"
echo "$BIN/$NAME"
