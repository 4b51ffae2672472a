#!/usr/bin/env bash
# Puts pinned control-plane binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler), kubectl at the API server's version, and helm into a cache outside the repo
# and prints that directory.
# Order, per DESIGN.md: already present (KUBEBUILDER_ASSETS or the cache) -> built with
# `go build` from the Go module proxy -> downloaded release binaries.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
CACHE="${PDD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdd-operator}"
BIN="$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm)

log() { echo "[fetch-binaries] $*" >&2; }

have_all() {
  local dir=$1
  for b in "${BINARIES[@]}"; do [ -x "$dir/$b" ] || return 1; done
}

# 1. Already present.
if [ -n "${KUBEBUILDER_ASSETS:-}" ] && have_all "$KUBEBUILDER_ASSETS"; then
  echo "$KUBEBUILDER_ASSETS"; exit 0
fi
if have_all "$BIN"; then echo "$BIN"; exit 0; fi

mkdir -p "$BIN"
WORK="$CACHE/build"
mkdir -p "$WORK"
export GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false"
export CGO_ENABLED=0

build_kubernetes() {
  # k8s.io/kubernetes maps its staging modules to ./staging with `replace`, which Go ignores
  # in a dependency; the wrapper module maps each one to its published v0.X.Y instead.
  local dir="$WORK/k8s-$K8S_VERSION" staging_version="v0${K8S_VERSION#v1}"
  mkdir -p "$dir"
  local gomod
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module pdd.dev/controlplane-build"
    echo
    echo "go $(sed -n 's/^go \(.*\)/\1/p' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -oE '^\s*k8s.io/[a-z0-9-]+ => ./staging' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || true)
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$BIN/$cmd" ] && continue
    log "go build $cmd $K8S_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") && mv "$BIN/$cmd.tmp" "$BIN/$cmd"
  done
}

build_etcd() {
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  cat >"$dir/main.go" <<'GO'
// Command etcd runs etcd's own entry point, built from the Go module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  printf 'module pdd.dev/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$dir/go.mod"
  log "go build etcd $ETCD_VERSION"
  (cd "$dir" && go mod tidy >/dev/null && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" .) && mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_helm() {
  local dir="$WORK/helm-$HELM_VERSION"
  mkdir -p "$dir"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  printf 'module pdd.dev/helm-build\n\ngo 1.24\n\nrequire helm.sh/helm/v3 %s\n' "$HELM_VERSION" >"$dir/go.mod"
  log "go build helm $HELM_VERSION"
  (cd "$dir" && go mod tidy >/dev/null && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$BIN/helm.tmp" helm.sh/helm/v3/cmd/helm) && mv "$BIN/helm.tmp" "$BIN/helm"
}

download_release() {
  # 3. Only where the internet is reachable; here it is not, so it fails fast.
  local arch; arch=$(go env GOARCH)
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$BIN/$cmd" ] || curl -fsSL --max-time 60 -o "$BIN/$cmd" "https://dl.k8s.io/release/$K8S_VERSION/bin/linux/$arch/$cmd" && chmod +x "$BIN/$cmd"
  done
}

if command -v go >/dev/null; then
  start=$(date +%s)
  [ -x "$BIN/etcd" ] || build_etcd
  build_kubernetes
  [ -x "$BIN/helm" ] || build_helm
  log "built in $(( $(date +%s) - start ))s"
fi
have_all "$BIN" || download_release
have_all "$BIN" || { log "could not obtain all of: ${BINARIES[*]} in $BIN"; exit 1; }
echo "$BIN"
