#!/usr/bin/env bash
# The installed package works for a project of its own: `cmake --install` this build into a
# scratch prefix, configure and build examples/custom_model against it with find_package(dtrain),
# and train it at np 2 (it exits non-zero unless it learned and every rank ends identical).
#   custom_model_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source/examples/custom_model" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
# The example links only the installed libraries (no path back into the build tree).
if ldd "$work/build/custom_model" | grep -q "$build/lib"; then
  echo "custom_model links libraries from the build tree:"; ldd "$work/build/custom_model"; exit 1
fi
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 \
  mpirun -np 2 --oversubscribe --bind-to none "$work/build/custom_model"
