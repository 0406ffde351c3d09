#!/usr/bin/env bash
# `dtrain eval` with GPT weights and the language model's progress line (issue 21), at NP ranks:
#  - eval of the weights a run saved, over the same --eval-batches K slots of B sequences, prints
#    the validation loss the run logged as its last (its --json val_loss, to 1e-6) and exp of it
#    as the perplexity; over all val slots (the default) the loss is the same at 1 rank and at NP
#    (the slots sharded across the ranks, summed once); image-model flags with token shards are
#    one line and exit 2;
#  - `dtrain train --model gpt --progress on` redraws one line in place (carriage returns) with
#    step/steps, percent, tokens/s, loss, lr and ETA, instead of the per-step log lines; the val
#    loss lines still come, each on a line of its own.
#   lm_eval_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: lm_eval_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: lm_eval_test.sh PATH/TO/dtrain NP}
E2E_NO_IDX=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
json_byte_shards "$WORK/shards"
GPT=(train --model gpt --threads 1 --layers 1 --heads 2 --embd 16 --context 16 --batch-size 4 --data "$WORK/shards"
     --lr 3e-3 --warmup-steps 2 --lr-schedule cosine --shuffle off --log-interval 5)
C="$WORK/C"
if ! dtrain_at "$NP" "$WORK/train.log" "${GPT[@]}" --steps 12 --eval-batches 6 --json --checkpoint-dir "$C" ||
    ! has_checkpoint "$C"; then
  not_ok "a tiny GPT trained at np $NP" "$(tail -3 "$WORK/train.log")"
  finish
fi
trained=$(/usr/bin/python3 -c "import json; print([json.loads(l) for l in open('$WORK/train.log') if l.startswith('{')][-1]['val_loss'])")

# eval_loss LOG: the loss of LOG's "val loss X | perplexity P | ..." line.
eval_loss() { sed -n 's/^val loss \([0-9.]*\) | perplexity .*/\1/p' "$1"; }
dtrain_at "$NP" "$WORK/eval.log" eval --threads 1 --weights "$C" --data "$WORK/shards" --eval-batches 6 --batch-size 4
status=$?
check "eval exits 0 (status $status: $(tail -1 "$WORK/eval.log"))" [ "$status" = 0 ]
got=$(eval_loss "$WORK/eval.log")
echo "# trained: val_loss $trained; eval: $(grep '^val loss' "$WORK/eval.log")"
check "eval's loss over the same 6 slots is the run's last val loss ($got vs $trained)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if abs(float('$got') - float('$trained')) <= 1e-6 else 1)"
check "the perplexity is exp(loss), and the slots are named" /usr/bin/python3 -c "
import math, re, sys
m = re.search(r'^val loss ([0-9.]+) \| perplexity ([0-9.]+) \| 6 slots of 4x16 tokens$', open('$WORK/eval.log').read(), re.M)
sys.exit(0 if m and abs(math.exp(float(m[1])) - float(m[2])) <= 0.01 else 1)"

dtrain_at "$NP" "$WORK/all.log" eval --threads 1 --weights "$C/step-12/model.safetensors" --data "$WORK/shards" --batch-size 4
dtrain_at 1 "$WORK/all1.log" eval --threads 1 --weights "$C/step-12/model.safetensors" --data "$WORK/shards" --batch-size 4
all=$(eval_loss "$WORK/all.log") all1=$(eval_loss "$WORK/all1.log")
slots=$(sed -n 's/.* | \([0-9]*\) slots of .*/\1/p' "$WORK/all.log")
echo "# all val slots ($slots): np $NP $all, np 1 $all1"
check "by default every val slot ($slots, more than 6)" [ "${slots:-0}" -gt 6 ]
check "all slots: np $NP equals np 1 ($all vs $all1)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if abs(float('$all') - float('$all1')) <= 1e-5 else 1)"

dtrain_at "$NP" "$WORK/flag.log" eval --threads 1 --weights "$C" --data "$WORK/shards" --hidden 64
status=$?
check "--hidden with token shards: exit 2 (status $status)" [ "$status" = 2 ]
check "one line saying why" grep -qx 'dtrain: error: --hidden: not with --model gpt (an image-model flag)' "$WORK/flag.log"
dtrain_at "$NP" "$WORK/mlp.log" eval --threads 1 --weights "$C" --data "$WORK/shards" --model mlp
status=$?
check "--model mlp with token shards: exit 2 (status $status)" [ "$status" = 2 ]

# The progress line.
dtrain_at "$NP" "$WORK/progress.log" "${GPT[@]}" --steps 10 --eval-every 5 --eval-batches 2 --progress on
status=$?
check "--progress on with --model gpt: exit 0 (status $status)" [ "$status" = 0 ]
check "redrawn in place: carriage returns" grep -q $'\r' "$WORK/progress.log"
check "the last draw: step 10/10 100%, tokens/s, loss, lr, ETA" \
  grep -Eq $'\rstep 10/10 100% \\[#+\\]  [0-9]+ tokens/s  loss [0-9.]+  lr [0-9.]+e-0[0-9]  ETA 0:00' "$WORK/progress.log"
check "no per-step log lines" bash -c "! grep -q '^step [0-9]*/10 |' '$WORK/progress.log'"
check "the val loss lines, each on its own line (2)" [ "$(grep -c '^val loss [0-9.]*$' "$WORK/progress.log")" = 2 ]
finish
