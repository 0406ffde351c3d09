#!/usr/bin/env bash
# The watchdog only watches: the same run with --timeout 0 (no deadline) and with a deadline
# ends with bitwise the same model.safetensors.
# Usage: timeout_off_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
for t in 0 600; do
  dtrain_at "$NP" "$WORK/log$t" train "${COMMON[@]}" --train-limit 1024 --timeout "$t" --checkpoint-dir "$WORK/ck$t"
  check "--timeout $t: the run succeeded" [ $? = 0 ]
done
echo "# cmp $WORK/ck0/step-8/model.safetensors $WORK/ck600/step-8/model.safetensors"
check "same model.safetensors with and without the deadline (cmp)" cmp "$WORK/ck0/step-8/model.safetensors" "$WORK/ck600/step-8/model.safetensors"
finish
