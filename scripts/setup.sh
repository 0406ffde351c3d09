#!/usr/bin/env bash
# One-command set-up for dtrain on Debian 12 (as root, or with sudo available).
#   bash scripts/setup.sh run    install deps, build Release, run the main job (2-rank training)
#   bash scripts/setup.sh test   install deps, build (CUDA variant when nvcc is present), run CTest
#                                (label multinode: a test bed of network namespaces; skipped unless root.
#                                label docker: DTRAIN_TEST_DOCKER=1 also builds the CPU image with podman)
#   bash scripts/setup.sh sanitize   AddressSanitizer + UBSan build (CPU only, build-asan/) of the
#                                    unit and MPI tests, run with CTest (leaks in Open MPI suppressed)
#   bash scripts/setup.sh tsan   ThreadSanitizer build (CPU only, build-tsan/), unit and MPI tests
#                                (Open MPI's own reports suppressed)
# Idempotent: installs only what is missing, reuses the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in run|test|build|sanitize|tsan) ;; *) echo "usage: bash scripts/setup.sh run|test|build|sanitize|tsan" >&2; exit 2 ;; esac

# One list for this script and the Dockerfiles: scripts/packages.txt. The container engine test's
# packages (group docker) only when that test is asked for.
groups=(build data test)
[ "$mode" = test ] && [ "${DTRAIN_TEST_DOCKER:-0}" = 1 ] && groups+=(docker)
list=$(sh scripts/packages.sh "${groups[@]}")  # set -e: a broken list stops here
mapfile -t packages <<<"$list"
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
config=(-DCMAKE_BUILD_TYPE=Release)
case "$mode" in
  # -O1 -g1: line numbers in reports, and a quicker build than -O2 -g on small CI machines.
  sanitize) build=$build-asan; config=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
                                       -DDTRAIN_CUDA=OFF -DDTRAIN_SANITIZE=address,undefined) ;;
  tsan) build=$build-tsan; config=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
                                   -DDTRAIN_CUDA=OFF -DDTRAIN_SANITIZE=thread) ;;
esac
cmake -S . -B "$build" "${config[@]}" ${DTRAIN_CMAKE_ARGS:-} >/dev/null
# run and build need only the two programs; test builds everything (the test binaries too).
targets=(--target dtrain dtrain-launch)
case "$mode" in test|sanitize|tsan) targets=() ;; esac
cmake --build "$build" -j "$(nproc)" "${targets[@]}"

case "$mode" in
  run)
    exec "$build/launcher/dtrain-launch" -n 2 -- "$build/app/dtrain" train --epochs 1
    ;;
  test)
    cd "$build"
    exec ctest --output-on-failure -j "$(nproc)" --timeout 600
    ;;
  sanitize)
    # Any finding fails its test: ASan and UBSan abort; LeakSanitizer reports at exit.
    supp=$PWD/scripts/sanitizers
    export ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1
    # The slow unwinder: Open MPI's plugins have no frame pointers and are unloaded by exit, so
    # only a full stack reaches the library frames the suppressions name. use_tls=0: scanning
    # rank 0's thread-local storage crashed LeakSanitizer's own tracer at exit in mpi_ddp_test at
    # np 2 ("Tracer caught signal 11", every case passed; not diagnosed further). Without that
    # scan memory held only by thread-locals would be reported, never a real leak hidden.
    export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0:use_tls=0
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    cd "$build"
    # The unit and MPI tests: the whole-program scenarios (e2e, launcher supervision, test bed,
    # PyTorch, the installed package, the container images) run in the test job; under ASan they
    # only take longer.
    exec ctest --output-on-failure -j "$(nproc)" --timeout 600 -E '^(e2e|launcher|multinode|install|torch|docker)_'
    ;;
  tsan)
    supp=$PWD/scripts/sanitizers
    export TSAN_OPTIONS=suppressions=$supp/tsan.supp:second_deadlock_stack=1
    cd "$build"
    exec ctest --output-on-failure -j "$(nproc)" --timeout 600
    ;;
esac
