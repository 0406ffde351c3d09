#!/usr/bin/env bash
# One-command set-up for dtrain on Debian 12 (as root, or with sudo available).
#   bash scripts/setup.sh run    install deps, build Release, run the main job (2-rank training)
#   bash scripts/setup.sh test   install deps, build (CUDA variant when nvcc is present), run CTest
# Idempotent: installs only what is missing, reuses the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in run|test|build) ;; *) echo "usage: bash scripts/setup.sh run|test|build" >&2; exit 2 ;; esac

packages=(cmake g++ make libopenmpi-dev openmpi-bin libcxxopts-dev libfmt-dev libgtest-dev libopenblas-dev
          libblis-dev libbenchmark-dev zlib1g-dev dataset-fashion-mnist)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Open MPI refuses root without these; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

build=${DTRAIN_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${DTRAIN_CMAKE_ARGS:-} >/dev/null
# run and build need only the two programs; test builds everything (the test binaries too).
targets=(--target dtrain dtrain-launch)
if [ "$mode" = test ]; then targets=(); fi
cmake --build "$build" -j "$(nproc)" "${targets[@]}"

case "$mode" in
  run)
    exec "$build/launcher/dtrain-launch" -n 2 -- "$build/examples/dtrain" train --epochs 1
    ;;
  test)
    cd "$build"
    exec ctest --output-on-failure -j "$(nproc)" --timeout 600
    ;;
esac
