#!/usr/bin/env bash
# dtrain-launch across two fake nodes (scripts/testbed.sh): a rank on the second node is
# SIGKILLed, and the one line names that rank, the node it ran on (nodeB, not the launcher's
# node) and SIGKILL, its last stderr line included; the job ends within 5 s. The rank
# supervisors on nodeB reach dtrain-launch on nodeA over the bed's network (--iface).
#   dead_rank_on_testbed.sh TESTBED_SH DTRAIN_LAUNCH LAUNCH_TEST_RANK
# Exit 0 pass, 1 fail, 77 (skipped) where a bed cannot be made.
set -uo pipefail

testbed=${1:?usage: dead_rank_on_testbed.sh TESTBED_SH DTRAIN_LAUNCH LAUNCH_TEST_RANK}
launch=${2:?dtrain-launch path}
rank_prog=${3:?launch_test_rank path}
readonly BOUND_S=5 FAIL_AFTER_S=3

if [ -z "${DTRAIN_TESTBED:-}" ]; then
  reason=$("$testbed" check 2>&1) || { echo "SKIPPED: $reason"; exit 77; }
  exec "$testbed" run --nodes 2 --timeout 100 -- "$0" "$@"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Rank 3 (the second on nodeB) kills itself FAIL_AFTER_S after it started; the others run on.
t0=$(($(date +%s%N) / 1000000))
status=0
"$launch" --hosts nodeA:2,nodeB:2 --iface "$DTRAIN_TESTBED_SUBNET" -- "$rank_prog" \
  --fail-rank 3 --fail kill --fail-after "$FAIL_AFTER_S" --error-line "step 17 of epoch 0" >"$out" 2>&1 || status=$?
elapsed_ms=$(($(date +%s%N) / 1000000 - t0 - FAIL_AFTER_S * 1000))
lines=$(grep '^dtrain-launch: ' "$out")
echo "# exit $status, ${elapsed_ms} ms after the kill (at most; start-up included); dtrain-launch said:"
printf '#   %s\n' "$lines"

failures=0
check() { local name=$1; shift; if "$@"; then echo "ok - $name"; else echo "not ok - $name"; failures=$((failures + 1)); fi; }
check "one line, naming rank 3 on nodeB, SIGKILL and its last stderr line" [ "$lines" = \
  "dtrain-launch: rank 3 on nodeB was killed by signal 9 (SIGKILL); its last line on stderr: step 17 of epoch 0" ]
check "exit status 137" [ "$status" = 137 ]
check "the job ends within ${BOUND_S} s of the kill" [ "$elapsed_ms" -le $((BOUND_S * 1000)) ]
exit $((failures > 0))
