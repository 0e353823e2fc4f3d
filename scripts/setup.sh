#!/usr/bin/env bash
# Installs webdrift and what it needs on a Debian/Ubuntu machine.
#   bash scripts/setup.sh          runtime: WebGPU via Vulkan (lavapipe where there is no GPU) + the package
#   bash scripts/setup.sh --test   also the test references (CPU PyTorch, transformers, ...) and Chromium
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
pkgs="mesa-vulkan-drivers libvulkan1"
[ "${1:-}" = "--test" ] && pkgs="$pkgs chromium"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq $missing >/dev/null
fi
if [ "${1:-}" = "--test" ]; then
  # torch pinned: 2.13.0 is a CPU build here; a bare `torch` would pull GBs of CUDA packages
  python3 -m pip install -q -e ".[test]"
else
  python3 -m pip install -q -e .
fi
