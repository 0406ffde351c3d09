#!/usr/bin/env bash
# Checkpoints of a pipeline (Note [Pipeline checkpoints] in train/checkpointer.h), at NP 2 (P 2)
# and NP 4 (P 2 x D 2): a run stopped at step 20 (mid-epoch) and resumed at the same layout ends
# with the uninterrupted run's files bit for bit (model.safetensors and every stage's optimizer
# shard); the checkpoint's model.safetensors holds the unsplit model's names and equals the
# unsplit model's (data parallel at np D, batch B per rank: the same global batch) within 1e-5
# relative (M accumulated GEMMs round unlike one), and `dtrain eval` loads it; a pipeline
# checkpoint resumes in the unsplit model (P = 1) and the unsplit model's checkpoint resumes in
# the pipeline, each ending within 1e-5 of the unsplit run; a checkpoint of another model is one
# line and a non-zero exit, and so is a stage over --memory-per-rank while the other fits (every
# rank stops, none waits); `dtrain checkpoint consolidate` makes one optimizer file of the shards.
# Usage: pipeline_checkpoint_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

pipeline_layout "$NP"
# 1536 samples = 24 steps of the global batch 64 per epoch; 48 in all.
RUN=("${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --checkpoint-every 10)
PIPE=(--batch-size "$B" --pipeline-stages "$P" --micro-batches "$M")
ONE=(--batch-size "$B")  # the unsplit model at np D: the same global batch and batch-size setting
close() { /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$1" "$2" 1e-5 >"$WORK/close.log" 2>&1; }

dtrain_at "$NP" "$WORK/full.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 2 --checkpoint-dir "$WORK/full"
check "P $P x D $D: the uninterrupted run saved step 48" [ -f "$WORK/full/step-48/model.safetensors" ]
dtrain_at "$NP" "$WORK/part.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 1 --checkpoint-dir "$WORK/part"
dtrain_at "$NP" "$WORK/res.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 2 --resume "$WORK/part/step-20" \
  --checkpoint-dir "$WORK/res"
check "resumed from step 20 (mid-epoch)" grep -q "resume: from .*step-20 (global step 20; epoch 1, 20 step(s) and 1280 samples" "$WORK/res.log"
same=1
for f in "$WORK"/full/step-48/*.safetensors; do
  cmp -s "$f" "$WORK/res/step-48/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
check "resume at P $P x D $D: model and every optimizer shard bit for bit the uninterrupted run's" [ "$same" -eq 1 ]

dtrain_at "$D" "$WORK/one.log" train "${RUN[@]}" "${ONE[@]}" --epochs 2 --checkpoint-dir "$WORK/one"
close "$WORK/one/step-48/model.safetensors" "$WORK/full/step-48/model.safetensors"
check "model.safetensors: the unsplit model's names, within 1e-5 of the unsplit model's" [ $? -eq 0 ]
dtrain_at 1 "$WORK/eval.log" eval --weights "$WORK/full/step-48" --data "$DATA" --test-limit 500
check "dtrain eval loads it and gets the run's test-set line" \
  [ "$(grep '^Test set' "$WORK/eval.log")" = "$(grep '^Test set' "$WORK/full.log" | tail -n 1)" ]

dtrain_at 1 "$WORK/consolidate.log" checkpoint consolidate "$WORK/full" -o "$WORK/optimizer.safetensors"
check "dtrain checkpoint consolidate: the stages' shards make one file of the 8 momentum tensors" \
  grep -q "from $NP shards: 8 tensors" "$WORK/consolidate.log"

dtrain_at "$D" "$WORK/to1.log" train "${RUN[@]}" "${ONE[@]}" --epochs 2 --resume "$WORK/part/step-20" \
  --checkpoint-dir "$WORK/to1"
close "$WORK/one/step-48/model.safetensors" "$WORK/to1/step-48/model.safetensors"
check "P $P x D $D -> P = 1 at np $D: resumed at sample 1280, ends within 1e-5 of the unsplit model's run" [ $? -eq 0 ]
dtrain_at "$NP" "$WORK/toP.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 2 --resume "$WORK/one/step-40" \
  --checkpoint-dir "$WORK/toP"
check "P = 1 at np $D -> P $P x D $D: resumed mid-epoch 2" grep -q "resume: from .*step-40 (global step 40; epoch 2, 16 step(s) and 1024 samples" "$WORK/toP.log"
close "$WORK/one/step-48/model.safetensors" "$WORK/toP/step-48/model.safetensors"
check "P = 1 at np $D -> P $P x D $D: ends within 1e-5 of the unsplit model's run" [ $? -eq 0 ]

dtrain_at "$NP" "$WORK/other.log" train "${COMMON[@]}" --train-limit 1536 --hidden 64,48 "${PIPE[@]}" --epochs 2 \
  --resume "$WORK/full/step-48"
status=$?
check "a checkpoint of another model: non-zero exit" [ "$status" -ne 0 ]
check "a checkpoint of another model: one line naming the widths" \
  [ "$(grep -c 'model.hidden: checkpoint \[64, \?48, \?32\]' "$WORK/other.log")" -eq 1 ]

# A stage too large for --memory-per-rank while the other fits: every rank stops with its one line.
dtrain_at "$NP" "$WORK/big.log" train "${COMMON[@]}" --train-limit 1536 --hidden 256,256,256 "${PIPE[@]}" \
  --pipeline-split 2 --memory-per-rank 2M
status=$?
check "a stage over --memory-per-rank: the resources exit (71), not a hang" [ "$status" -eq 71 ]
check "a stage over --memory-per-rank: every rank stops on its own (no MPI_Abort)" \
  sh -c "! grep -q 'errorcode' '$WORK/big.log'"
check "a stage over --memory-per-rank: one line naming the stage" \
  [ "$(grep -c 'mlp stage (layers 0-1) needs .* more than its memory budget of 2.1 MB' "$WORK/big.log")" -eq 1 ]
finish
