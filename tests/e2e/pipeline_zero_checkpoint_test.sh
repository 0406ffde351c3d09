#!/usr/bin/env bash
# Checkpoints of a pipeline under --zero 1 (Note [Pipeline ZeRO-1] in app/pipeline_zero.h, Note
# [Pipeline checkpoints] in train/checkpointer.h), at NP 4 (P 2 x D 2) with AdamW:
# - every replica saves its slices of its stage's state: `dtrain checkpoint consolidate` makes the
#   same optimizer file, byte for byte, of the --zero 1 run's 4 shards as of the unsharded
#   pipeline's (whose model.safetensors it also equals bit for bit);
# - a run stopped at step 20 (mid-epoch) and resumed with --zero 1 ends with the uninterrupted
#   run's files bit for bit (model.safetensors and every shard); resumed without --zero, the same
#   model bit for bit (the slices re-cut whole); resumed with --zero 2 (the gradients
#   reduce-scattered, the same shards), the same files bit for bit;
# - the --zero 1 checkpoint resumes at P = 1 (np 2, data parallel, no --zero), and that run's
#   checkpoint resumes at P 2 x D 2 with --zero 1, each ending within 1e-5 of the uninterrupted
#   pipeline (the unsplit model rounds its GEMMs unlike M accumulated ones).
# Usage: pipeline_zero_checkpoint_test.sh DTRAIN
set -uo pipefail
DTRAIN=$1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

pipeline_layout 4
# 1536 samples = 24 steps of the global batch 64 per epoch; 48 in all.
RUN=("${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --checkpoint-every 10 --optimizer adamw)
PIPE=(--batch-size "$B" --pipeline-stages "$P" --micro-batches "$M")
ONE=(--batch-size "$B")  # the unsplit model at np D: the same global batch
close() { /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$1" "$2" 1e-5 >"$WORK/close.log" 2>&1; }

dtrain_at 4 "$WORK/full.log" train "${RUN[@]}" "${PIPE[@]}" --zero 1 --epochs 2 --checkpoint-dir "$WORK/full"
check "--zero 1 at P $P x D $D: the uninterrupted run saved step 48" [ -f "$WORK/full/step-48/model.safetensors" ]
dtrain_at 4 "$WORK/plain.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 2 --checkpoint-dir "$WORK/plain"
check "--zero 1: model.safetensors bit for bit the unsharded pipeline's" \
  cmp "$WORK/full/step-48/model.safetensors" "$WORK/plain/step-48/model.safetensors"
consolidate full plain
check "--zero 1: 4 shards consolidated (8 exp_avg, 8 exp_avg_sq, 8 step counts)" \
  grep -q "from 4 shards: 16 tensors, 8 counts" "$WORK/consolidate-full.log"
check "--zero 1: the replicas' slices consolidate to the unsharded pipeline's optimizer state, byte for byte" \
  cmp "$WORK/full-optimizer.safetensors" "$WORK/plain-optimizer.safetensors"

dtrain_at 4 "$WORK/part.log" train "${RUN[@]}" "${PIPE[@]}" --zero 1 --epochs 1 --checkpoint-dir "$WORK/part"
dtrain_at 4 "$WORK/res.log" train "${RUN[@]}" "${PIPE[@]}" --zero 1 --epochs 2 --resume "$WORK/part/step-20" \
  --checkpoint-dir "$WORK/res"
check "--zero 1: resumed from step 20 (mid-epoch)" \
  grep -q "resume: from .*step-20 (global step 20; epoch 1, 20 step(s) and 1280 samples" "$WORK/res.log"
check "--zero 1 resumed at P $P x D $D: model and every optimizer shard bit for bit the uninterrupted run's" \
  same_files "$WORK/full/step-48" "$WORK/res/step-48"
dtrain_at 4 "$WORK/unz.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 2 --resume "$WORK/part/step-20" \
  --checkpoint-dir "$WORK/unz"
check "--zero 1 checkpoint resumed without --zero: the uninterrupted run's model bit for bit" \
  cmp "$WORK/full/step-48/model.safetensors" "$WORK/unz/step-48/model.safetensors"
dtrain_at 4 "$WORK/z2.log" train "${RUN[@]}" "${PIPE[@]}" --zero 2 --epochs 2 --resume "$WORK/part/step-20" \
  --checkpoint-dir "$WORK/z2"
check "--zero 1 checkpoint resumed with --zero 2: model and every shard bit for bit the --zero 1 run's" \
  same_files "$WORK/full/step-48" "$WORK/z2/step-48"

dtrain_at "$D" "$WORK/to1.log" train "${RUN[@]}" "${ONE[@]}" --epochs 2 --resume "$WORK/part/step-20" \
  --checkpoint-dir "$WORK/to1"
check "--zero 1 P $P x D $D -> P = 1 at np $D without --zero: resumed at sample 1280" \
  grep -q "resume: from .*step-20 (global step 20; epoch 1, 20 step(s) and 1280 samples" "$WORK/to1.log"
close "$WORK/full/step-48/model.safetensors" "$WORK/to1/step-48/model.safetensors"
check "--zero 1 P $P x D $D -> P = 1: ends within 1e-5 of the uninterrupted pipeline's run" [ $? -eq 0 ]
dtrain_at 4 "$WORK/toZ.log" train "${RUN[@]}" "${PIPE[@]}" --zero 1 --epochs 2 --resume "$WORK/to1/step-40" \
  --checkpoint-dir "$WORK/toZ"
check "P = 1 at np $D -> --zero 1 P $P x D $D: resumed mid-epoch 2" \
  grep -q "resume: from .*step-40 (global step 40; epoch 2, 16 step(s) and 1024 samples" "$WORK/toZ.log"
close "$WORK/full/step-48/model.safetensors" "$WORK/toZ/step-48/model.safetensors"
check "P = 1 at np $D -> --zero 1 P $P x D $D: ends within 1e-5 of the uninterrupted pipeline's run" [ $? -eq 0 ]
finish
