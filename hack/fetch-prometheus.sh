#!/usr/bin/env bash
# Prometheus for hack/dashboard_picture.py: Debian's build, unpacked once per machine into
# the cache outside the repo; prints the binary's path. (The Go module proxy serves its source
# too, but the server with every service discovery takes long to build on two cores.)
set -euo pipefail

VERSION="${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}"
CACHE="${PDD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdd-operator}"
DIR="$CACHE/bin/prometheus-$VERSION"

if [ -x "$DIR/usr/bin/prometheus" ]; then echo "$DIR/usr/bin/prometheus"; exit 0; fi
command -v apt-get >/dev/null || {
  echo "[prometheus] apt-get not found: pass hack/dashboard_picture.py --prometheus PATH" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[prometheus] apt-get download prometheus=$VERSION" >&2
(cd "$work" && apt-get download "prometheus=$VERSION" >&2)
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
mkdir -p "$(dirname "$DIR")"
mv "$work/root" "$DIR"
echo "$DIR/usr/bin/prometheus"
