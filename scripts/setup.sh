#!/usr/bin/env bash
# Installs every Debian package moonlet needs to build, test and benchmark.
# Idempotent: packages already present are skipped by apt; safe to re-run.
set -euo pipefail

PKGS=(
  build-essential pkg-config meson ninja-build clang libclang-rt-dev
  libibverbs-dev librdmacm-dev libmsgpack-dev libcmocka-dev libnuma-dev
  libxxhash-dev libcjson-dev libbsd-dev libmicrohttpd-dev libsodium-dev
  python3 python3-dev python3-pytest python3-matplotlib
  iproute2 nftables procps
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
