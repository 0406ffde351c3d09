#!/usr/bin/env bash
# --model resnet18 through the pipeline (Note [Pipeline BatchNorm] in pipeline/pipeline_stage.h,
# Note [ResNet pipeline stages] in model/models.h) at NP 2 (P 2) and NP 4 (P 2 x D 2), batch 32
# cut into 4 micro-batches: BatchNorm normalises each micro-batch of 8 rows and moves its running
# statistics once per micro-batch, so the run is the data-parallel ResNet's at np D with
# --batch-size 8 --accumulate 4 (the same rows, replica 0's statistics broadcast each step): the
# same test-set lines (loss and accuracy, read through the running statistics), and not those of
# --batch-size 32 without accumulation (BatchNorm over 32 rows). Checkpoints and --sync-bn stay
# refused in one line (exit 2).
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
dtrain_at "$D" "$WORK/acc.log" train "${RUN[@]}" --batch-size 8 --accumulate 4
check "resnet18 P 2 x D $D: the test-set lines of np $D --batch-size 8 --accumulate 4" \
  same_nonempty "$(tests_of "$WORK/pipe.log")" "$(tests_of "$WORK/acc.log")"
dtrain_at "$D" "$WORK/whole.log" train "${RUN[@]}" --batch-size 32
! same_nonempty "$(tests_of "$WORK/pipe.log")" "$(tests_of "$WORK/whole.log")"
check "not those of --batch-size 32 unaccumulated (BatchNorm over 32 rows)" [ $? -eq 0 ]

for more in "--sync-bn" "--checkpoint-dir $WORK/ck"; do
  # shellcheck disable=SC2086
  dtrain_at "$NP" "$WORK/refused.log" train "${RUN[@]}" --batch-size 32 --pipeline-stages 2 --micro-batches 4 $more
  status=$?
  check "resnet18 with $more: refused, exit 2 (got $status)" [ "$status" -eq 2 ]
  check "resnet18 with $more: one line" grep -q "^dtrain: .*--pipeline-stages 2: not yet with" "$WORK/refused.log"
done
finish
