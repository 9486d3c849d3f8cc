#!/usr/bin/env bash
# Install the system packages posttrain's sandbox needs (Debian/Ubuntu):
# bubblewrap (the non-root backend), python3-venv (the project venv is made
# from the system Python, outside /root) and libseccomp2 (seccomp filters via
# pyseccomp). Idempotent: a no-op when every package is present; never fails
# when not root and everything is present. Run by `make install`.
set -euo pipefail

PACKAGES=(bubblewrap libseccomp2 python3-venv)
missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system.sh: missing ${missing[*]} and no apt-get; install them with your package manager" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_system.sh: missing ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
echo "install_system.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
