#!/usr/bin/env bash
# actionlint, the linter for GitHub Actions workflows (.github/workflows): built once per
# machine into the cache (hack/go-tool.sh); prints its path.
set -euo pipefail
exec "$(dirname "$0")/go-tool.sh" actionlint github.com/rhysd/actionlint/cmd/actionlint \
  "${ACTIONLINT_VERSION:-v1.7.12}"
