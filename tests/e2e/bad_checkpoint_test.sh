#!/usr/bin/env bash
# A checkpoint that does not fit the run is one line naming the field or the file, a non-zero
# exit, and the checkpoint directory left exactly as it was: another model, widths, optimizer,
# batch size or any other setting that changes results; a checksum mismatch; a truncated or a
# missing file; a format version this dtrain does not know; a `latest` naming a damaged or
# absent checkpoint. Also the usage errors of the flags, --init-weights that do not fit, and
# `dtrain eval` with flags that disagree with the weights. At NP ranks (NP 1: the one line is the
# whole output; more: rank 0 prints it once, mpirun adds its own report).
#   bad_checkpoint_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: bad_checkpoint_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: bad_checkpoint_test.sh PATH/TO/dtrain NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

args=(train "${COMMON[@]}" --train-limit $((200 * NP)) --batch-size 20 --epochs 1)
good="$WORK/good"
if ! dtrain_at "$NP" "$WORK/good.log" "${args[@]}" --checkpoint-dir "$good" --checkpoint-every 5; then
  not_ok "a good checkpoint" "$(tail -3 "$WORK/good.log")"
  finish
fi
step=$(latest_step "$good")

# The line dtrain printed (its "dtrain: error:" lines; at NP 1 the output must be nothing else).
error_lines() { grep -c '^dtrain: ' "$1"; }

# expect_error NAME EXPECTED SETUP [FLAGS...]: copies the good checkpoint directory, runs SETUP
# on the copy (a shell command; $ck is the copy), resumes from it with FLAGS, and checks the
# one line (containing EXPECTED), the non-zero exit and the copy unchanged.
expect_error() {
  local name=$1 expected=$2 setup=$3
  shift 3
  local ck="$WORK/case"
  rm -rf "$ck" && cp -a "$good" "$ck"
  (cd "$ck" && eval "$setup")
  local before after status
  before=$(dir_state "$ck")
  dtrain_at "$NP" "$WORK/case.log" "${args[@]}" --checkpoint-dir "$ck" "$@"
  status=$?
  after=$(dir_state "$ck")
  local line
  line=$(grep '^dtrain: ' "$WORK/case.log" | head -1)
  echo "#   $line"
  if [ "$status" -eq 0 ] || [ "$(error_lines "$WORK/case.log")" -ne 1 ] || [[ $line != *"$expected"* ]]; then
    not_ok "$name" "status $status, output: $(head -c 600 "$WORK/case.log")"
  elif [ "$NP" = 1 ] && [ "$(wc -l <"$WORK/case.log")" -ne 1 ]; then
    not_ok "$name" "more than one line: $(cat "$WORK/case.log")"
  elif [ "$before" != "$after" ]; then
    not_ok "$name" "the checkpoint directory changed"
  else
    ok "$name: one line, status $status, directory unchanged"
  fi
}

auto=(--resume auto)
expect_error "another hidden width" "config.model.hidden: checkpoint [256], this run [128]" : "${auto[@]}" --hidden 128
expect_error "another model" 'config.model.architecture: checkpoint "mlp", this run "cnn"' : "${auto[@]}" --model cnn
expect_error "another optimizer" 'config.optimizer.algorithm: checkpoint "sgd", this run "adamw"' : "${auto[@]}" --optimizer adamw
expect_error "another learning rate" "config.optimizer.lr: checkpoint 0.01, this run 0.02" : "${auto[@]}" --lr 0.02
expect_error "another batch size" "config.batch_size: checkpoint 20, this run 10" : "${auto[@]}" --batch-size 10
expect_error "another seed" "config.seed: checkpoint 0, this run 1" : "${auto[@]}" --seed 1
expect_error "no shuffling" "config.data.shuffle" : "${auto[@]}" --shuffle off
expect_error "another comm hook" "config.ddp.comm_hook" : "${auto[@]}" --comm-hook bf16
expect_error "another dropout" "config.model.dropout" : "${auto[@]}" --dropout 0.5
expect_error "another training subset" "config.data.train_limit" : "${auto[@]}" --train-limit 100
expect_error "a damaged model file (checksum)" "step-$step/model.safetensors: CRC-32" \
  "printf 'X' | dd of=step-$step/model.safetensors bs=1 seek=5000 conv=notrunc status=none" "${auto[@]}"
expect_error "a truncated optimizer file" "step-$step/optimizer.safetensors: 1000 bytes, state.json records" \
  "truncate -s 1000 step-$step/optimizer.safetensors" "${auto[@]}"
expect_error "a missing model file" "step-$step/model.safetensors" "rm step-$step/model.safetensors" "${auto[@]}"
expect_error "a missing state.json" "state.json" "rm step-$step/state.json" --resume "$WORK/case/step-$step"
expect_error "an unknown format version" "format_version: 9 is not a format this dtrain reads" \
  "sed -i 's/\"format_version\": 2/\"format_version\": 9/' step-$step/state.json" "${auto[@]}"
expect_error "latest names an absent checkpoint" "latest: names" "echo step-999 >latest" "${auto[@]}"
expect_error "latest is not step-N" "latest: expected one line 'step-<N>'" "echo garbage >latest" "${auto[@]}"
expect_error "--resume PATH that does not exist" "no such checkpoint directory" : --resume "$WORK/nowhere"
expect_error "--init-weights of another width" "tensor '1.weight' is F32 [128, 784], expected F32 [256, 784]" \
  ": && $(printf '%q ' "$DTRAIN") train ${COMMON[*]} --train-limit 100 --hidden 128 --batch-size 100 --epochs 1 --quiet --checkpoint-dir w128 >/dev/null 2>&1" \
  --init-weights "$WORK/case/w128/step-1/model.safetensors"

# Usage errors, before anything starts: status 2, one line.
usage() {
  local name=$1 expected=$2
  shift 2
  local status
  "$DTRAIN" "$@" >"$WORK/usage.log" 2>&1
  status=$?
  check "$name: status 2, one line ($(cat "$WORK/usage.log"))" \
    [ "$status" -eq 2 -a "$(wc -l <"$WORK/usage.log")" -eq 1 -a -n "$(grep -F -- "$expected" "$WORK/usage.log")" ]
}
usage "--resume auto without --checkpoint-dir" "--resume auto: needs --checkpoint-dir" train --resume auto
usage "--keep 0" "--keep: must be at least 1" train --checkpoint-dir "$WORK/x" --keep 0
usage "--shuffle maybe" "--shuffle: expected on or off" train --shuffle maybe
usage "eval without --weights" "--weights: required" eval

# dtrain eval of the final checkpoint prints the Test set line the run printed after its last
# epoch (the same test set, sharded over the same ranks).
dtrain_at "$NP" "$WORK/eval.log" eval --weights "$good" --data "$DATA" --test-limit 500 --threads 1
check "eval at $NP rank(s) prints the run's last Test set line ($(grep '^Test set' "$WORK/eval.log"))" \
  [ "$(grep '^Test set' "$WORK/eval.log")" = "$(grep '^Test set' "$WORK/good.log" | tail -1)" ]

# dtrain eval: the architecture comes from the file; flags that disagree are one line.
eval_error() {
  local name=$1 expected=$2
  shift 2
  start_dtrain "$NP" "$WORK/eval.log" eval --data "$DATA" --test-limit 200 --threads 1 "$@"
  wait "$LAUNCHED"
  local status=$?
  check "eval: $name: status $status, one line ($(grep '^dtrain: ' "$WORK/eval.log" | head -1))" \
    [ "$status" -ne 0 -a "$(error_lines "$WORK/eval.log")" -eq 1 -a -n "$(grep -F -- "$expected" "$WORK/eval.log")" ]
}
eval_error "--hidden that disagrees with the file" "--hidden 512 disagrees with the weights (recorded: 256)" \
  --weights "$good" --hidden 512
cp -a "$good" "$WORK/damaged"
printf 'X' | dd of="$WORK/damaged/step-$step/model.safetensors" bs=1 seek=5000 conv=notrunc status=none
eval_error "a damaged checkpoint" "step-$step/model.safetensors: CRC-32" --weights "$WORK/damaged"
finish
