#!/usr/bin/env bash
# dtrain train --sampler uneven at NP ranks: 1000 samples over 3 ranks at batch 333 give rank 0
# two batches and the others one; the job finishes (Join), its epoch counts each sample once, and
# evaluation counts every test sample once; with --clip-grad-norm the joined ranks clip too (they
# end with rank 0's parameters).
# Usage: uneven_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-3}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
timeout 120 bash -c "$(declare -f start_dtrain dtrain_at); DTRAIN=$DTRAIN; dtrain_at $NP $WORK/log train --threads 1 --data $DATA --sampler uneven --train-limit 1000 --test-limit 997 --batch-size 333 --epochs 2"
status=$?
grep -E "^(Test set|Epoch)" "$WORK/log" | sed 's/^/# /'
check "the uneven job finished (exit $status)" [ "$status" = 0 ]
check "each epoch trained on the 1000 samples once" [ "$(grep -c '^Epoch [12]: .* (1000 samples in' "$WORK/log")" = 2 ]
check "evaluation counted the 997 test samples once" [ "$(grep -c '^Test set: .*/997 ' "$WORK/log")" = 2 ]

# With --clip-grad-norm the joined ranks clip the same all-reduced gradient as the others: else
# their parameters drift from rank 0's. The last evaluation sums every rank's share with its own
# parameters; `dtrain eval` of rank 0's saved weights on one rank must give the same loss.
timeout 120 bash -c "$(declare -f start_dtrain dtrain_at); DTRAIN=$DTRAIN; dtrain_at $NP $WORK/clip.log train --threads 1 --data $DATA --sampler uneven --train-limit 1000 --test-limit 997 --batch-size 333 --epochs 1 --lr 0.5 --clip-grad-norm 0.01 --checkpoint-dir $WORK/clip"
status=$?
check "the uneven job with --clip-grad-norm finished (exit $status)" [ "$status" = 0 ]
OPENBLAS_NUM_THREADS=1 "$DTRAIN" eval --threads 1 --data "$DATA" --test-limit 997 --weights "$WORK/clip" >"$WORK/eval.log" 2>&1
trained=$(sed -n 's/^Test set: Average loss: \([0-9.]*\),.*/\1/p' "$WORK/clip.log" | tail -1)
alone=$(sed -n 's/^Test set: Average loss: \([0-9.]*\),.*/\1/p' "$WORK/eval.log" | tail -1)
echo "# test loss: the $NP ranks' own parameters $trained, rank 0's saved weights on one rank $alone"
check "every rank ended with rank 0's parameters (test loss $trained vs $alone within 2e-4)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if abs(float('$trained') - float('$alone')) <= 2e-4 else 1)"
finish
