#!/usr/bin/env bash
# Install Prometheus (the server and promtool) from the distribution's package, for the
# observability end-to-end tests and `[observability] prometheus = true`.
# Idempotent: does nothing when both binaries are already on PATH.
# Exit codes: 0 installed or already present; 1 could not install (the message says why).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have prometheus && have promtool; then
    echo "prometheus: $(command -v prometheus), promtool: $(command -v promtool)"
    exit 0
fi

if ! have apt-get; then
    echo "install-prometheus: no apt-get here; install Prometheus yourself (the 'prometheus'" \
        "package of your distribution, or a release from prometheus.io) so that" \
        "'prometheus' and 'promtool' are on PATH" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif have sudo && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "install-prometheus: need root to install the 'prometheus' package; run" \
        "'sudo apt-get install -y prometheus' (or this script as root)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# The package's post-install script may try to start a system service; nothing here
# relies on it (pdctl and the tests run their own Prometheus with their own config).
if [ -d /usr/sbin ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
    trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
fi
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null

if have prometheus && have promtool; then
    echo "installed $(prometheus --version 2>&1 | head -n 1)"
else
    echo "install-prometheus: the 'prometheus' package did not provide prometheus and" \
        "promtool on PATH" >&2
    exit 1
fi
