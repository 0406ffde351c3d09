#!/usr/bin/env bash
# dtrain train --pipeline-stages end to end (Note [Pipeline schedules] in pipeline/schedule.h):
# at NP 2 (P 2), NP 3 (P 3) and NP 4 (P 2 x D 2) the log lines of the MLP and of the CNN equal one process's on the same
# global batch (each loss within 1e-5 relative: M accumulated GEMMs round unlike one; the rest of
# each line, the test set's accuracy included, exactly), with --accumulate 2 too (and the weights
# within 1e-5 of the unsplit model's on the same global batch); GPipe and 1F1B end with the same
# parameters bit for bit (their fingerprints); fewer micro-batches than stages, and ranks that
# disagree on --pipeline-stages, are one line and a non-zero exit.
# Usage: pipeline_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

pipeline_layout "$NP"
# Full batches only (the pipeline drops a partial last batch): 1536 = 24 x 64 = 32 x 48.
RUN=("${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --epochs 2 --json)

dtrain_at 1 "$WORK/ref.log" train "${RUN[@]}" --batch-size $((B * D))
check "np 1 reference ran" [ "$(lines "$WORK/ref.log" | wc -l)" -gt 4 ]
for schedule in 1f1b gpipe; do
  dtrain_at "$NP" "$WORK/$schedule.log" train "${RUN[@]}" --batch-size "$B" --pipeline-stages "$P" \
    --micro-batches "$M" --pipeline-schedule "$schedule" --metrics "$WORK/$schedule.jsonl"
  check "$schedule: P $P x D $D logs the np 1 run's losses and test set" \
    same_lines "$WORK/ref.log" "$WORK/$schedule.log"
done
# --metrics: the last stage's step and epoch records (the losses of its log lines), and one
# record of every stage's idle share and held inputs.
check "--metrics: a step record per logged line with its loss, 2 epoch records, every stage's figures" \
  python3 - "$WORK/1f1b.jsonl" "$WORK/1f1b.log" "$P" "$M" <<'PY'
import json, re, sys
records = [json.loads(l) for l in open(sys.argv[1])]
logged = [float(m.group(1)) for m in re.finditer(r"^Train Epoch.*Loss: ([0-9.]+)", open(sys.argv[2]).read(), re.M)]
steps = [r for r in records if r["type"] == "step"]
epochs = [r for r in records if r["type"] == "epoch"]
pipe = [r for r in records if r["type"] == "pipeline"]
P, M = int(sys.argv[3]), int(sys.argv[4])
ok = (len(steps) == len(logged) > 0 and all(abs(s["loss"] - l) <= 1e-6 * max(1, l) for s, l in zip(steps, logged))
      and len(epochs) == 2 and all(0 < e["test_accuracy"] <= 1 for e in epochs)
      and len(pipe) == 1 and pipe[0]["stages"] == P and len(pipe[0]["idle_share"]) == P
      and pipe[0]["micro_batches"] == M and len(pipe[0]["peak_held_inputs"]) == P)
if not ok: print(f"# {len(steps)} step records for {len(logged)} lines, {len(epochs)} epochs, pipeline {pipe}")
sys.exit(0 if ok else 1)
PY
check "gpipe and 1f1b end bit for bit alike" \
  same_nonempty "$(fingerprint "$WORK/1f1b.log")" "$(fingerprint "$WORK/gpipe.log")"

# The CNN (convolutions, pooling: 4-D activations between stages), one epoch.
CNN=("${COMMON[@]}" --model cnn --train-limit 768 --log-interval 4)
dtrain_at 1 "$WORK/cnn_ref.log" train "${CNN[@]}" --batch-size $((B * D))
dtrain_at "$NP" "$WORK/cnn.log" train "${CNN[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M"
check "cnn: P $P x D $D logs the np 1 run's losses and test set" same_lines "$WORK/cnn_ref.log" "$WORK/cnn.log"

# --accumulate 2 (Note [Pipeline loss]): two pipeline steps of B / 2 rows per optimizer step, the
# stage's gradient sum on the second only. Its log lines are one process's with --accumulate 2,
# and its weights the unsplit model's on the same global batch (D x B rows, one step) within 1e-5.
ACC=("${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --epochs 2)
dtrain_at 1 "$WORK/acc_ref.log" train "${ACC[@]}" --batch-size $((B * D)) --checkpoint-dir "$WORK/acc_ref"
dtrain_at 1 "$WORK/acc_one.log" train "${ACC[@]}" --batch-size $((B * D / 2)) --accumulate 2
dtrain_at "$NP" "$WORK/acc.log" train "${ACC[@]}" --batch-size $((B / 2)) --accumulate 2 --pipeline-stages "$P" \
  --micro-batches "$M" --checkpoint-dir "$WORK/acc"
check "--accumulate 2: P $P x D $D logs one process's --accumulate 2 losses and test set" \
  same_lines "$WORK/acc_one.log" "$WORK/acc.log"
check "--accumulate 2: as many optimizer steps as the unsplit model's on the same global batch" \
  same_nonempty "$(latest_step "$WORK/acc")" "$(latest_step "$WORK/acc_ref")"
/usr/bin/python3 "$(dirname "$0")/weights_close.py" "$(final_model "$WORK/acc_ref")" "$(final_model "$WORK/acc")" 1e-5 \
  >"$WORK/acc_close.log" 2>&1
check "--accumulate 2: weights within 1e-5 of the unsplit model's on the same global batch" [ $? -eq 0 ]
sed 's/^/# /' "$WORK/acc_close.log" | tail -2

# --init-weights: a checkpoint's model.safetensors (the unsplit names) starts the pipeline where
# it starts one process.
dtrain_at 1 "$WORK/save.log" train "${COMMON[@]}" --train-limit 512 --hidden 64,48,32 --checkpoint-dir "$WORK/ck"
weights=$(ls -d "$WORK"/ck/step-*/ | tail -1)model.safetensors
dtrain_at 1 "$WORK/init_ref.log" train "${RUN[@]}" --batch-size $((B * D)) --init-weights "$weights"
dtrain_at "$NP" "$WORK/init.log" train "${RUN[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M" \
  --init-weights "$weights"
check "--init-weights: P $P x D $D logs the np 1 run's from the same file" same_lines "$WORK/init_ref.log" "$WORK/init.log"

dtrain_at "$NP" "$WORK/few.log" train "${RUN[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches $((P - 1))
status=$?
check "M < P: non-zero exit" [ "$status" -ne 0 ]
check "M < P: one line naming both" grep -qF -- "--micro-batches $((P - 1)) is fewer than --pipeline-stages $P" "$WORK/few.log"

# A diverging pipeline ends the job with the diverged status (3), as the data-parallel trainer
# does, though only the last stage sees the loss.
dtrain_at "$NP" "$WORK/diverge.log" train "${RUN[@]}" --batch-size "$B" --pipeline-stages "$P" --lr 1e30
status=$?
check "a diverged pipeline exits 3 (got $status)" [ "$status" = 3 ]
check "a diverged pipeline: one line saying so" grep -q "training diverged" "$WORK/diverge.log"

timeout 120 mpirun --oversubscribe --bind-to none -np 1 "$DTRAIN" train "${RUN[@]}" --pipeline-stages "$NP" --micro-batches 4 --batch-size 32 : \
  -np $((NP - 1)) "$DTRAIN" train "${RUN[@]}" --batch-size 32 >"$WORK/disagree.log" 2>&1
status=$?
check "ranks that disagree on --pipeline-stages: non-zero exit, no hang" failed_not_timed_out "$status"
check "ranks that disagree on --pipeline-stages: one line naming it" \
  grep -qF "ranks disagree on --pipeline-stages: rank 0 has $NP" "$WORK/disagree.log"
finish
