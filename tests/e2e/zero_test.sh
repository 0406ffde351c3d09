#!/usr/bin/env bash
# dtrain train --zero 1 and --zero 2 at NP ranks end with the parameters of --zero 0, to the bit
# (the --json summary's fingerprint of rank 0's final parameters), for AdamW and SGD with
# momentum, with accumulation; and say per rank what they hold. (Sharded checkpoints are not
# written yet, so the final model.safetensors cannot be compared: --zero refuses --checkpoint-dir.)
# Usage: zero_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

fingerprint() { sed -n 's/.*"parameters_fingerprint":"\([0-9a-f]*\)".*/\1/p' "$1"; }

for opt in "--optimizer adamw --lr 0.002 --weight-decay 0.01" "--optimizer sgd --lr 0.05 --momentum 0.9 --accumulate 2"; do
  name=${opt%% --lr*}
  for z in 0 1 2; do
    # shellcheck disable=SC2086  # $opt is several flags
    timeout 120 bash -c "$(declare -f start_dtrain dtrain_at); DTRAIN=$DTRAIN; dtrain_at $NP $WORK/z$z.log train ${COMMON[*]} --train-limit 1200 --batch-size 50 --epochs 2 --bucket-cap-mb 0.05 $opt --zero $z --json"
    check "$name --zero $z finished (exit $?)" [ "$?" = 0 ]
  done
  base=$(fingerprint "$WORK/z0.log")
  echo "# $name fingerprints: --zero 0 $base, --zero 1 $(fingerprint "$WORK/z1.log"), --zero 2 $(fingerprint "$WORK/z2.log")"
  check "$name: --zero 0 gave a fingerprint" [ -n "$base" ]
  check "$name: --zero 1 ends with the --zero 0 parameters" [ "$(fingerprint "$WORK/z1.log")" = "$base" ]
  check "$name: --zero 2 ends with the --zero 0 parameters" [ "$(fingerprint "$WORK/z2.log")" = "$base" ]
  check "$name: the start-up line says the sharded state" grep -q "^memory per rank: .*(--zero 1 over $NP ranks" "$WORK/z1.log"
done
finish
