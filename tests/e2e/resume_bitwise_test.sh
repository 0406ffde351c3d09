#!/usr/bin/env bash
# Resuming at the same world size is bitwise identical to not stopping. A job at NP ranks is
# killed (SIGKILL, one rank; mpirun takes the others down) once it has saved a checkpoint, then
# `--resume auto` finishes it: its final model.safetensors must equal, byte for byte, that of
# the same job run uninterrupted, and its log must repeat the uninterrupted log's lines from the
# resume point on. Once mid-epoch (--checkpoint-every), once at an epoch boundary, and once with
# --bucket-cap-mb auto: the resumed run takes the buckets the killed run had chosen from its
# checkpoint and tries no caps.
# With ZERO (1 or 2) every job runs with --zero ZERO and AdamW, and the optimizer state is compared
# shard file by shard file (optimizer-rank<r>-of-NP.safetensors); in the autotuned scenario the
# trials re-cut the shards after optimizer steps (Note [Re-cutting sharded state]), and the two
# runs may choose other buckets, so the consolidated state (`dtrain checkpoint consolidate`) is
# compared instead.
# With resnet18 in place of ZERO, the job is a --model resnet18 --width 4 (mid-epoch only): the
# BatchNorm buffers (running statistics, num_batches_tracked) resume with the parameters.
#   resume_bitwise_test.sh PATH/TO/dtrain NP [ZERO|resnet18]
set -uo pipefail
DTRAIN=${1:?usage: resume_bitwise_test.sh PATH/TO/dtrain NP [ZERO]}
NP=${2:?usage: resume_bitwise_test.sh PATH/TO/dtrain NP [ZERO]}
ZERO=${3:-0}
MODEL_ARGS=(--dropout 0.1)
if [ "$ZERO" = resnet18 ]; then
  ZERO=0
  MODEL_ARGS=(--model resnet18 --width 4)
  RESNET=1
fi
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# scenario NAME MIN_STEP ARGS...: the uninterrupted job, then the job killed once DIR/latest
# names a step >= MIN_STEP, then --resume auto.
scenario() {
  local name=$1 min_step=$2
  shift 2
  local args=(train "${COMMON[@]}" --batch-size 16 "${MODEL_ARGS[@]}" "$@")
  if [ "$ZERO" -gt 0 ]; then  # before the scenario's own flags, which win (its --hidden, its caps)
    local zero_args=(--zero "$ZERO" --optimizer adamw --hidden 256,128)
    [[ " $* " == *" --bucket-cap-mb auto "* ]] || zero_args+=(--bucket-cap-mb 0.25)
    args=(train "${COMMON[@]}" --batch-size 16 "${MODEL_ARGS[@]}" "${zero_args[@]}" "$@")
  fi
  local ref="$WORK/$name-ref" run="$WORK/$name-run"
  if ! dtrain_at "$NP" "$ref.log" "${args[@]}" --checkpoint-dir "$ref"; then
    not_ok "$name: uninterrupted run" "$(tail -3 "$ref.log")"
    return
  fi
  start_dtrain "$NP" "$run.log" "${args[@]}" --checkpoint-dir "$run"
  local launched=$LAUNCHED
  wait_until 120 step_at_least "$run" "$min_step"
  local victim
  victim=$(rank_pid "$launched" "$NP" $((NP - 1)))
  [ -n "$victim" ] && kill -KILL "$victim"
  wait "$launched"
  local status=$?
  check "$name: rank $((NP - 1)) was killed before the run ended (status $status)" [ -n "$victim" -a "$status" -ne 0 ]
  local resumed_from
  resumed_from=$(latest_step "$run")
  echo "# $name: killed after checkpoint step-$resumed_from; resuming"
  cp "$run/step-$resumed_from/state.json" "$run.resumed-from.json"  # the resumed run prunes it
  if ! dtrain_at "$NP" "$run.resumed.log" "${args[@]}" --checkpoint-dir "$run" --resume auto; then
    not_ok "$name: resumed run" "$(tail -3 "$run.resumed.log")"
    return
  fi
  check "$name: the resumed run says where it resumed" grep -q "^resume: from $run/step-$resumed_from " "$run.resumed.log"
  echo "# cmp $(final_model "$ref") $(final_model "$run")"
  check "$name: final model.safetensors bitwise identical (cmp)" cmp "$(final_model "$ref")" "$(final_model "$run")"
  local file files=0
  local ref_step run_step
  ref_step=$(dirname "$(final_model "$ref")") run_step=$(dirname "$(final_model "$run")")
  for file in "$ref_step"/optimizer*.safetensors; do
    files=$((files + 1))
    # Under ZeRO the shards follow the buckets, which --bucket-cap-mb auto chooses from timings:
    # the two runs may cut the same state otherwise. Its consolidated bytes do not depend on it.
    [ "$ZERO" -gt 0 ] && [[ " $* " == *" --bucket-cap-mb auto "* ]] && continue
    check "$name: optimizer state bitwise identical (cmp $(basename "$file"))" cmp "$file" "$run_step/$(basename "$file")"
  done
  if [ "$ZERO" -gt 0 ] && [ "$NP" -gt 1 ] && [[ " $* " == *" --bucket-cap-mb auto "* ]]; then
    "$DTRAIN" checkpoint consolidate "$ref_step" -o "$WORK/$name-ref-optimizer.safetensors" >/dev/null &&
      "$DTRAIN" checkpoint consolidate "$run_step" -o "$WORK/$name-run-optimizer.safetensors" >/dev/null
    check "$name: consolidated optimizer state bitwise identical (cmp)" \
      cmp "$WORK/$name-ref-optimizer.safetensors" "$WORK/$name-run-optimizer.safetensors"
  fi
  if [ "$ZERO" -gt 0 ] && [ "$NP" -gt 1 ]; then
    check "$name: the optimizer state is in $NP shards" [ "$files" -eq "$NP" ]
  fi
  check "$name: the same log lines from the resume point on" \
    diff <(log_lines_after "$ref.log" "$ref" "$resumed_from") <(log_lines "$run.resumed.log" "$run")
  if [[ " $* " == *" --bucket-cap-mb auto "* ]] && [ "$NP" -gt 1 ]; then  # one rank: no DDP, no buckets
    check "$name: the killed run chose its buckets before the checkpoint" grep -q "^buckets: --bucket-cap-mb auto chose" "$run.log"
    check "$name: the checkpoint records them" grep -q '"ready_order"' "$run.resumed-from.json"
    check "$name: the resumed run takes them from the checkpoint" grep -q "^resume: buckets from the checkpoint" "$run.resumed.log"
    check "$name: and tries no caps" bash -c "! grep -q 'auto chose' '$run.resumed.log'"
  fi
}

limit=$((1200 * NP))  # 75 steps of 16 per rank and epoch
if [ -n "${RESNET:-}" ]; then
  scenario resnet18-mid-epoch 10 --train-limit $((480 * NP)) --epochs 3 --checkpoint-every 10
  finish
fi
scenario mid-epoch 10 --train-limit "$limit" --epochs 2 --checkpoint-every 10
scenario epoch-boundary 1 --train-limit "$limit" --epochs 3
# Two distinct bucket plans for 784-512-512-10 (a 1 MiB first bucket, or one bucket): step 1, then
# 2 x (1 + 8) trial steps; the run is killed after a checkpoint at step 30 or later.
scenario autotuned-buckets 30 --train-limit "$limit" --hidden 512,512 --checkpoint-every 10 --bucket-cap-mb auto
finish
