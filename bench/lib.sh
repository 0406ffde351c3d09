# Shared by the bench scripts (sourced from the repository root): an up-to-date build, the
# binaries' paths, a scratch folder removed on exit, and a median.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
build=${DTRAIN_BUILD_DIR:-build}
DTRAIN_BUILD_DIR=$build bash scripts/setup.sh build >/dev/null  # never time a stale binary
dtrain=$(realpath "$build/app/dtrain"); launch=$(realpath "$build/launcher/dtrain-launch")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# Numbers on stdin, one per line -> their median.
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }
