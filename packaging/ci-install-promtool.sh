#!/usr/bin/env bash
# Make `promtool` available for tests/test_packaging.py (the alerting-rule tests), inside
# the project's environment only: `bash packaging/ci-install-promtool.sh [BIN_DIR]`
# (BIN_DIR defaults to .venv/bin).
#
# Idempotent: does nothing when promtool is already on PATH or in BIN_DIR. Otherwise it
# downloads Debian's `prometheus` package (the only packaged source of promtool; PyPI and
# npm ship none) with `apt-get download`, and extracts the one file `usr/bin/promtool`
# into BIN_DIR. Nothing is installed system-wide: no dpkg database entry, no prometheus
# service, no /usr/sbin/policy-rc.d. The only change outside the checkout is apt's
# package list cache, which `apt-get update` refreshes when it is empty (that needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN_DIR="${1:-.venv/bin}"

if command -v promtool >/dev/null 2>&1; then
    echo "promtool present: $(promtool --version 2>&1 | head -n1)"
    exit 0
fi
if [ -x "$BIN_DIR/promtool" ]; then
    echo "promtool present: $("$BIN_DIR/promtool" --version 2>&1 | head -n1)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "promtool is missing and apt-get/dpkg-deb are not available:" \
        "put Prometheus's promtool on PATH by hand" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# apt-get download needs the package lists; a fresh container has none.
if ! apt-cache show prometheus >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    $SUDO apt-get update -qq
fi

# apt's download sandbox user (_apt) cannot write into a private temp directory; as root,
# download without the sandbox instead of loosening the directory's permissions.
(cd "$work" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" prometheus)
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb \
    | tar -x -C "$work" ./usr/bin/promtool
mkdir -p "$BIN_DIR"
install -m 0755 "$work/usr/bin/promtool" "$BIN_DIR/promtool"
echo "promtool installed in $BIN_DIR: $("$BIN_DIR/promtool" --version 2>&1 | head -n1)"
