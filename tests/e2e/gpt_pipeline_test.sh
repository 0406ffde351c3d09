#!/usr/bin/env bash
# `dtrain train --model gpt --pipeline-stages` end to end (Note [GPT pipeline stages] in
# model/gpt.h): on byte shards of /usr/lib/python3.11/json (`dtrain data shard --bytes`), at NP 2
# (P 2), NP 3 (P 3) and NP 4 (P 2 x D 2) every step's loss and gradient norm equal one process's
# on the same global batch (AdamW, warm-up, cosine, clipping; within the printed precision), and
# so does the validation loss at D 1 (at D 2 a validation slot holds B sequences, not 2B: other
# text), with --accumulate 2 too; GPipe and 1F1B end with the same parameters bit for bit; with
# --amp fp16 and an inf injected on one rank (the last, at step 4), every rank skips that step as
# one process that poisons it does (the same losses, norms, scale and skipped count); with
# --class-weights per token id likewise (the weighted mean over the global batch); a
# --pipeline-split that leaves a stage no layer is one line and a non-zero exit.
# Usage: gpt_pipeline_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
E2E_NO_IDX=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
TEXT=/usr/lib/python3.11/json
[ -d "$TEXT" ] || { echo "SKIPPED: $TEXT not found (Python 3.11's standard library)"; exit 77; }
case $NP in
  2) P=2; D=1; M=4 ;;
  3) P=3; D=1; M=3 ;;
  4) P=2; D=2; M=2 ;;
  *) echo "NP must be 2, 3 or 4"; exit 2 ;;
esac
B=12
if ! "$DTRAIN" data shard --bytes "$TEXT" -o "$WORK/shards" >"$WORK/shard.log" 2>&1; then
  not_ok "byte shards of $TEXT" "$(tail -3 "$WORK/shard.log")"
  finish
fi
gpt=(train --model gpt --layers 2 --heads 2 --embd 32 --context 32 --data "$WORK/shards" --shuffle off --seed 3
  --steps 20 --warmup-steps 5 --lr-schedule cosine --optimizer adamw --lr 0.001 --beta2 0.95 --adam-eps 1e-6
  --weight-decay 0.1 --clip-grad-norm 1.0 --eval-every 10 --eval-batches 2 --threads 1 --log-interval 1 --json)
# same_steps A B: the same step and val lines, each number within 1.5e-4 (the 4 decimals printed)
# of the other's, the timing fields left out.
same_steps() {
  python3 - "$1" "$2" "$D" <<'PY'
import re, sys
def lines(path):
    out = []
    for l in open(path):
        if l.startswith("step ") or (l.startswith("val loss") and sys.argv[3] == "1"):
            out.append([f for f in l.strip().split(" | ") if not re.search(r"ms$|tokens/s$", f)])
    return out
a, b = lines(sys.argv[1]), lines(sys.argv[2])
num = re.compile(r"[-0-9.e+]+$")
ok = len(a) == len(b) and len(a) >= 12
for x, y in zip(a, b):
    for f, g in zip(x, y):
        mf, mg = num.search(f), num.search(g)
        if f[: mf.start() if mf else len(f)] != g[: mg.start() if mg else len(g)]:
            ok = False
        elif mf and mg and "/" not in f and abs(float(mf.group()) - float(mg.group())) > 1.5e-4:
            ok = False
    if not ok:
        print(f"# differs: {x!r} vs {y!r}")
        break
sys.exit(0 if ok else 1)
PY
}

dtrain_at 1 "$WORK/ref.log" "${gpt[@]}" --batch-size $((B * D))
check "np 1 reference ran (exit $?)" grep -q "^val loss" "$WORK/ref.log"
for schedule in 1f1b gpipe; do
  dtrain_at "$NP" "$WORK/$schedule.log" "${gpt[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M" \
    --pipeline-schedule "$schedule"
  check "$schedule: P $P x D $D logs the np 1 run's losses, norms and val losses" \
    same_steps "$WORK/ref.log" "$WORK/$schedule.log"
done
# --accumulate 2: two pipeline steps of B x D sequences per optimizer step, the gradients summed
# over the replicas in the second's last micro-batch only (Note [Pipeline loss]): the np 1 run's
# --accumulate 2 losses, norms and val losses.
dtrain_at 1 "$WORK/ref-acc.log" "${gpt[@]}" --batch-size $((B * D)) --accumulate 2
dtrain_at "$NP" "$WORK/acc.log" "${gpt[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M" \
  --accumulate 2
check "--accumulate 2: P $P x D $D logs the np 1 run's losses, norms and val losses" \
  same_steps "$WORK/ref-acc.log" "$WORK/acc.log"
loss_at_20() { sed -n 's/^step 20\/20 | loss \([0-9.]*\) .*/\1/p' "$1"; }
check "--accumulate 2: another run than --accumulate 1 (loss at step 20 $(loss_at_20 "$WORK/acc.log"))" \
  [ -n "$(loss_at_20 "$WORK/acc.log")" -a "$(loss_at_20 "$WORK/acc.log")" != "$(loss_at_20 "$WORK/ref.log")" ]
check "gpipe and 1f1b end bit for bit alike" \
  same_nonempty "$(fingerprint "$WORK/1f1b.log")" "$(fingerprint "$WORK/gpipe.log")"
check "the bubble line" grep -q "^pipeline: idle share per stage" "$WORK/1f1b.log"

# --class-weights per token id (Note [Pipeline class weights]): the weighted mean over the global
# batch, the np 1 run's losses, norms and val losses (the val loss unweighted).
vocab=256  # byte shards (another count would be refused in one line, exit 2)
weights=$(python3 -c 'import sys; print(",".join(str(0.25 + (i % 7) / 2) for i in range(int(sys.argv[1]))))' "$vocab")
dtrain_at 1 "$WORK/ref-w.log" "${gpt[@]}" --steps 12 --batch-size $((B * D)) --class-weights "$weights"
dtrain_at "$NP" "$WORK/w.log" "${gpt[@]}" --steps 12 --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M" \
  --class-weights "$weights"
check "--class-weights ($vocab token ids): P $P x D $D logs the np 1 weighted run's losses, norms and val losses" \
  same_steps "$WORK/ref-w.log" "$WORK/w.log"
# Not vacuous: step 1 (the same weights, before any update) weighs the tokens otherwise.
check "--class-weights: the weighted run's step-1 loss is not the unweighted one's" \
  sh -c '[ -n "$1" ] && [ -n "$2" ] && [ "$1" != "$2" ]' _ \
  "$(sed -n 's/^step 1\/12 | loss \([0-9.]*\) .*/\1/p' "$WORK/ref-w.log")" \
  "$(sed -n 's/^step 1\/20 | loss \([0-9.]*\) .*/\1/p' "$WORK/ref.log")"

# --amp fp16 (Note [Loss scaling]): the world votes on an inf found by one stage of one replica.
fp16=(--amp fp16 --loss-scale-growth-interval 5 --steps 12)
DTRAIN_TEST_POISON_GRADS=4 dtrain_at 1 "$WORK/fp16_ref.log" "${gpt[@]}" "${fp16[@]}" --batch-size $((B * D))
DTRAIN_TEST_POISON_GRADS="4@$((NP - 1))" dtrain_at "$NP" "$WORK/fp16.log" "${gpt[@]}" "${fp16[@]}" \
  --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M"
check "--amp fp16, an inf on rank $((NP - 1)): P $P x D $D logs the np 1 run's losses, norms, scales and skips" \
  same_steps "$WORK/fp16_ref.log" "$WORK/fp16.log"
check "--amp fp16: the poisoned step was skipped" grep -q "(1 skipped)" "$WORK/fp16.log"
# Not vacuous: the stages' GEMMs round to fp16 (below the printed precision at this size).
for amp in off fp16; do
  dtrain_at "$NP" "$WORK/clean_$amp.log" "${gpt[@]}" --steps 12 --amp "$amp" --batch-size "$B" --pipeline-stages "$P" \
    --micro-batches "$M"
done
check "--amp fp16 ends with other weights than float32" \
  sh -c '[ -n "$1" ] && [ -n "$2" ] && [ "$1" != "$2" ]' _ "$(fingerprint "$WORK/clean_off.log")" "$(fingerprint "$WORK/clean_fp16.log")"

# Layer 0 (the embeddings) cannot start a stage.
bad_split=$([ "$P" = 2 ] && echo 0 || echo 0,2)
dtrain_at "$NP" "$WORK/split.log" "${gpt[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M" \
  --pipeline-split "$bad_split"
status=$?
check "--pipeline-split $bad_split: non-zero exit ($status)" [ "$status" -ne 0 ]
check "--pipeline-split: one line naming the GPT's layers" grep -q "the GPT's layers: 0 the embeddings" "$WORK/split.log"

# A stage over --memory-per-rank: every rank stops alike with one line (none waits, no MPI_Abort).
dtrain_at "$NP" "$WORK/big.log" "${gpt[@]}" --batch-size "$B" --pipeline-stages "$P" --micro-batches "$M" \
  --memory-per-rank 1K
status=$?
check "a stage over --memory-per-rank: the resources exit (71), got $status" [ "$status" -eq 71 ]
check "a stage over --memory-per-rank: no MPI_Abort" sh -c "! grep -q 'errorcode' '$WORK/big.log'"
check "a stage over --memory-per-rank: one line" [ "$(grep -c '^dtrain: error: .*memory budget' "$WORK/big.log")" -eq 1 ]
finish
