#!/usr/bin/env bash
# The installed package works for a project of its own: `cmake --install` this build into a
# scratch prefix, where only the public headers are (internal ones absent, every installed
# header's includes installed: cmake/install.cmake); configure and build examples/custom_model
# against it with find_package(dtrain), and train it at np 2 (it exits non-zero unless it learned
# and every rank ends identical). Then checkpointing through the library (train/checkpointer.h):
# a run whose rank 0 is killed (SIGKILL) after its checkpoint of step 100, resumed with
# --resume, ends with the same bytes of weights as a run never stopped.
#   custom_model_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"

inc="$work/prefix/include/dtrain"
for internal in comm/work_queue.h core/blis_gemm.h checkpoint/durable_file.h; do
  if [[ -e "$inc/$internal" ]]; then
    echo "an internal header is installed as public API: include/dtrain/$internal"; exit 1
  fi
done
missing=0
while IFS= read -r header; do
  for included in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$header"); do
    if [[ ! -e "$inc/$included" ]]; then
      echo "include/dtrain/${header#"$inc"/} includes $included, which is not installed"; missing=1
    fi
  done
done < <(find "$inc" -name '*.h')
(( missing == 0 ))

cmake -S "$source/examples/custom_model" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
# The example links only the installed libraries (no path back into the build tree).
if ldd "$work/build/custom_model" | grep -q "$build/lib"; then
  echo "custom_model links libraries from the build tree:"; ldd "$work/build/custom_model"; exit 1
fi
run() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 \
    mpirun -np 2 --oversubscribe --bind-to none "$work/build/custom_model" "$@"
}
run --checkpoint-dir "$work/full" --every 50 --weights-out "$work/full.safetensors"

if run --checkpoint-dir "$work/killed" --every 50 --kill-at-step 130 > "$work/killed.log" 2>&1; then
  cat "$work/killed.log"; echo "the run to be killed at step 130 ended normally"; exit 1
fi
if [[ "$(cat "$work/killed/latest" 2>/dev/null)" != step-100 ]]; then
  cat "$work/killed.log"; ls -la "$work/killed" || true
  echo "after the kill at step 130, latest should name step-100"; exit 1
fi
run --checkpoint-dir "$work/killed" --every 50 --resume --weights-out "$work/resumed.safetensors" | tee "$work/resumed.log"
grep -q "^resumed from $work/killed/step-100 (step 100)$" "$work/resumed.log" || { echo "did not resume from step-100"; exit 1; }
if ! cmp "$work/full.safetensors" "$work/resumed.safetensors"; then
  echo "killed at step 130 and resumed from step-100, the final weights differ from the uninterrupted run's"; exit 1
fi
echo "killed at step 130 and resumed from step-100: final weights identical to the uninterrupted run" \
  "($(stat -c %s "$work/full.safetensors") bytes)"
