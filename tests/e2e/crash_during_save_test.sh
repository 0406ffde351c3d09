#!/usr/bin/env bash
# A rank that dies in the middle of a save (the writer's fault injection,
# DTRAIN_CHECKPOINT_FAULT_AFTER_BYTES=K: SIGKILL after K bytes of the save) leaves the previous
# checkpoint complete and `latest` naming it: it still evaluates, and `--resume auto` finishes the
# job bitwise identical to a job never interrupted. K falls in the model file, the optimizer
# file, state.json and the new `latest`.
#   crash_during_save_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: crash_during_save_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: crash_during_save_test.sh PATH/TO/dtrain NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

args=(train "${COMMON[@]}" --train-limit $((400 * NP)) --batch-size 20)
ck="$WORK/ck"
dtrain_at "$NP" "$WORK/ref.log" "${args[@]}" --epochs 2 --checkpoint-dir "$WORK/ref"
dtrain_at "$NP" "$WORK/first.log" "${args[@]}" --epochs 1 --checkpoint-dir "$ck"
first=$(latest_step "$ck")
check "the first epoch saved step-$first" [ -n "$first" ]
before=$(dir_state "$ck/step-$first")

# Where the next save's bytes go: model, optimizer, state.json, then the new latest.
bytes() { sed -n "/\"$1\"/,/bytes/s/.*\"bytes\": \([0-9]*\).*/\1/p" "$ck/step-$first/state.json"; }
model=$(bytes model.safetensors)
optimizer=$(bytes optimizer.safetensors)
state=$(stat -c %s "$ck/step-$first/state.json")
for k in 100 $((model + 1000)) $((model + optimizer + 100)) $((model + optimizer + state + 3)); do
  DTRAIN_CHECKPOINT_FAULT_AFTER_BYTES=$k dtrain_at "$NP" "$WORK/crash.log" "${args[@]}" --epochs 2 \
    --checkpoint-dir "$ck" --resume auto
  status=$?
  check "killed after $k bytes of the save (status $status)" [ "$status" -ne 0 ]
  check "  latest still names step-$first" [ "$(latest_step "$ck")" = "$first" ]
  check "  step-$first is unchanged" [ "$(dir_state "$ck/step-$first")" = "$before" ]
  if [ "$k" -gt $((model + optimizer + state)) ]; then  # in `latest`: the new step-N is complete, unnamed
    check "  the new checkpoint was complete but latest was not replaced" [ -d "$ck/step-$((2 * first))" ]
  fi
  dtrain_at "$NP" "$WORK/eval.log" eval --weights "$ck" --data "$DATA" --test-limit 200 --threads 1
  check "  it still evaluates ($(grep '^Test set' "$WORK/eval.log"))" grep -q '^Test set: ' "$WORK/eval.log"
done

dtrain_at "$NP" "$WORK/resumed.log" "${args[@]}" --epochs 2 --checkpoint-dir "$ck" --resume auto
check "--resume auto resumes from step-$first" grep -q "^resume: from $ck/step-$first " "$WORK/resumed.log"
echo "# cmp $(final_model "$WORK/ref") $(final_model "$ck")"
check "and finishes bitwise identical to the uninterrupted job (cmp)" cmp "$(final_model "$WORK/ref")" "$(final_model "$ck")"
check "no temporary entry is left once a save succeeded" [ -z "$(find "$ck" -maxdepth 1 -name '.tmp-*')" ]
finish
