#!/usr/bin/env bash
# A pipeline's rank stopped with SIGSTOP mid-training (Note [Pipeline grid]): its neighbours wait
# in a transfer batch (send/recv) and its stage's replicas in their gradient all-reduce. With
# --timeout 5 the job ends non-zero soon after, and a line names what a waiting rank was in and
# the stopped rank (by its MPI_COMM_WORLD number, on the stage's and the chain's communicators
# alike); `dtrain flight-report` names it too. A killed rank (SIGKILL) ends the job non-zero
# just as soon.
# Usage: pipeline_stopped_rank_test.sh DTRAIN NP [VICTIM]   (NP 2: P 2; NP 4: P 2 x D 2)
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
readonly TIMEOUT_S=5 MARGIN_S=10  # mpirun needs a few seconds to take down a stopped process
pipeline_layout "$NP"
readonly VICTIM=${3:-$((NP - 1))}
RUN=(train "${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --epochs 1000 --batch-size "$B"
  --pipeline-stages "$P" --micro-batches "$M" --timeout "$TIMEOUT_S")

fr="$WORK/fr"
mkdir -p "$fr"
start_dtrain "$NP" "$WORK/log" "${RUN[@]}" --flight-recorder-dir "$fr"
job=$LAUNCHED
wait_until 60 grep -q "^Train Epoch: 2 " "$WORK/log" || { not_ok "training started" "$(tail -3 "$WORK/log")"; finish; }
victim=$(rank_pid "$job" "$NP" "$VICTIM")
stop_and_wait STOP "$victim" "$job"
status=$STATUS ms=$MS
grep "timed out after" "$WORK/log" | sed 's/^/# /'
echo "# exit $status after $ms ms"
check "SIGSTOP of rank $VICTIM: non-zero exit" [ "$status" -ne 0 ]
check "SIGSTOP: ends within ${TIMEOUT_S} s + ${MARGIN_S} s" [ "$ms" -le $(((TIMEOUT_S + MARGIN_S) * 1000)) ]
# A rank that waited on the victim itself names it; one that waited on such a rank (stage 0 of
# the victim's neighbour's pipeline at NP 4) may time out first, naming its own peer.
check "SIGSTOP: a line names the transfer or all-reduce it waited in and the stopped rank" \
  grep -qE "collective #[0-9]+ \((send|recv|sendrecv|allreduce) of .*timed out after.*rank $VICTIM is not responding" "$WORK/log"
# Unlike data parallel's one all-reduce, the waiting ranks' deadlines fire at different times (a
# stage's replicas in their sum, its neighbours in transfers posted later): the first to time
# out takes the job down, so a rank whose deadline is still running may be killed before its
# dump (seen at NP 4 under the full suite: 2 dumps of 3). At least one waiting rank's dump is
# the guarantee; flight-report below must still name the stopped rank from it.
check "a waiting rank wrote its flight recorder" test "$(find "$fr" -name 'flight_recorder_rank*.json' | wc -l)" -ge 1
report=$("$DTRAIN" flight-report "$fr" 2>&1)
echo "$report" | sed 's/^/#   /'
check "flight-report names the stopped rank" grep -qE "^ *behind or missing: rank\(s\) ([0-9]+,)*$VICTIM(,[0-9]+)*$" <<<"$report"

# A killed rank: the launcher ends the job; nothing waits on it past the timeout.
start_dtrain "$NP" "$WORK/kill.log" "${RUN[@]}"
job=$LAUNCHED
wait_until 60 grep -q "^Train Epoch: 2 " "$WORK/kill.log" || { not_ok "training started" "$(tail -3 "$WORK/kill.log")"; finish; }
stop_and_wait KILL "$(rank_pid "$job" "$NP" "$VICTIM")" "$job"
status=$STATUS ms=$MS
echo "# SIGKILL: exit $status after $ms ms"
check "SIGKILL of rank $VICTIM: non-zero exit" [ "$status" -ne 0 ]
check "SIGKILL: ends within ${TIMEOUT_S} s + ${MARGIN_S} s" [ "$ms" -le $(((TIMEOUT_S + MARGIN_S) * 1000)) ]
finish
