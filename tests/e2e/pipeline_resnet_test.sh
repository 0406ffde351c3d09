#!/usr/bin/env bash
# --model resnet18 through the pipeline (Note [Pipeline BatchNorm] in pipeline/pipeline_stage.h,
# Note [ResNet pipeline stages] in model/models.h) at NP 2 (P 2) and NP 4 (P 2 x D 2), batch 32
# cut into 4 micro-batches: BatchNorm normalises each micro-batch of 8 rows and moves its running
# statistics once per micro-batch, so the run is the data-parallel ResNet's at np D with
# --batch-size 8 --accumulate 4 (the same rows, replica 0's statistics broadcast each step): the
# same test-set lines (loss and accuracy, read through the running statistics), and not those of
# --batch-size 32 without accumulation (BatchNorm over 32 rows). Checkpoints carry BatchNorm's
# running statistics (Note [Pipeline checkpoints] in train/checkpointer.h): a run stopped
# mid-epoch and resumed at the same layout ends with the uninterrupted run's files bit for bit;
# `dtrain eval` of its model.safetensors (the unsplit ResNet, torchvision's names) gets the run's
# test-set line; it resumes at P = 1 and the unsplit model's checkpoint resumes in the pipeline;
# --init-weights loads the buffers (a short run from them gets the accumulated data-parallel
# run's test-set line from the same file).
# Usage: pipeline_resnet_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
D=$((NP / 2))
RUN=("${COMMON[@]}" --train-limit 512 --model resnet18 --width 4 --epochs 2)
tests_of() { grep '^Test set' "$1"; }

dtrain_at "$NP" "$WORK/pipe.log" train "${RUN[@]}" --batch-size 32 --pipeline-stages 2 --micro-batches 4
check "resnet18 P 2 x D $D ran (exit $?)" grep -q "^pipeline: 2 stage(s) x $D replica(s)" "$WORK/pipe.log"
dtrain_at "$D" "$WORK/acc.log" train "${RUN[@]}" --batch-size 8 --accumulate 4 --checkpoint-dir "$WORK/acc"
check "resnet18 P 2 x D $D: the test-set lines of np $D --batch-size 8 --accumulate 4" \
  same_nonempty "$(tests_of "$WORK/pipe.log")" "$(tests_of "$WORK/acc.log")"
dtrain_at "$D" "$WORK/whole.log" train "${RUN[@]}" --batch-size 32
! same_nonempty "$(tests_of "$WORK/pipe.log")" "$(tests_of "$WORK/whole.log")"
check "not those of --batch-size 32 unaccumulated (BatchNorm over 32 rows)" [ $? -eq 0 ]

# --sync-bn (Note [Pipeline SyncBatchNorm]) at P 2 x D 2: a micro-batch's statistics over both
# replicas. The run is the data-parallel SyncBatchNorm ResNet's at np D with --batch-size 8
# --accumulate 4, model.safetensors byte for byte (16 steps); and after one step (batch 64) it is
# within 1e-5 of P 2 x D 1 at twice the batch (SyncBatchNorm's property; over more steps BatchNorm
# amplifies the rounding: the data-parallel np 2 --sync-bn run is itself 2e-2 from np 1 at 4 steps).
if [ "$D" -gt 1 ]; then
  SB=(--batch-size 32 --pipeline-stages 2 --micro-batches 4 --sync-bn)
  dtrain_at "$NP" "$WORK/sb.log" train "${RUN[@]}" "${SB[@]}" --checkpoint-dir "$WORK/sb"
  dtrain_at "$D" "$WORK/sbd.log" train "${RUN[@]}" --batch-size 8 --accumulate 4 --sync-bn --checkpoint-dir "$WORK/sbd"
  check "resnet18 --sync-bn P 2 x D $D: model.safetensors byte for byte the data-parallel --sync-bn run's" cmp \
    "$WORK/sb/step-$((1024 / (32 * D)))/model.safetensors" "$WORK/sbd/step-$((1024 / (32 * D)))/model.safetensors"
  check "resnet18 --sync-bn P 2 x D $D: the data-parallel --sync-bn run's test-set lines" \
    same_nonempty "$(tests_of "$WORK/sb.log")" "$(tests_of "$WORK/sbd.log")"
  ONE_STEP=("${COMMON[@]}" --train-limit 64 --model resnet18 --width 4 --epochs 1 --pipeline-stages 2 --micro-batches 4)
  dtrain_at "$NP" "$WORK/sb2.log" train "${ONE_STEP[@]}" --batch-size 32 --sync-bn --checkpoint-dir "$WORK/sb2"
  dtrain_at 2 "$WORK/sb1.log" train "${ONE_STEP[@]}" --batch-size 64 --checkpoint-dir "$WORK/sb1"
  /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$WORK/sb1/step-1/model.safetensors" \
    "$WORK/sb2/step-1/model.safetensors" 1e-5 >"$WORK/sb_close.log" 2>&1
  status=$?
  check "resnet18 --sync-bn P 2 x D $D: one step within 1e-5 of P 2 x D 1 at batch 64" \
    [ "$status" -eq 0 ]
  echo "# $(tail -n 1 "$WORK/sb_close.log")"
fi

# Checkpoints: 512 / (32 D) steps an epoch; MID the last save (every 5) before the first epoch's end.
PIPE=(--batch-size 32 --pipeline-stages 2 --micro-batches 4 --checkpoint-every 5)
LAST=$((1024 / (32 * D)))
MID=$(((LAST / 2 - 1) / 5 * 5))
dtrain_at "$NP" "$WORK/full.log" train "${RUN[@]}" "${PIPE[@]}" --checkpoint-dir "$WORK/full"
check "resnet18 P 2 x D $D: the uninterrupted run saved step $LAST" [ -f "$WORK/full/step-$LAST/model.safetensors" ]
dtrain_at "$NP" "$WORK/part.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 1 --checkpoint-dir "$WORK/part"
dtrain_at "$NP" "$WORK/res.log" train "${RUN[@]}" "${PIPE[@]}" --resume "$WORK/part/step-$MID" \
  --checkpoint-dir "$WORK/res"
check "resnet18: resumed from step $MID (mid-epoch)" \
  grep -q "resume: from .*step-$MID (global step $MID; epoch 1" "$WORK/res.log"
same=1
for f in "$WORK"/full/step-$LAST/*.safetensors; do
  cmp -s "$f" "$WORK/res/step-$LAST/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
check "resnet18 resume at P 2 x D $D: model (running statistics too) and every optimizer shard bit for bit" \
  [ "$same" -eq 1 ]
check "model.safetensors holds the running statistics under torchvision's names" \
  sh -c "grep -aq '\"layer4.1.bn2.running_var\"' '$WORK/full/step-$LAST/model.safetensors' &&
         grep -aq '\"layer4.1.bn2.num_batches_tracked\"' '$WORK/full/step-$LAST/model.safetensors'"
# The checkpoint holds replica 0's statistics, as the data-parallel run's holds rank 0's; the
# run's own test-set line reads each replica's own (D > 1: not the same line, as at P = 1).
dtrain_at 1 "$WORK/eval.log" eval --weights "$WORK/full/step-$LAST" --data "$DATA" --test-limit 500
dtrain_at 1 "$WORK/eval_acc.log" eval --weights "$WORK/acc/step-$LAST" --data "$DATA" --test-limit 500
check "resnet18: dtrain eval of the pipeline's checkpoint = of the accumulated data-parallel run's" \
  same_nonempty "$(tests_of "$WORK/eval.log")" "$(tests_of "$WORK/eval_acc.log")"
if [ "$D" -eq 1 ]; then
  check "resnet18: dtrain eval of the pipeline's checkpoint gets the run's test-set line" \
    same_nonempty "$(tests_of "$WORK/eval.log")" "$(tests_of "$WORK/full.log" | tail -n 1)"
fi

dtrain_at "$D" "$WORK/to1.log" train "${RUN[@]}" --batch-size 32 --checkpoint-every 5 --resume "$WORK/part/step-$MID" \
  --checkpoint-dir "$WORK/to1"
status=$?
check "resnet18 P 2 x D $D -> P = 1 at np $D: resumed at step $MID and finished (exit $status)" \
  sh -c "[ $status -eq 0 ] && grep -q 'resume: from .*step-$MID' '$WORK/to1.log' &&
         [ -f '$WORK/to1/step-$LAST/model.safetensors' ]"
dtrain_at "$NP" "$WORK/toP.log" train "${RUN[@]}" "${PIPE[@]}" --resume "$WORK/to1/step-$((LAST / 5 * 5))" \
  --checkpoint-dir "$WORK/toP"
status=$?
check "resnet18 P = 1 at np $D -> P 2 x D $D: resumed in epoch 2 and finished (exit $status)" \
  sh -c "[ $status -eq 0 ] && grep -q 'resume: from .*(global step .*; epoch 2' '$WORK/toP.log'"

# --init-weights: 64 samples (8 / D micro-batches, each moving the running statistics by 0.1)
# leave the loaded statistics weight 0.9^(8 / D) in the test-set line, which the accumulated
# data-parallel run from the same file matches only when both loaded them.
SHORT=("${COMMON[@]}" --train-limit 64 --model resnet18 --width 4 --epochs 1
       --init-weights "$WORK/full/step-$LAST/model.safetensors")
dtrain_at "$NP" "$WORK/initp.log" train "${SHORT[@]}" --batch-size 32 --pipeline-stages 2 --micro-batches 4
dtrain_at "$D" "$WORK/inita.log" train "${SHORT[@]}" --batch-size 8 --accumulate 4
check "resnet18 --init-weights: the pipeline's test-set line is the accumulated data-parallel run's" \
  same_nonempty "$(tests_of "$WORK/initp.log")" "$(tests_of "$WORK/inita.log")"
finish
