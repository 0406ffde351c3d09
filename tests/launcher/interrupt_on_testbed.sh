#!/usr/bin/env bash
# SIGINT to dtrain-launch across two fake nodes (scripts/testbed.sh): the signal reaches the ranks
# on the other node too (over their supervisors' connections, not through mpirun): every rank,
# nodeB's included, records SIGINT (not mpirun's SIGTERM) and ends on it, none has to be killed
# (one line `interrupted by SIGINT: all 4 rank(s) stopped`), exit 130, within 5 s.
#   interrupt_on_testbed.sh TESTBED_SH DTRAIN_LAUNCH [LAUNCH_TEST_RANK (unused)]
# Exit 0 pass, 1 fail, 77 (skipped) where a bed cannot be made.
set -uo pipefail

testbed=${1:?usage: interrupt_on_testbed.sh TESTBED_SH DTRAIN_LAUNCH LAUNCH_TEST_RANK}
launch=${2:?dtrain-launch path}
readonly BOUND_MS=5000

if [ -z "${DTRAIN_TESTBED:-}" ]; then
  reason=$("$testbed" check 2>&1) || { echo "SKIPPED: $reason"; exit 77; }
  exec "$testbed" run --nodes 2 --timeout 100 -- "$0" "$@"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/seen"
# A rank that writes down the first signal it got, and on which node (the bed shares the files).
# It lingers a little before it exits: the first rank to exit non-zero makes mpirun SIGTERM the
# others, which must have recorded what dtrain-launch sent them by then.
cat >"$work/rank.sh" <<'RANK'
#!/usr/bin/env bash
seen=$1/rank.$OMPI_COMM_WORLD_RANK
for s in INT TERM; do trap "grep -q '^started' $seen && echo \"$s \$(hostname)\" >$seen; sleep 0.5; exit 1" "$s"; done
echo "started $(hostname)" >"$seen"
while :; do sleep 0.05; done
RANK
chmod +x "$work/rank.sh"
"$launch" --hosts nodeA:2,nodeB:2 --iface "$DTRAIN_TESTBED_SUBNET" --start-timeout 0 -- "$work/rank.sh" "$work/seen" \
  >"$work/out" 2>&1 &
pid=$!
for ((i = 0; i < 600; i++)); do [ "$(cat "$work"/seen/rank.* 2>/dev/null | grep -c started)" -ge 4 ] && break; sleep 0.1; done
sleep 0.5
t0=$(($(date +%s%N) / 1000000))
kill -INT "$pid"
status=0
wait "$pid" || status=$?
elapsed_ms=$(($(date +%s%N) / 1000000 - t0))
lines=$(grep '^dtrain-launch: ' "$work/out")
echo "# exit $status after ${elapsed_ms} ms; dtrain-launch said:"
printf '#   %s\n' "$lines"
echo "# what each rank saw: $(cat "$work"/seen/rank.* | tr '\n' ';')"

failures=0
check() { local name=$1; shift; if "$@"; then echo "ok - $name"; else echo "not ok - $name"; failures=$((failures + 1)); fi; }
check "every rank got SIGINT, nodeB's two included" \
  [ "$(cat "$work"/seen/rank.* | sort | uniq -c | tr -s ' ')" = "$(printf ' 2 INT nodeA\n 2 INT nodeB')" ]
check "one line: every rank stopped (none killed)" \
  [ "$lines" = "dtrain-launch: interrupted by SIGINT: all 4 rank(s) stopped" ]
check "exit status 130" [ "$status" = 130 ]
check "the job ends within $BOUND_MS ms of SIGINT" [ "$elapsed_ms" -le "$BOUND_MS" ]
exit $((failures > 0))
