#!/usr/bin/env bash
# --amp fp16 end to end (Note [Loss scaling]): with infinite gradients injected after the
# all-reduce (DTRAIN_TEST_POISON_GRADS; at NP > 1 some on one rank only), the log lines and the
# --metrics records count the skipped steps; a run stopped at an epoch end and resumed equals the
# uninterrupted run bitwise (model.safetensors, optimizer state) and carries the scale, its growth
# streak and the skipped-step count (state.json's grad_scaler); a scale that falls below 1 is one
# warning line.
#   fp16_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: fp16_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: fp16_test.sh PATH/TO/dtrain NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

last=$((NP - 1))
# 30 steps an epoch; 3 poisoned steps in each epoch (one on rank 0 only, one on the last rank only).
export DTRAIN_TEST_POISON_GRADS="3,9@0,12@$last,41,44@$last,45"
args=(train "${COMMON[@]}" --amp fp16 --loss-scale-growth-interval 4 --batch-size 16 --train-limit $((480 * NP)))
ref="$WORK/ref" run="$WORK/run"
grad_scaler() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["grad_scaler"], sort_keys=True))' "$1"; }

if ! dtrain_at "$NP" "$ref.log" "${args[@]}" --epochs 2 --checkpoint-dir "$ref" --metrics "$ref.jsonl"; then
  not_ok "uninterrupted run" "$(tail -3 "$ref.log")"
  finish
fi
if ! dtrain_at "$NP" "$run.log" "${args[@]}" --epochs 1 --checkpoint-dir "$run"; then
  not_ok "first epoch" "$(tail -3 "$run.log")"
  finish
fi
resumed_from=$(latest_step "$run")
if ! dtrain_at "$NP" "$run.resumed.log" "${args[@]}" --epochs 2 --checkpoint-dir "$run" --resume auto; then
  not_ok "resumed run" "$(tail -3 "$run.resumed.log")"
  finish
fi
echo "# cmp $(final_model "$ref") $(final_model "$run")"
check "final model.safetensors bitwise identical (cmp)" cmp "$(final_model "$ref")" "$(final_model "$run")"
check "optimizer state bitwise identical (cmp)" \
  cmp "$(dirname "$(final_model "$ref")")/optimizer.safetensors" "$(dirname "$(final_model "$run")")/optimizer.safetensors"
ref_state=$(grad_scaler "$(dirname "$(final_model "$ref")")/state.json")
run_state=$(grad_scaler "$(dirname "$(final_model "$run")")/state.json")
echo "# grad_scaler: $ref_state / $run_state"
check "the loss scale's state is the uninterrupted run's" [ "$ref_state" = "$run_state" ]
# The six poisoned steps, and any the growing scale overflowed by itself (it doubles every 4 good steps).
skipped=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["skipped_steps"])' "$ref_state")
check "at least the six poisoned steps skipped ($skipped)" [ "$skipped" -ge 6 ]
check "the last metrics record counts them" bash -c "tail -1 '$ref.jsonl' | grep -q '\"skipped_steps\":$skipped[,}]'"
# The last log line (batch 20 of epoch 2) and the metrics record of that step agree.
logged=$(grep '^Train Epoch' "$ref.log" | tail -1 | sed -n 's/.* Skipped: \([0-9]*\)$/\1/p')
recorded=$(grep '"type":"step"' "$ref.jsonl" | tail -1 | sed -n 's/.*"skipped_steps":\([0-9]*\).*/\1/p')
check "the log line and the metrics record count alike ($logged, $recorded)" [ -n "$logged" -a "$logged" = "$recorded" ]
check "the same log lines from the resume point on" \
  diff <(log_lines_after "$ref.log" "$ref" "$resumed_from") <(log_lines "$run.resumed.log" "$run")

# Seventeen halvings take 2^16 below 1: one warning, once.
export DTRAIN_TEST_POISON_GRADS=$(seq -s, 1 19)
dtrain_at "$NP" "$WORK/collapse.log" train "${COMMON[@]}" --amp fp16 --batch-size 16 --train-limit $((480 * NP))
check "a scale below 1 is one warning line" \
  [ "$(grep -c '^warning: the fp16 loss scale fell below 1 (0.5, 17 step(s) skipped)' "$WORK/collapse.log")" = 1 ]
finish
