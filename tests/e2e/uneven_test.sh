#!/usr/bin/env bash
# dtrain train --sampler uneven at NP ranks: 1000 samples over 3 ranks at batch 333 give rank 0
# two batches and the others one; the job finishes (Join), its epoch counts each sample once, and
# evaluation counts every test sample once.
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
finish
