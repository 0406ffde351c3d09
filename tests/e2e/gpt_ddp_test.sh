#!/usr/bin/env bash
# DDP semantics of the language-model loop (issue 21, "must show"): a GPT trained by 2 ranks of B
# sequences equals one rank of 2B, every tensor within 1e-5 (max|d| / max|w|). With --shuffle off
# rank r at step s reads slot 2s + r of B*T tokens; slots 2s and 2s + 1 together are the 1-rank
# run's slot s of 2B*T tokens, and the mean of the two ranks' mean gradients is the mean over 2B.
# AdamW with warm-up, cosine, weight decay and clipping (the global norm after the all-reduce,
# the same decision on every rank), at eps 1e-6: at eps 1e-8 AdamW turns the rounding noise of
# gradients that are exactly zero (the key bias, Note [The key bias] in
# tests/torch/gpt_fidelity_test.py) into steps, and the two runs, which sum in other orders, differ
# there by 8.7e-5 (every other tensor within 7e-6; measured at lr 3e-3). Byte shards from /usr/lib/python3.11/json via
# `dtrain data shard --bytes`; few enough steps that neither run wraps around its slots.
#   gpt_ddp_test.sh PATH/TO/dtrain
set -uo pipefail
DTRAIN=${1:?usage: gpt_ddp_test.sh PATH/TO/dtrain}
E2E_NO_IDX=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
TEXT=/usr/lib/python3.11/json
[ -d "$TEXT" ] || { echo "SKIPPED: $TEXT not found (Python 3.11's standard library)"; exit 77; }
/usr/bin/python3 -c "import numpy" 2>/dev/null || { echo "SKIPPED: python3 cannot import numpy (/usr/bin/python3: to compare the weights)"; exit 77; }

if ! "$DTRAIN" data shard --bytes "$TEXT" -o "$WORK/shards" >"$WORK/shard.log" 2>&1; then
  not_ok "byte shards of $TEXT" "$(tail -3 "$WORK/shard.log")"
  finish
fi
B=4
gpt=(train --model gpt --layers 2 --heads 2 --embd 32 --context 32 --data "$WORK/shards" --shuffle off --seed 3
  --steps 30 --warmup-steps 5 --lr-schedule cosine --optimizer adamw --lr 0.001 --beta2 0.95 --adam-eps 1e-6 --weight-decay 0.1
  --clip-grad-norm 1.0 --eval-batches 2 --threads 1 --quiet --json)
dtrain_at 1 "$WORK/np1.log" "${gpt[@]}" --batch-size $((2 * B)) --checkpoint-dir "$WORK/np1"
check "1 rank x $((2 * B)) sequences trains (exit $?)" has_checkpoint "$WORK/np1"
dtrain_at 2 "$WORK/np2.log" "${gpt[@]}" --batch-size $B --checkpoint-dir "$WORK/np2"
check "2 ranks x $B sequences train (exit $?)" has_checkpoint "$WORK/np2"
if has_checkpoint "$WORK/np1" && has_checkpoint "$WORK/np2"; then
  /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$(final_model "$WORK/np1")" "$(final_model "$WORK/np2")" 1e-5 \
    >"$WORK/close.log" 2>&1
  status=$?
  sed 's/^/#   /' "$WORK/close.log"
  check "2 ranks x $B equal 1 rank x $((2 * B)) within 1e-5 per tensor" [ "$status" -eq 0 ]
else
  tail -5 "$WORK/np1.log" "$WORK/np2.log"
fi
finish
