#!/usr/bin/env bash
# --sampler uneven through the pipeline (Note [Pipeline Join] in pipeline/pipeline_stage.h) at
# NP 4 (P 2 x D 2, batch 32, M 4) on 767 samples: replica 0's share is 384 (12 full batches),
# replica 1's 383 (11 full batches, 31 left over), so replica 1's stages run the epoch's 12th step
# joined (zeros in, a zero loss gradient, every transfer and sum as a real step's):
# - the run ends (no rank waits on another) with exit 0, counting each replica's full batches
#   (12 + 11 of 32: 736 samples an epoch), and its last step moved the weights: they differ from
#   --sampler drop-last's (11 steps each, 704 samples);
# - stopped at the first epoch's end and resumed, the uninterrupted run's model bit for bit;
# - mid-epoch checkpoints stay refused in one line (exit 2), and a SIGTERM mid-epoch stops every
#   rank at the agreed boundary (exit 143) saving nothing there, in one line.
# The weights' equivalence with the unsplit model on the rows present is mpi/pipeline_test's
# Pipeline.UnevenInputsJoinedReplicasShadowTheirStepsAsTheUnsplitModelOnTheRowsPresent.
# Usage: pipeline_uneven_test.sh DTRAIN
set -uo pipefail
DTRAIN=$1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

RUN=("${COMMON[@]}" --train-limit 767 --hidden 64,48,32 --batch-size 32 --pipeline-stages 2 --micro-batches 4 --json)
dtrain_at 4 "$WORK/uneven.log" train "${RUN[@]}" --sampler uneven --epochs 2 --checkpoint-dir "$WORK/uneven"
check "--sampler uneven: P 2 x D 2 ends with exit 0" [ $? -eq 0 ]
check "--sampler uneven: each epoch counts the replicas' full batches (12 + 11 of 32: 736 samples)" \
  [ "$(grep -c '^Epoch [12]: .*(736 samples in' "$WORK/uneven.log")" -eq 2 ]
dtrain_at 4 "$WORK/drop.log" train "${RUN[@]}" --sampler drop-last --epochs 2
check "--sampler drop-last: 11 steps a replica (704 samples)" grep -q '^Epoch 1: .*(704 samples in' "$WORK/drop.log"
! same_nonempty "$(fingerprint "$WORK/uneven.log")" "$(fingerprint "$WORK/drop.log")"
check "--sampler uneven: the joined step moved the weights (not drop-last's)" [ $? -eq 0 ]

# With uniform --class-weights every logged loss is the unweighted run's, the joined step's too
# (each replica's share of the weighted mean summed over D, not averaged over the replicas that
# had a batch: that doubled it).
dtrain_at 4 "$WORK/plain1.log" train "${RUN[@]}" --sampler uneven --epochs 1 --log-interval 1
dtrain_at 4 "$WORK/weighted1.log" train "${RUN[@]}" --sampler uneven --epochs 1 --log-interval 1 \
  --class-weights 1,1,1,1,1,1,1,1,1,1
check "--sampler uneven: the joined step's loss is logged ([704/767])" grep -q '^Train Epoch: 1 \[704/767' "$WORK/plain1.log"
check "--sampler uneven --class-weights all 1: every logged loss is the unweighted run's" \
  same_nonempty "$(grep '^Train Epoch' "$WORK/plain1.log")" "$(grep '^Train Epoch' "$WORK/weighted1.log")"

dtrain_at 4 "$WORK/part.log" train "${RUN[@]}" --sampler uneven --epochs 1 --checkpoint-dir "$WORK/part"
dtrain_at 4 "$WORK/res.log" train "${RUN[@]}" --sampler uneven --epochs 2 --resume auto --checkpoint-dir "$WORK/part"
check "--sampler uneven: resumed at the epoch end, the uninterrupted run's model bit for bit" \
  cmp "$(final_model "$WORK/uneven")" "$(final_model "$WORK/part")"

dtrain_at 4 "$WORK/every.log" train "${RUN[@]}" --sampler uneven --checkpoint-every 5 --checkpoint-dir "$WORK/every"
status=$?
check "--sampler uneven --checkpoint-every 5: exit 2" [ "$status" -eq 2 ]
check "--sampler uneven --checkpoint-every 5: one line naming the epoch-end checkpoints" \
  grep -q "checkpoints are saved at epoch ends only" "$WORK/every.log"
# SIGTERM to the last rank mid-epoch: every rank stops at the agreed boundary (the vote after the
# Join vote), exit 143, and nothing is saved there (one line says why), no rank left waiting.
start_dtrain 4 "$WORK/stop.log" train "${COMMON[@]}" --train-limit 47999 --hidden 64,48,32 --batch-size 16 \
  --pipeline-stages 2 --micro-batches 4 --sampler uneven --epochs 2 --checkpoint-dir "$WORK/stop"
launched=$LAUNCHED
wait_until 120 lines_at_least "$WORK/stop.log" 2 '^Train Epoch: 1 '
signal_and_wait "$launched" 4 3 TERM
status=$?
check "--sampler uneven, SIGTERM mid-epoch: every rank stopped, exit 143 (got $status)" [ "$status" -eq 143 ]
check "--sampler uneven, SIGTERM mid-epoch: one line, no checkpoint of that step" \
  grep -q "^dtrain: stopped by SIGTERM at step .*no checkpoint of this step (--sampler uneven saves at epoch ends)" \
  "$WORK/stop.log"
finish
