#!/usr/bin/env bash
# `dtrain bench allreduce` checks every result: a clean run exits 0 with no wrong element in its
# JSON; with the test hook (--corrupt-rank) spoiling results on one rank it must fail loudly: a
# non-zero exit, a WRONG RESULT line, and the wrong elements counted in the JSON.
#   bench_allreduce_check_test.sh LAUNCH... -- DTRAIN   (LAUNCH: mpiexec -n 2 ... or dtrain-launch ...)
set -uo pipefail
launch=()
while [ "$1" != "--" ]; do launch+=("$1"); shift; done
shift
dtrain=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
small=(bench allreduce --max-bytes 64K --iters 3 --warmup 1)

"${launch[@]}" "$dtrain" "${small[@]}" --json "$dir/clean.json" >"$dir/clean.out" 2>&1 || { cat "$dir/clean.out"; fail "a clean run failed"; }
cat "$dir/clean.out"
grep -q '"wrong_elements": 0' "$dir/clean.json" || fail "the clean run's JSON reports wrong elements"
grep -q '"path": "flat"' "$dir/clean.json" || fail "the clean run's JSON has no flat rows"

"${launch[@]}" "$dtrain" "${small[@]}" --corrupt-rank 1 --json "$dir/bad.json" >"$dir/bad.out" 2>&1
rc=$?
cat "$dir/bad.out"
[ "$rc" -ne 0 ] || fail "a corrupted result did not fail the run (exit 0)"
grep -q "WRONG RESULT" "$dir/bad.out" || fail "no WRONG RESULT line for a corrupted result"
grep -q "differed from the exact sum" "$dir/bad.out" || fail "no final error line"
grep -q '"wrong_elements": 0' "$dir/bad.json" && fail "the JSON does not count the wrong elements"
echo "bench allreduce: the check passes clean results and fails corrupted ones (exit $rc)"
