#!/usr/bin/env bash
# kubeconform, the validator GitOps pipelines run over manifests before they reach a cluster:
# built once per machine into the cache (hack/go-tool.sh); prints its path.
set -euo pipefail
exec "$(dirname "$0")/go-tool.sh" kubeconform github.com/yannh/kubeconform/cmd/kubeconform \
  "${KUBECONFORM_VERSION:-v0.8.0}"
