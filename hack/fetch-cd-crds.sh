#!/usr/bin/env bash
# Puts the CRDs of the GitOps tools docs/gitops.md configures (Argo CD's Application and
# AppProject; Flux's source, kustomize and helm controllers' kinds) into a cache outside the
# repo and prints that directory.
# They come from the projects' own Go modules on the Go module proxy, the one source of
# upstream files reachable where the tests run: each module's zip carries its CRDs as YAML.
# Downloaded once per machine; a later run prints the cached directory at once.
set -euo pipefail

# The Flux release pins its controllers: their versions are read from its manifests, so the
# CRDs are the set one Flux release installs. Flux 2.8+ and Argo CD 3.6+ need Go >= 1.27.
FLUX_VERSION="${FLUX_VERSION:-v2.7.3}"
ARGO_CD_VERSION="${ARGO_CD_VERSION:-v3.5.8}"
FLUX_CONTROLLERS=(source-controller kustomize-controller helm-controller)
CACHE="${PDD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdd-operator}/cd-crds"
OUT="$CACHE/flux-$FLUX_VERSION-argo-cd-$ARGO_CD_VERSION"

log() { echo "[fetch-cd-crds] $*" >&2; }

if [ -f "$OUT/.complete" ]; then echo "$OUT"; exit 0; fi

export GOMODCACHE="$CACHE/gomodcache"
# Outside any module, so no go.mod around is read or changed.
export GOFLAGS="-mod=mod"
mkdir -p "$CACHE"
cd "$CACHE"

# Called as `x=$(module_dir ...)`: its exit status stops the script (set -e) at the assignment.
module_dir() {
  local json dir
  json=$(go mod download -json "$1") || true  # the reason is in the JSON's Error
  dir=$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$json")
  if [ -z "$dir" ]; then
    log "go mod download $1: $(sed -n 's/.*"Error": "\(.*\)".*/\1/p' <<<"$json")"
    return 1
  fi
  echo "$dir"
}

# Flux's manifests name each controller's CRDs by release URL:
# .../fluxcd/source-controller/releases/download/v1.7.3/source-controller.crds.yaml
controller_version() {
  local flux=$1 controller=$2
  sed -n "s|.*/fluxcd/$controller/releases/download/\(v[^/]*\)/$controller.crds.yaml.*|\1|p" \
    "$flux/manifests/bases/$controller/kustomization.yaml"
}

staging="$OUT.tmp.$$"
rm -rf "$staging"
mkdir -p "$staging"
trap 'rm -rf "$staging"' EXIT

flux=$(module_dir "github.com/fluxcd/flux2/v2@$FLUX_VERSION")
for controller in "${FLUX_CONTROLLERS[@]}"; do
  version=$(controller_version "$flux" "$controller")
  [ -n "$version" ] || { log "Flux $FLUX_VERSION names no version of $controller"; exit 1; }
  log "$controller $version (Flux $FLUX_VERSION)"
  dir=$(module_dir "github.com/fluxcd/$controller@$version")
  cp "$dir"/config/crd/bases/*.yaml "$staging/"
done

log "argo-cd $ARGO_CD_VERSION"
argo_cd=$(module_dir "github.com/argoproj/argo-cd/v3@$ARGO_CD_VERSION")
cp "$argo_cd"/manifests/crds/*-crd.yaml "$staging/"

chmod u+w "$staging"/*.yaml  # the module cache's files are read-only
touch "$staging/.complete"
rm -rf "$OUT"
mv "$staging" "$OUT"
echo "$OUT"
