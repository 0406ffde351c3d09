#!/usr/bin/env bash
# Runs an MPI program across a fresh test bed (scripts/testbed.sh) of NODES fake nodes with
# RANKS ranks on each, started by plain mpirun or by dtrain-launch, then tears the bed down.
#   on_testbed.sh NODESxRANKS mpirun PROGRAM ARGS...
#   on_testbed.sh NODESxRANKS launch DTRAIN_LAUNCH PROGRAM ARGS...
# Open MPI's TCP and out-of-band traffic are pinned to the bed's /24 (mpirun: the two
# *_if_include parameters; dtrain-launch: --iface). The program gets DTRAIN_TEST_HOSTS, the
# layout it was started with ("nodeA:2,nodeB:2"). Exit status: the program's; 77 (skipped)
# with the reason where the bed cannot be made.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
testbed="$here/../../scripts/testbed.sh"
readonly BED_TIMEOUT_S=240  # below CTest's TIMEOUT, so the bed's own trap always tears down; the GPT
# pipeline at 2x2 takes 35 s on a quiet 2-core box and ran past 100 s beside a loaded one

layout=${1:?usage: on_testbed.sh NODESxRANKS mpirun|launch ...}
mode=${2:?usage: on_testbed.sh NODESxRANKS mpirun|launch ...}
shift 2
[[ "$layout" =~ ^([1-9]|1[0-9]|2[0-6])x([1-9][0-9]?)$ ]] || { echo "on_testbed.sh: layout '$layout' is not like 2x2" >&2; exit 2; }
nodes=${BASH_REMATCH[1]} ranks=${BASH_REMATCH[2]}

hosts="" letters=ABCDEFGHIJKLMNOPQRSTUVWXYZ
for ((i = 0; i < nodes; i++)); do
  hosts+="${hosts:+,}node${letters:i:1}:$ranks"
done
export DTRAIN_TEST_HOSTS=$hosts OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Inside the bed (nodeA) the variables testbed.sh sets are known, so the command is built there.
if [ "${DTRAIN_TESTBED:-}" = "" ]; then
  exec "$testbed" run --nodes "$nodes" --timeout "$BED_TIMEOUT_S" -- "$0" "$layout" "$mode" "$@"
fi
case "$mode" in
  mpirun)
    # Every node's ranks run the same GEMM kernels (OPENBLAS_CORETYPE, where set): the pipeline
    # tests compare a stage against the unsplit model computed on its own rank, bit for bit.
    set -x
    exec mpirun -np $((nodes * ranks)) --host "$hosts" --oversubscribe --bind-to none \
      --mca btl_tcp_if_include "$DTRAIN_TESTBED_SUBNET" --mca oob_tcp_if_include "$DTRAIN_TESTBED_SUBNET" \
      -x OPENBLAS_NUM_THREADS=1 ${OPENBLAS_CORETYPE:+-x OPENBLAS_CORETYPE} -x DTRAIN_TEST_HOSTS "$@"
    ;;
  launch)
    launch=${1:?launch mode needs the dtrain-launch path}
    shift
    set -x
    exec "$launch" --hosts "$hosts" --iface "$DTRAIN_TESTBED_SUBNET" -- "$@"
    ;;
  *) echo "on_testbed.sh: mode '$mode' is not mpirun or launch" >&2; exit 2 ;;
esac
