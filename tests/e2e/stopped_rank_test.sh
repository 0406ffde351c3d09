#!/usr/bin/env bash
# A rank stopped with SIGSTOP mid-training never joins the next collective. With --timeout 5 the
# job ends non-zero soon after, one line names the collective and the stopped rank, every other
# rank writes its flight recorder, and `dtrain flight-report` names the stopped rank.
# Also: SIGUSR1 makes every rank write its flight recorder without stopping the job.
# Usage: stopped_rank_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
readonly TIMEOUT_S=5 MARGIN_S=10  # mpirun needs a few seconds to take down a stopped process
readonly VICTIM=$((NP - 1))

fr="$WORK/fr"
mkdir -p "$fr"
start_dtrain "$NP" "$WORK/log" train "${COMMON[@]}" --epochs 1000 --train-limit 4096 --timeout "$TIMEOUT_S" \
  --flight-recorder-dir "$fr"
job=$LAUNCHED
wait_until 30 grep -q "^Train Epoch: 2 " "$WORK/log" || { not_ok "training started" "$(tail -3 "$WORK/log")"; finish; }
victim=$(rank_pid "$job" "$NP" "$VICTIM")

# SIGUSR1 to every rank: each writes its recorder, training goes on.
for r in $(seq 0 $((NP - 1))); do kill -USR1 "$(rank_pid "$job" "$NP" "$r")"; done
wait_until 5 test "$(find "$fr" -name 'flight_recorder_rank*.json' | wc -l)" -eq "$NP"
check "SIGUSR1: every rank wrote its flight recorder" test "$(find "$fr" -name 'flight_recorder_rank*.json' | wc -l)" -eq "$NP"
check "SIGUSR1: the job is still running" kill -0 "$job"
rm -f "$fr"/flight_recorder_rank*.json

stop_and_wait STOP "$victim" "$job"
status=$STATUS ms=$MS
line=$(grep -m1 "timed out after" "$WORK/log")
echo "# exit $status after $ms ms: $line"
check "non-zero exit" [ "$status" -ne 0 ]
check "ends within ${TIMEOUT_S} s + ${MARGIN_S} s" [ "$ms" -le $(((TIMEOUT_S + MARGIN_S) * 1000)) ]
check "the line names the collective" grep -qE "collective #[0-9]+ \((allreduce|broadcast|allgather|barrier) of" <<<"$line"
check "the line names the stopped rank" grep -qE "rank $VICTIM (is not responding|has not arrived)" <<<"$line"
# The stopped rank may write one too: mpirun sends SIGCONT before it kills a job's processes.
check "the other ranks wrote their flight recorders" test "$(find "$fr" -name 'flight_recorder_rank*.json' | wc -l)" -ge $((NP - 1))
report=$("$DTRAIN" flight-report "$fr")
echo "$report" | sed 's/^/#   /'
check "flight-report names the stopped rank" grep -qE "^behind or missing: rank\(s\) ([0-9]+,)*$VICTIM$" <<<"$report"
finish
