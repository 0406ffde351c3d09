#!/usr/bin/env bash
# The watchdog only watches: the same run with --timeout 0 (no deadline), with a deadline, with
# nothing watching (--timeout 0 --flight-recorder-size 0: no recorder, board or watchdog) and with
# --debug-collectives ends with bitwise the same model.safetensors.
# Usage: timeout_off_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
i=0
for flags in "--timeout 0" "--timeout 600" "--timeout 0 --flight-recorder-size 0" "--timeout 600 --debug-collectives"; do
  i=$((i + 1))
  # shellcheck disable=SC2086  # the flags split into words
  dtrain_at "$NP" "$WORK/log$i" train "${COMMON[@]}" --train-limit 1024 $flags --checkpoint-dir "$WORK/ck$i"
  check "$flags: the run succeeded" [ $? = 0 ]
  if [ "$i" -gt 1 ]; then
    echo "# cmp $WORK/ck1/step-8/model.safetensors $WORK/ck$i/step-8/model.safetensors"
    check "$flags: the same model.safetensors as --timeout 0 (cmp)" cmp "$WORK/ck1/step-8/model.safetensors" "$WORK/ck$i/step-8/model.safetensors"
  fi
done
finish
