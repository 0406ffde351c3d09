#!/usr/bin/env bash
# Preemption: SIGTERM (or SIGINT) to one rank of a job mid-epoch makes every rank stop at the
# same step boundary (within the vote's period, app/preemption.h); rank 0 saves a checkpoint there, says so in one line, and every rank
# exits with 128 + the signal's number (no rank left waiting). `--resume auto` then finishes the
# job bitwise identical to the same job run uninterrupted. ARGS, when given, are added to every
# run's flags (a pipeline's: --pipeline-stages 2 --micro-batches 4; there every stage saves its
# tensors at the agreed boundary).
#   preemption_test.sh PATH/TO/dtrain NP [SIGNAL [ARGS...]]
set -uo pipefail
DTRAIN=${1:?usage: preemption_test.sh PATH/TO/dtrain NP [SIGNAL]}
NP=${2:?usage: preemption_test.sh PATH/TO/dtrain NP [SIGNAL]}
SIGNAL=${3:-TERM}
shift $(($# < 3 ? $# : 3))
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# 3000 / NP steps per epoch: an epoch of 300 / NP steps (4800 samples) ended on a quiet machine
# before the signal landed, so the stop fell on the epoch boundary and "mid-epoch" failed.
args=(train "${COMMON[@]}" --train-limit 48000 --batch-size 16 --epochs 2 "$@")
ref="$WORK/ref" run="$WORK/run"
if ! dtrain_at "$NP" "$ref.log" "${args[@]}" --checkpoint-dir "$ref"; then
  not_ok "the uninterrupted job ran" "$(tail -3 "$ref.log")"
  finish
fi

start_dtrain "$NP" "$run.log" "${args[@]}" --checkpoint-dir "$run"
launched=$LAUNCHED
wait_until 120 lines_at_least "$run.log" 2 '^Train Epoch: 1 '  # past step 10
victim=$(rank_pid "$launched" "$NP" $((NP - 1)))
kill "-$SIGNAL" "$victim"
# A rank left waiting would hang the job: give it a minute, then kill it and fail.
(sleep 60 && kill -KILL "$launched" 2>/dev/null) &
watchdog=$!
wait "$launched"
status=$?
pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null  # its sleep too: it would hold ctest's pipe open
signal_number=$(kill -l "$SIGNAL")
check "every rank stopped and the job exited with $((128 + signal_number)) (got $status)" [ "$status" -eq $((128 + signal_number)) ]
stopped=$(grep -c "^dtrain: stopped by SIG$SIGNAL at step " "$run.log")
check "one line says it stopped (got $stopped)" [ "$stopped" -eq 1 ]
grep "^dtrain: stopped" "$run.log" | sed 's/^/# /'
step=$(sed -n "s/^dtrain: stopped by SIG$SIGNAL at step \([0-9]*\) .*/\1/p" "$run.log")
check "the checkpoint of step $step was saved and latest names it" [ -n "$step" -a "$(latest_step "$run")" = "$step" ]
check "it is mid-epoch" [ -z "$(grep '"step_in_epoch": 0,' "$run/step-$step/state.json")" ]

dtrain_at "$NP" "$run.resumed.log" "${args[@]}" --checkpoint-dir "$run" --resume auto
check "the resumed job ran" grep -q "^resume: from $run/step-$step " "$run.resumed.log"
echo "# cmp $(final_model "$ref") $(final_model "$run")"
check "final model.safetensors bitwise identical to the uninterrupted job's (cmp)" cmp "$(final_model "$ref")" "$(final_model "$run")"
same=1
for f in "$(dirname "$(final_model "$ref")")"/*.safetensors; do
  cmp -s "$f" "$(dirname "$(final_model "$run")")/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
check "and its optimizer state (every stage's shard in a pipeline) bitwise" [ "$same" -eq 1 ]
check "the same log lines from the resume point on" same_tail "$ref.log" "$ref" "$run.resumed.log" "$run"
finish
