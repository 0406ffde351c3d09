#!/usr/bin/env bash
# The exit status contract (Note [Exit statuses] in core/exit_status.h, README "When things go
# wrong"): dtrain train at NP ranks exits with one status per kind of failure, the same through
# mpirun, and dtrain-launch --max-restarts does not retry the permanent ones: a corrupt
# checkpoint under --max-restarts 3 is one attempt and one line saying why it is not retried.
#   exit_status_test.sh PATH/TO/dtrain NP PATH/TO/dtrain-launch
set -uo pipefail
DTRAIN=${1:?usage: exit_status_test.sh PATH/TO/dtrain NP PATH/TO/dtrain-launch}
NP=${2:?usage: exit_status_test.sh PATH/TO/dtrain NP PATH/TO/dtrain-launch}
LAUNCH=$(realpath "${3:?usage: exit_status_test.sh PATH/TO/dtrain NP PATH/TO/dtrain-launch}")
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

args=(train "${COMMON[@]}" --train-limit $((200 * NP)) --batch-size 20 --epochs 1)
good="$WORK/good"
if ! dtrain_at "$NP" "$WORK/good.log" "${args[@]}" --checkpoint-dir "$good" --checkpoint-every 5; then
  not_ok "a good checkpoint" "$(tail -3 "$WORK/good.log")"
  finish
fi
step=$(latest_step "$good")

# A copy of the good checkpoint directory with SETUP (a shell command) run in its newest step.
damaged_copy() {
  local ck="$WORK/$1"
  rm -rf "$ck" && cp -a "$good" "$ck"
  (cd "$ck/step-$step" && eval "$2")
  echo "$ck"
}
flip_byte() { printf '\xff' | dd of="$1" bs=1 seek=$(($(stat -c %s "$1") - 3)) conv=notrunc status=none; }

# expect_status NAME STATUS ARGS...: dtrain ARGS at NP ranks exits with STATUS and one error line.
expect_status() {
  local name=$1 want=$2 status
  shift 2
  dtrain_at "$NP" "$WORK/case.log" "$@"
  status=$?
  echo "#   $name: exit $status: $(grep -m1 '^dtrain: ' "$WORK/case.log")"
  check "$name: exit status $want (got $status)" [ "$status" = "$want" ]
}

mkdir -p "$WORK/empty"
expect_status "a flag out of range" 2 "${args[@]}" --batch-size 0
expect_status "bad data (no dataset files)" 65 "${args[@]/$DATA/$WORK/empty}"
truncated="$WORK/truncated"
mkdir -p "$truncated"
cp "$DATA"/t10k-* "$truncated"/
head -c 4000 "$DATA/train-images-idx3-ubyte.gz" >"$truncated/train-images-idx3-ubyte.gz"
cp "$DATA/train-labels-idx1-ubyte.gz" "$truncated"/
expect_status "bad data (a truncated file)" 65 "${args[@]/$DATA/$truncated}"
expect_status "a corrupt model.safetensors" 66 "${args[@]}" --resume auto \
  --checkpoint-dir "$(damaged_copy crc 'flip_byte model.safetensors')"
expect_status "a checkpoint of another model" 66 "${args[@]}" --resume auto --hidden 128 --checkpoint-dir "$good"
expect_status "--init-weights of another model" 66 "${args[@]}" --hidden 128 \
  --init-weights "$good/step-$step/model.safetensors"
if [ $((NP % 2)) = 0 ]; then  # the image pipeline's cut, as the GPT's: a flag (it was 1, retried)
  expect_status "--pipeline-split 0 (layer 0 cannot start a stage)" 2 "${args[@]}" --pipeline-stages 2 \
    --pipeline-split 0
fi
expect_status "a model that does not fit in memory" 71 "${args[@]}" --hidden 1048576,1048576
expect_status "an unwritable --checkpoint-dir" 73 "${args[@]}" --checkpoint-dir /proc/self/dtrain-ckpt
expect_status "an unwritable --trace" 73 "${args[@]}" --trace "$WORK/empty"

# launch_once NAME CKPT: dtrain-launch --max-restarts 3 resuming from CKPT fails once, with the
# rank's status, one line saying it is not restarted and why, and no restart.
launch_once() {
  local name=$1 ck=$2 status log="$WORK/launch.log"
  "$LAUNCH" -n "$NP" --max-restarts 3 -- "$DTRAIN" "${args[@]}" --checkpoint-dir "$ck" --resume auto >"$log" 2>&1
  status=$?
  grep -E '^dtrain(-launch)?: ' "$log" | sed 's/^/#   /'
  check "$name under --max-restarts 3: exit status 66 (got $status)" [ "$status" = 66 ]
  check "$name: one attempt (no restart line)" [ "$(grep -c '^dtrain-launch: restart ' "$log")" = 0 ]
  check "$name: one error line from the ranks" [ "$(grep -c '^dtrain: error: ' "$log")" = 1 ]
  check "$name: one line saying it is not retried" [ "$(grep -c '(not restarted: exit status 66 is a corrupt or mismatched checkpoint or weights file; a restart would fail the same way)$' "$log")" = 1 ]
}
launch_once "a corrupt model.safetensors" "$(damaged_copy launch-crc 'flip_byte model.safetensors')"
launch_once "a corrupt state.json" "$(damaged_copy launch-state 'printf "{not json" > state.json')"
finish
