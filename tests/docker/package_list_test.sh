#!/usr/bin/env bash
# The Dockerfiles and setup.sh take their packages from scripts/packages.txt, and the files the
# Dockerfiles check or link are the ones the build makes. No container engine needed: this reads
# the Dockerfiles and the CMake build folder (built at least for dtrain and dtrain-launch).
#   package_list_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
failures=0
ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1"; failures=$((failures + 1)); }

list=$src/scripts/packages.txt
if ! listed=$(sh "$src/scripts/packages.sh" build data test docker); then
  echo "not ok - scripts/packages.sh cannot read $list"
  exit 1
fi
# Every line names a package and one of the groups the scripts ask for.
bad=$(awk '!/^#/ && NF > 0 && !(NF == 2 && $2 ~ /^(build|data|test|docker)$/)' "$list")
if [ -z "$bad" ]; then ok "packages.txt: every line is NAME GROUP"; else not_ok "packages.txt: lines not NAME GROUP: $bad"; fi

# Packages a file installs by name, not through the list: the words after `apt-get install`
# (continuation lines joined; options, variables and shell punctuation dropped).
named_packages() {
  sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' "$1" \
    | grep -o 'apt-get install[^&|;()]*' \
    | sed 's/^apt-get install//' | tr ' ' '\n' \
    | grep -v -e '^$' -e '^-' -e '^\$' -e '^"' || true
}

# check_dockerfile FILE EXTRA...: FILE installs the build group from the list, names no package
# of the list itself and nothing else but EXTRA (packages of its own base, e.g. NCCL).
check_dockerfile() {
  local file=$1 name=${1#"$src"/} extras=" ${*:2} " p
  shift
  if grep -q 'COPY .*scripts/packages.txt' "$file" && grep -q 'packages.sh build' "$file"; then
    ok "$name installs the build group of scripts/packages.txt"
  else
    not_ok "$name does not install from scripts/packages.txt (COPY it and run packages.sh build)"
  fi
  for p in $(named_packages "$file"); do
    if grep -qx -- "$p" <<<"$listed"; then
      not_ok "$name names $p itself: take it from scripts/packages.txt"
    elif [[ $extras != *" $p "* ]]; then
      not_ok "$name installs $p, which is not in scripts/packages.txt"
    fi
  done
  # Files under build/ that it checks or links: made by this build, or the GPU backend library
  # that only a CUDA build makes (declared in core/cuda, put beside the other libraries).
  local path
  for path in $(grep -o 'build/[A-Za-z0-9_./-]*' "$file" | sort -u); do
    [ "$path" = build/ ] && continue
    if [ -e "$build/${path#build/}" ]; then
      ok "$name: $path is made by the build"
    elif [ "$path" = build/lib/libdtrain_cuda.so ] && [ -e "$build/lib/libdtrain_core.so" ] \
         && grep -q 'add_library(dtrain_cuda SHARED' "$src/core/cuda/CMakeLists.txt"; then
      ok "$name: $path is the CUDA backend library (not built here: CPU build)"
    else
      not_ok "$name: $path is not made by the build (nothing at $build/${path#build/})"
    fi
  done
}

check_dockerfile "$src/docker/Dockerfile.cpu"
check_dockerfile "$src/docker/Dockerfile" libnccl2 libnccl-dev

if grep -q 'scripts/packages.sh' "$src/scripts/setup.sh" && [ -z "$(named_packages "$src/scripts/setup.sh")" ]; then
  ok "setup.sh installs from scripts/packages.txt"
else
  not_ok "setup.sh does not take its packages from scripts/packages.txt"
fi

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
