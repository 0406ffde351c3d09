#!/usr/bin/env bash
# Resuming at another world size continues from the same global sample position of the same
# epoch permutation: the samples the first job used before its checkpoint and those the resumed
# job uses for the rest of that epoch are every sample of the epoch exactly once. Each rank
# records the samples it trains on (DTRAIN_TEST_SAMPLE_LOG); the sizes are chosen so that the
# rest of the epoch divides evenly among the new ranks (no padding).
#   world_size_change_test.sh PATH/TO/dtrain FROM_NP TO_NP
set -uo pipefail
DTRAIN=${1:?usage: world_size_change_test.sh PATH/TO/dtrain FROM_NP TO_NP}
FROM=${2:?usage: world_size_change_test.sh PATH/TO/dtrain FROM_NP TO_NP}
TO=${3:?usage: world_size_change_test.sh PATH/TO/dtrain FROM_NP TO_NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

readonly SAMPLES=1200 BATCH=20 STOP=6  # 6 steps of 20 at 2 or 3 ranks: 240 or 360 used, 960 or 840 left
args=(train "${COMMON[@]}" --train-limit "$SAMPLES" --batch-size "$BATCH" --epochs 1)

DTRAIN_TEST_SAMPLE_LOG="$WORK/first" dtrain_at "$FROM" "$WORK/first.log" "${args[@]}" \
  --checkpoint-dir "$WORK/ck" --checkpoint-every "$STOP" --keep 100
check "the job at $FROM ranks ran" [ -d "$WORK/ck/step-$STOP" ]
DTRAIN_TEST_SAMPLE_LOG="$WORK/resumed" dtrain_at "$TO" "$WORK/resumed.log" "${args[@]}" \
  --checkpoint-dir "$WORK/ck2" --resume "$WORK/ck/step-$STOP"
status=$?
check "the job resumed at $TO ranks ran (status $status)" [ "$status" -eq 0 ]
check "it says the run is not bitwise identical to one at $FROM ranks" \
  grep -q "^resume: saved at world size $FROM, running at $TO: .*not bitwise identical" "$WORK/resumed.log"

check "$FROM -> $TO ranks: every sample of the epoch used exactly once" every_sample_once "$STOP" "$SAMPLES"
check "the resumed ranks each trained on $(((SAMPLES - STOP * BATCH * FROM) / TO)) samples" \
  [ "$(awk '{ n += NF - 2 } END { print n }' "$WORK/resumed.rank0")" -eq $(((SAMPLES - STOP * BATCH * FROM) / TO)) ]
finish
