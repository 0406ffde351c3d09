#!/usr/bin/env bash
# --pipeline-stages with --clip-grad-norm and --amp (issue 23; Note [Pipeline gradient norm] in
# pipeline/pipeline_clip.h, Note [Loss scaling] in model/grad_scaler.h), at NP 2 (P 2), NP 3 (P 3)
# and NP 4 (P 2 x D 2), each against one process on the same global batch:
# - --clip-grad-norm: the norm over every stage's gradients; log lines (losses within 1e-5) and
#   weights (1e-5 relative) are the unsplit clipped run's, which is far from the unclipped one;
# - --amp bf16 likewise, over 12 steps (16 at NP 3; see below);
# - --amp fp16 with an inf injected after the gradient sums on ONE rank (the last rank, then rank
#   0): every rank skips those steps, as the unsplit run that poisons them does (the same log
#   lines with their "Skipped:" counts, weights within 1e-5, the same grad_scaler state in
#   state.json), over 12 steps (16 at NP 3);
# - --amp fp16 stopped at an epoch end and resumed: the uninterrupted run's weights bit for bit,
#   and its grad_scaler state;
# - --zero 1 and --zero 2 (Note [Pipeline ZeRO-1]) with AdamW: the unsharded pipeline's weights bit
#   for bit, each stage's optimizer state over its D replicas (the memory line at D 2); --zero 2's
#   reduce-scatter sums each chunk as the all-reduce does (bitwise on one node); --zero 2 with
#   --clip-grad-norm, the norm over each replica's chunks: within 1e-5 of the unsharded run's.
# - --class-weights (Note [Pipeline class weights]): the weighted mean over the global batch, so
#   the log lines and weights are the unsplit weighted run's, which is far from the unweighted one;
# The 16-bit comparisons are short: as the ~1e-6 differences of another summation order grow, they
# can flip a 16-bit operand's rounding where a ReLU's kink turns it into a whole row's gradient
# (at P 2 x D 2, 1536 samples a step: at step 17, then 4e-4 relative by step 24; one process's
# --accumulate 2 moves as far from its unaccumulated run).
# Usage: pipeline_flags_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

pipeline_layout "$NP"
# 1536 samples: 24 (NP 2, 4) or 32 (NP 3) full global batches an epoch; 768: 12 or 16.
RUN=("${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --epochs 2)
SHORT=(--train-limit 768 --epochs 1)
PIPE=(--batch-size "$B" --pipeline-stages "$P" --micro-batches "$M")
ONE=(--batch-size $((B * D)))  # the unsplit model in one process: the same global batch
grad_scaler() {
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["grad_scaler"], sort_keys=True))' \
    "$(dirname "$(final_model "$1")")/state.json"
}
# both NAME FLAGS...: the unsplit run ($WORK/NAME_one) and the pipeline's ($WORK/NAME).
both() {
  local name=$1; shift
  dtrain_at 1 "$WORK/${name}_one.log" train "${RUN[@]}" "${ONE[@]}" "$@" --checkpoint-dir "$WORK/${name}_one"
  dtrain_at "$NP" "$WORK/$name.log" train "${RUN[@]}" "${PIPE[@]}" "$@" --checkpoint-dir "$WORK/$name"
}

both clip --clip-grad-norm 0.1
check "--clip-grad-norm: P $P x D $D logs the unsplit clipped run's losses and test set" \
  same_lines "$WORK/clip_one.log" "$WORK/clip.log"
final_weights_close "$WORK/clip_one" "$WORK/clip" 1e-5
check "--clip-grad-norm: weights within 1e-5 of the unsplit clipped run's" [ $? -eq 0 ]
dtrain_at 1 "$WORK/plain_one.log" train "${RUN[@]}" "${ONE[@]}" --checkpoint-dir "$WORK/plain_one"
! final_weights_close "$WORK/clip_one" "$WORK/plain_one" 1e-3
check "--clip-grad-norm 0.1 clips (the unsplit run moves more than 1e-3 from the unclipped one)" [ $? -eq 0 ]

both weighted --class-weights 0.5,2,1,0,3,1,1.5,0.25,1,4 "${SHORT[@]}"
check "--class-weights: P $P x D $D logs the unsplit weighted run's losses and test set" \
  same_lines "$WORK/weighted_one.log" "$WORK/weighted.log"
final_weights_close "$WORK/weighted_one" "$WORK/weighted" 1e-5
check "--class-weights: weights within 1e-5 of the unsplit weighted run's" [ $? -eq 0 ]
dtrain_at 1 "$WORK/short_one.log" train "${RUN[@]}" "${ONE[@]}" "${SHORT[@]}" --checkpoint-dir "$WORK/short_one"
! final_weights_close "$WORK/weighted_one" "$WORK/short_one" 1e-3
check "--class-weights: the unsplit weighted run moves more than 1e-3 from the unweighted one" [ $? -eq 0 ]

both bf16 --amp bf16 "${SHORT[@]}"
check "--amp bf16: P $P x D $D logs the unsplit bf16 run's losses and test set" \
  same_lines "$WORK/bf16_one.log" "$WORK/bf16.log"
final_weights_close "$WORK/bf16_one" "$WORK/bf16" 1e-5
check "--amp bf16: weights within 1e-5 of the unsplit bf16 run's" [ $? -eq 0 ]

FP16=(--amp fp16 --loss-scale-growth-interval 4)
DTRAIN_TEST_POISON_GRADS=3,7 dtrain_at 1 "$WORK/fp16_one.log" train "${RUN[@]}" "${ONE[@]}" "${FP16[@]}" \
  "${SHORT[@]}" --checkpoint-dir "$WORK/fp16_one"
export DTRAIN_TEST_POISON_GRADS="3@$((NP - 1)),7@0"
dtrain_at "$NP" "$WORK/fp16.log" train "${RUN[@]}" "${PIPE[@]}" "${FP16[@]}" "${SHORT[@]}" --checkpoint-dir "$WORK/fp16"
check "--amp fp16, an inf on one rank: P $P x D $D logs the unsplit run's losses, test set and skipped steps" \
  same_lines "$WORK/fp16_one.log" "$WORK/fp16.log"
final_weights_close "$WORK/fp16_one" "$WORK/fp16" 1e-5
check "--amp fp16, an inf on one rank: weights within 1e-5 of the unsplit run's that skips those steps" [ $? -eq 0 ]
one_state=$(grad_scaler "$WORK/fp16_one") pipe_state=$(grad_scaler "$WORK/fp16")
echo "# grad_scaler: $one_state / $pipe_state"
check "--amp fp16: state.json's grad_scaler is the unsplit run's" same_nonempty "$pipe_state" "$one_state"
check "--amp fp16: the two poisoned steps were skipped" \
  python3 -c 'import json,sys; sys.exit(json.loads(sys.argv[1])["skipped_steps"] < 2)' "$pipe_state"

# The run above resumed for a second epoch ends with an uninterrupted 2-epoch run's files bit for bit.
dtrain_at "$NP" "$WORK/full.log" train "${RUN[@]}" "${PIPE[@]}" "${FP16[@]}" "${SHORT[@]}" --epochs 2 \
  --checkpoint-dir "$WORK/full"
dtrain_at "$NP" "$WORK/res.log" train "${RUN[@]}" "${PIPE[@]}" "${FP16[@]}" "${SHORT[@]}" --epochs 2 \
  --checkpoint-dir "$WORK/fp16" --resume auto
check "--amp fp16: resumed at the epoch end, model.safetensors bitwise the uninterrupted run's" \
  cmp "$(final_model "$WORK/full")" "$(final_model "$WORK/fp16")"
check "--amp fp16: resumed, the uninterrupted run's grad_scaler state" \
  same_nonempty "$(grad_scaler "$WORK/fp16")" "$(grad_scaler "$WORK/full")"

# The runs below inject no inf (the fp16 runs' poison would otherwise land in whatever gradient
# a rank steps with first: under --zero 2 its own chunk, not the first parameter's).
unset DTRAIN_TEST_POISON_GRADS
# At D 1 a stage has no replicas to shard over (nothing is built): only a grid with D > 1 tests it.
if [ "$D" -gt 1 ]; then
  for z in 0 1 2; do
    dtrain_at "$NP" "$WORK/zero$z.log" train "${RUN[@]}" "${PIPE[@]}" "${SHORT[@]}" --optimizer adamw --zero "$z" --json
  done
  for z in 1 2; do
    check "--zero $z: the unsharded pipeline's weights bit for bit (fingerprints)" \
      same_nonempty "$(fingerprint "$WORK/zero$z.log")" "$(fingerprint "$WORK/zero0.log")"
    check "--zero $z: the memory line names the stage's shards" \
      grep -q "^memory per rank: .*(--zero $z over $D ranks: optimizer state for this rank's 1/$D" "$WORK/zero$z.log"
  done
  # --zero 2 with --clip-grad-norm: each replica's chunk's squares added over the stage's replicas,
  # then over the stages; the unsharded clipped pipeline's log lines and weights within 1e-5.
  for z in 0 2; do
    dtrain_at "$NP" "$WORK/zclip$z.log" train "${RUN[@]}" "${PIPE[@]}" "${SHORT[@]}" --optimizer adamw --zero "$z" \
      --clip-grad-norm 0.1 --checkpoint-dir "$WORK/zclip$z"
  done
  check "--zero 2 --clip-grad-norm: the unsharded clipped pipeline's losses and test set" \
    same_lines "$WORK/zclip0.log" "$WORK/zclip2.log"
  final_weights_close "$WORK/zclip0" "$WORK/zclip2" 1e-5
  check "--zero 2 --clip-grad-norm: weights within 1e-5 of the unsharded clipped pipeline's" [ $? -eq 0 ]
else
  echo "# SKIPPED --zero: P $P x D 1 has no replicas to shard a stage over (np 4 tests it)"
fi
finish
