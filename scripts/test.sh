#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (C and Python).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
meson test -C build --print-errorlogs --num-processes 2 "$@"
