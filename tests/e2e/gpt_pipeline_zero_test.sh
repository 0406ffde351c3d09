#!/usr/bin/env bash
# --zero 1 in the GPT pipeline (Note [Pipeline ZeRO-1] in app/pipeline_zero.h) at NP 4 (P 2 x D 2)
# on byte shards of Python's json package, AdamW with clipping: the first and the last stage each
# shard their copy of the tied wte's state over their own replicas.
# - the weights and the step and val lines are the unsharded pipeline's bit for bit, and the
#   replicas' shards consolidate (`dtrain checkpoint consolidate`) to the unsharded pipeline's
#   optimizer file byte for byte (the tied wte's state once, from the first stage's replicas);
#   with --accumulate 2 too;
# - step 10 resumed with --zero 1 ends with the uninterrupted run's files bit for bit (model and
#   every shard); resumed without --zero, its model bit for bit; resumed at P = 1 (np 2, data
#   parallel, no --zero) within 2e-4 relative of the pipeline's run (M micro-batches' GEMMs round
#   unlike one: gpt_pipeline_checkpoint_test.sh);
# - --zero 2 (the tied wte reduce-scattered, clipping over the chunks): the unsharded pipeline's
#   step and val lines, its model within 2e-4.
# Usage: gpt_pipeline_zero_test.sh DTRAIN
set -uo pipefail
DTRAIN=$1
E2E_NO_IDX=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
json_byte_shards "$WORK/shards"
gpt=("${GPT_ZERO_JOB[@]}")
PIPE=("${GPT_PIPE[@]}")
close() { /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$1" "$2" 2e-4 >"$WORK/close.log" 2>&1; }

dtrain_at 4 "$WORK/zero.log" "${gpt[@]}" "${PIPE[@]}" --zero 1 --checkpoint-dir "$WORK/zero"
dtrain_at 4 "$WORK/plain.log" "${gpt[@]}" "${PIPE[@]}" --checkpoint-dir "$WORK/plain"
check "--zero 1: the memory line names the stage's shards" \
  grep -q "^memory per rank: .*(--zero 1 over 2 ranks: optimizer state for this rank's 1/2" "$WORK/zero.log"
check "--zero 1: step and val lines the unsharded pipeline's" \
  same_nonempty "$(steps_of "$WORK/zero.log")" "$(steps_of "$WORK/plain.log")"
check "--zero 1: model.safetensors bit for bit the unsharded pipeline's" \
  cmp "$WORK/zero/step-20/model.safetensors" "$WORK/plain/step-20/model.safetensors"
consolidate zero plain
check "--zero 1: 4 shards consolidated (28 tensors' exp_avg and exp_avg_sq, wte once)" \
  grep -q "from 4 shards: 56 tensors, 28 counts" "$WORK/consolidate-zero.log"
check "--zero 1: the replicas' slices consolidate to the unsharded pipeline's optimizer state, byte for byte" \
  cmp "$WORK/zero-optimizer.safetensors" "$WORK/plain-optimizer.safetensors"
for z in 0 1; do
  dtrain_at 4 "$WORK/acc$z.log" "${gpt[@]}" "${PIPE[@]}" --accumulate 2 --zero "$z" --checkpoint-dir "$WORK/acc$z"
done
check "--zero 1 --accumulate 2: step and val lines the unsharded pipeline's" \
  same_nonempty "$(steps_of "$WORK/acc1.log")" "$(steps_of "$WORK/acc0.log")"
check "--zero 1 --accumulate 2: model.safetensors bit for bit the unsharded pipeline's" \
  cmp "$WORK/acc1/step-20/model.safetensors" "$WORK/acc0/step-20/model.safetensors"

# --zero 2 (the tied wte's local gradients added by each replica's two ends, then reduce-scattered;
# the norm over the replicas' chunks, the last stage's copy left out): the unsharded pipeline's
# step and val lines (4 decimals) and its model within 2e-4 (another association of the wte's
# sums; by hand 3.4e-5 at worst, in c_attn.bias, whose key part's gradient is zero up to
# rounding and AdamW turns rounding into whole steps; the other tensors within 3.3e-7).
dtrain_at 4 "$WORK/zero2.log" "${gpt[@]}" "${PIPE[@]}" --zero 2 --checkpoint-dir "$WORK/zero2"
check "--zero 2: the memory line names the reduce-scattered gradients" \
  grep -q "^memory per rank: .*(--zero 2 over 2 ranks: .*gradients reduce-scattered" "$WORK/zero2.log"
check "--zero 2: step and val lines the unsharded pipeline's" \
  same_nonempty "$(steps_of "$WORK/zero2.log")" "$(steps_of "$WORK/plain.log")"
close "$WORK/plain/step-20/model.safetensors" "$WORK/zero2/step-20/model.safetensors"
check "--zero 2: model.safetensors within 2e-4 of the unsharded pipeline's" [ $? -eq 0 ]

dtrain_at 4 "$WORK/res.log" "${gpt[@]}" "${PIPE[@]}" --zero 1 --resume "$WORK/zero/step-10" --checkpoint-dir "$WORK/res"
check "--zero 1: resumed from step 10" grep -q "step-10" "$WORK/res.log"
check "--zero 1 resumed at 2 x 2: model and every optimizer shard bit for bit the uninterrupted run's" \
  same_files "$WORK/zero/step-20" "$WORK/res/step-20"
dtrain_at 4 "$WORK/unz.log" "${gpt[@]}" "${PIPE[@]}" --resume "$WORK/zero/step-10" --checkpoint-dir "$WORK/unz"
check "--zero 1 checkpoint resumed without --zero: the uninterrupted run's model bit for bit" \
  cmp "$WORK/zero/step-20/model.safetensors" "$WORK/unz/step-20/model.safetensors"
dtrain_at 2 "$WORK/to1.log" "${gpt[@]}" --resume "$WORK/zero/step-10" --checkpoint-dir "$WORK/to1"
close "$WORK/zero/step-20/model.safetensors" "$WORK/to1/step-20/model.safetensors"
check "--zero 1 P 2 x D 2 -> P = 1 at np 2 without --zero: ends within 2e-4 of the pipeline's run" [ $? -eq 0 ]
finish
