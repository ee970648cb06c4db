#!/usr/bin/env bash
# Make `promtool` available for tests/test_packaging.py (the alerting-rule tests).
# Idempotent: does nothing when promtool is already on PATH.  Otherwise installs
# Debian's `prometheus` package (the only packaged source of promtool) and stops
# the Prometheus server the package may start: only the CLI is wanted.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
    echo "promtool present: $(promtool --version 2>&1 | head -n1)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "promtool is missing and apt-get is not available: install Prometheus's promtool by hand" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# Servers already running before the install are not ours to stop.
before="$(pgrep -x prometheus | tr '\n' ' ' || true)"

# policy-rc.d exit 101 tells invoke-rc.d not to start services during the install.
# Remove it afterwards only if we created it.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 0755 /usr/sbin/policy-rc.d
    created_policy=1
fi
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        $SUDO rm -f /usr/sbin/policy-rc.d
    fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# Where systemd runs, the package enables and may start prometheus.service.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
# Anything else the install started (an init script, no systemd): stop it by pid.
for pid in $(pgrep -x prometheus || true); do
    case " $before " in
        *" $pid "*) ;;
        *) $SUDO kill "$pid" 2>/dev/null || true ;;
    esac
done

command -v promtool >/dev/null 2>&1 || {
    echo "the prometheus package installed no promtool" >&2
    exit 1
}
echo "promtool installed: $(promtool --version 2>&1 | head -n1)"
