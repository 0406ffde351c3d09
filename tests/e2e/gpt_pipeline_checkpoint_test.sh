#!/usr/bin/env bash
# Checkpoints of the GPT pipeline (Note [Pipeline checkpoints] in train/checkpointer.h, Note [A
# language model's position] in app/lm_trainer.cpp) on byte shards of Python's json package, at
# NP 2 (P 2) and NP 4 (P 2 x D 2):
# - model.safetensors holds the unsplit GPT's nanoGPT names, the tied wte once;
# - a copy of step 10 resumed with --resume auto at the same layout logs the uninterrupted run's
#   step and val lines from step 11 on (timings left out) and ends with its files bit for bit
#   (model.safetensors, every stage's optimizer shard, state.json);
# - the pipeline's step 10 resumed at P = 1 (np D, the same global batch) and the P = 1 run's step
#   10 resumed in the pipeline each read every token slot once over the two runs
#   (DTRAIN_TEST_SAMPLE_LOG) and end within 2e-4 relative of the P = 1 run;
# - the pipeline's step 10 resumed at P = 1 on as many ranks says it runs on another layout;
# - with --accumulate 2: the pipeline logs P = 1's norms and val losses, a resume at the same
#   layout ends bit for bit, and one at P = 1 reads every slot once and ends within 2e-4;
# - `dtrain eval` loads the pipeline's model.safetensors and gets the run's last val loss, and
#   `dtrain sample` loads it;
# - --init-weights: the pipeline started from the P = 1 run's weights logs what P = 1 started
#   from them logs (within the printed precision);
# - SIGTERM to the last rank mid-run: every rank stops at one boundary with exit 143, the
#   checkpoint of that step is saved, and --resume auto ends bit for bit as the uninterrupted run.
# Usage: gpt_pipeline_checkpoint_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
E2E_NO_IDX=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
case $NP in
  2) P=2; D=1; M=4 ;;
  4) P=2; D=2; M=2 ;;
  *) echo "NP must be 2 or 4"; exit 2 ;;
esac
B=12
json_byte_shards "$WORK/shards"
gpt=(train --model gpt --layers 2 --heads 2 --embd 32 --context 32 --data "$WORK/shards" --shuffle off --seed 3
  --steps 20 --warmup-steps 5 --lr-schedule cosine --optimizer adamw --lr 0.001 --weight-decay 0.1
  --clip-grad-norm 1.0 --eval-every 10 --eval-batches 2 --threads 1 --log-interval 1 --batch-size "$B"
  --checkpoint-every 10)
PIPE=(--pipeline-stages "$P" --micro-batches "$M")
# The step and val lines of LOG, the timing fields left out.
steps_of() { grep -E '^(step [0-9]|val loss)' "$1" | sed -E 's/ \| [0-9.]+ ms \| [0-9,]+ tokens\/s$//'; }
# same_steps A B: the same step and val lines, each number within 1.5e-4 (the 4 decimals printed).
# At D > 1 a step line's loss is left out: the data-parallel GPT logs rank 0's, the pipeline the
# replicas' mean (the norms are the global batch's in both).
same_steps() {
  local drop='s/^$//'
  [ "$D" -gt 1 ] && drop='s/ \| loss [0-9.]+ \|/ |/'
  python3 - <(steps_of "$1" | sed -E "$drop") <(steps_of "$2" | sed -E "$drop") <<'PY'
import re, sys
a, b = open(sys.argv[1]).read().split("\n"), open(sys.argv[2]).read().split("\n")
num = re.compile(r"-?[0-9][0-9.e+-]*")
ok = len(a) == len(b) and len(a) > 20
for x, y in zip(a, b):
    if num.sub("#", x) != num.sub("#", y) or any(
            abs(float(f) - float(g)) > 1.5e-4 for f, g in zip(num.findall(x), num.findall(y))):
        print(f"# differs: {x!r} vs {y!r}")
        ok = False
        break
sys.exit(0 if ok else 1)
PY
}
# Within 2e-4 relative per tensor: M micro-batches' GEMMs round unlike one, and AdamW's normalised
# steps carry those last bits into the attention biases, which start at 0 (worst 5e-5 at 20 steps).
close() { /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$1" "$2" 2e-4 >"$WORK/close.log" 2>&1; }
# every_slot_once FIRST SECOND TOTAL: the slots the first run read up to step 10 and all the
# second read are 0 .. TOTAL-1, each once.
every_slot_once() {
  { awk '$2 <= 10 { print $3 }' "$WORK/$1".rank*; awk '{ print $3 }' "$WORK/$2".rank*; } | sort -n >"$WORK/slots"
  seq 0 $(($3 - 1)) | cmp -s - "$WORK/slots"
}

DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-full" dtrain_at "$NP" "$WORK/full.log" "${gpt[@]}" "${PIPE[@]}" \
  --checkpoint-dir "$WORK/full"
check "P $P x D $D: the uninterrupted run saved steps 10 and 20" \
  test -f "$WORK/full/step-10/model.safetensors" -a -f "$WORK/full/step-20/model.safetensors"
names=$(python3 -c '
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
h.pop("__metadata__", None)
print(" ".join(sorted(h)))' "$WORK/full/step-20/model.safetensors")
check "model.safetensors: the unsplit GPT's 28 tensors (wte once, no lm_head)" \
  [ "$names" = "$(echo transformer.{wte,wpe}.weight transformer.ln_f.{weight,bias} \
    transformer.h.{0,1}.{ln_1,ln_2,attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj}.{weight,bias} | tr ' ' '\n' | LC_ALL=C sort | xargs)" ]

mkdir -p "$WORK/res"
cp -r "$WORK/full/step-10" "$WORK/res/"
dtrain_at "$NP" "$WORK/res.log" "${gpt[@]}" "${PIPE[@]}" --checkpoint-dir "$WORK/res" --resume auto
check "resumed from step 10" grep -q "^resume: from $WORK/res/step-10 (step 10, $((10 * D)) slots consumed)" "$WORK/res.log"
check "resume at P $P x D $D: the uninterrupted run's step and val lines from step 11 on" \
  diff <(steps_of "$WORK/full.log" | sed -n '/^step 11\//,$p') <(steps_of "$WORK/res.log")
same=1
for f in "$WORK"/full/step-20/*; do
  cmp -s "$f" "$WORK/res/step-20/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
check "resume at P $P x D $D: model, every optimizer shard and state.json bit for bit" [ "$same" -eq 1 ]

# --amp fp16: the scaler's state (scale, steps since the last skip) is in the checkpoint and
# restored, so the resumed run's state.json is the uninterrupted one's too.
dtrain_at "$NP" "$WORK/fp16.log" "${gpt[@]}" "${PIPE[@]}" --amp fp16 --checkpoint-dir "$WORK/fp16"
mkdir -p "$WORK/fp16res"
cp -r "$WORK/fp16/step-10" "$WORK/fp16res/"
dtrain_at "$NP" "$WORK/fp16res.log" "${gpt[@]}" "${PIPE[@]}" --amp fp16 --checkpoint-dir "$WORK/fp16res" --resume auto
same=1
for f in "$WORK"/fp16/step-20/*; do
  cmp -s "$f" "$WORK/fp16res/step-20/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
grep -q '"grad_scaler"' "$WORK/fp16/step-20/state.json" || same=0
check "--amp fp16 resumed at P $P x D $D: model, optimizer shards and state.json (the scaler's) bit for bit" \
  [ "$same" -eq 1 ]

# The unsplit GPT at np D with batch B per rank reads the pipeline's slots.
DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-one" dtrain_at "$D" "$WORK/one.log" "${gpt[@]}" --checkpoint-dir "$WORK/one"
check "P = 1 at np $D: the pipeline's norms, val losses (and at D 1 losses)" same_steps "$WORK/one.log" "$WORK/full.log"
# across FROM TO WHAT NP ARGS...: FROM's step 10 (its slots logged as slots-FROM) resumed at NP
# ranks with ARGS into TO reads every slot once over the two runs and ends near the P = 1 run.
across() {
  local from=$1 to=$2 what=$3 np=$4
  shift 4
  DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-$to" dtrain_at "$np" "$WORK/$to.log" "${gpt[@]}" "$@" \
    --resume "$WORK/$from/step-10" --checkpoint-dir "$WORK/$to"
  check "$what: resumed at slot $((10 * D))" \
    grep -q "^resume: from $WORK/$from/step-10 (step 10, $((10 * D)) slots consumed)" "$WORK/$to.log"
  check "$what: every slot 0..$((20 * D - 1)) read once over the two runs" \
    every_slot_once "slots-$from" "slots-$to" $((20 * D))
  close "$WORK/one/step-20/model.safetensors" "$WORK/$to/step-20/model.safetensors"
  check "$what: ends within 2e-4 of the P = 1 run" [ $? -eq 0 ]
}
across full to1 "P $P x D $D -> P = 1 at np $D" "$D"
across one toP "P = 1 -> P $P x D $D" "$NP" "${PIPE[@]}"

# Note [Resume layout]: the same world size on another grid (P = 1 at np NP) is noted as such;
# the same layout (res.log above) is not.
dtrain_at "$NP" "$WORK/flat.log" "${gpt[@]}" --resume "$WORK/full/step-10" --checkpoint-dir "$WORK/flat"
check "P $P x D $D -> P 1 x D $NP: the layout note" grep -q "^resume: saved at world size $NP (P $P x D $D), running \
at $NP (P 1 x D $NP): continuing from slot $((10 * D)), every slot once; not bitwise" "$WORK/flat.log"
check "the same layout: no layout note" sh -c "! grep -q '^resume: saved at world size' '$WORK/res.log'"

# --accumulate 2 (2 x D slots a step, Note [A language model's position]): the pipeline logs P = 1's
# (np D) norms and val losses; its step 10 resumed at the same layout ends bit for bit, and
# resumed at P = 1 reads every slot once over the two runs and ends within 2e-4 of P = 1's.
acc=("${gpt[@]}" --accumulate 2)
DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-accfull" dtrain_at "$NP" "$WORK/accfull.log" "${acc[@]}" "${PIPE[@]}" \
  --checkpoint-dir "$WORK/accfull"
dtrain_at "$D" "$WORK/accone.log" "${acc[@]}" --checkpoint-dir "$WORK/accone"
check "--accumulate 2: P = 1 at np $D's norms, val losses (and at D 1 losses)" \
  same_steps "$WORK/accone.log" "$WORK/accfull.log"
mkdir -p "$WORK/accres"
cp -r "$WORK/accfull/step-10" "$WORK/accres/"
dtrain_at "$NP" "$WORK/accres.log" "${acc[@]}" "${PIPE[@]}" --checkpoint-dir "$WORK/accres" --resume auto
check "--accumulate 2: resumed at slot $((20 * D))" \
  grep -q "^resume: from $WORK/accres/step-10 (step 10, $((20 * D)) slots consumed)" "$WORK/accres.log"
same=1
for f in "$WORK"/accfull/step-20/*; do
  cmp -s "$f" "$WORK/accres/step-20/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
check "--accumulate 2: resume at P $P x D $D, model, every optimizer shard and state.json bit for bit" [ "$same" -eq 1 ]
DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-accto1" dtrain_at "$D" "$WORK/accto1.log" "${acc[@]}" \
  --resume "$WORK/accfull/step-10" --checkpoint-dir "$WORK/accto1"
check "--accumulate 2, P $P x D $D -> P = 1: every slot 0..$((40 * D - 1)) read once over the two runs" \
  every_slot_once slots-accfull slots-accto1 $((40 * D))
close "$WORK/accone/step-20/model.safetensors" "$WORK/accto1/step-20/model.safetensors"
check "--accumulate 2, P $P x D $D -> P = 1: ends within 2e-4 of the P = 1 run" [ $? -eq 0 ]

# dtrain eval over the run's 2 validation slots of B sequences: the run's last val loss.
dtrain_at 1 "$WORK/eval.log" eval --weights "$WORK/full/step-20" --data "$WORK/shards" --batch-size "$B" \
  --eval-batches 2
run_val=$(sed -n 's/^val loss \([0-9.]*\)$/\1/p' "$WORK/full.log" | tail -n 1)
eval_val=$(sed -n 's/^val loss \([0-9.]*\) |.*/\1/p' "$WORK/eval.log")
check "dtrain eval loads the pipeline's model.safetensors: val loss $eval_val, the run's $run_val" \
  python3 -c "import sys; sys.exit(abs(float('$eval_val') - float('$run_val')) > 1.5e-4)"
dtrain_at 1 "$WORK/sample.log" sample --weights "$WORK/full" --prompt "def " --tokens 16 --temperature 0
check "dtrain sample loads it" [ $? -eq 0 -a -s "$WORK/sample.log" ]

# --init-weights: each stage takes its tensors of the file (the head its copy of wte).
dtrain_at "$D" "$WORK/init1.log" "${gpt[@]}" --init-weights "$WORK/one/step-20/model.safetensors"
dtrain_at "$NP" "$WORK/initP.log" "${gpt[@]}" "${PIPE[@]}" --init-weights "$WORK/one/step-20/model.safetensors"
check "--init-weights: the pipeline says so" grep -q "^initial weights: $WORK/one/step-20/model.safetensors" "$WORK/initP.log"
check "--init-weights: the pipeline logs P = 1's norms and val losses from the same weights" \
  same_steps "$WORK/init1.log" "$WORK/initP.log"
differ() { ! diff -q <(steps_of "$1") <(steps_of "$2") >/dev/null; }
check "--init-weights: not the seeded start" differ "$WORK/full.log" "$WORK/initP.log"

# SIGTERM to the last rank: every rank stops at one boundary, the step saved, resumed bit for bit.
long=("${gpt[@]}" "${PIPE[@]}" --steps 1500 --checkpoint-every 0 --eval-every 0)
dtrain_at "$NP" "$WORK/long.log" "${long[@]}" --checkpoint-dir "$WORK/long"
start_dtrain "$NP" "$WORK/stop.log" "${long[@]}" --checkpoint-dir "$WORK/stop"
launched=$LAUNCHED
wait_until 120 lines_at_least "$WORK/stop.log" 1 '^step 20/'
signal_and_wait "$launched" "$NP" $((NP - 1)) TERM
status=$?
check "SIGTERM: every rank stopped, exit 143 (got $status)" [ "$status" -eq 143 ]
grep "^dtrain: stopped" "$WORK/stop.log" | sed 's/^/# /'
step=$(sed -n 's/^dtrain: stopped by SIGTERM at step \([0-9]*\) .*/\1/p' "$WORK/stop.log")
check "SIGTERM: one line, and the checkpoint of step $step saved" \
  [ -n "$step" -a "$(latest_step "$WORK/stop")" = "$step" ]
dtrain_at "$NP" "$WORK/stopres.log" "${long[@]}" --checkpoint-dir "$WORK/stop" --resume auto
check "SIGTERM: the resumed run ran" grep -q "^resume: from $WORK/stop/step-$step " "$WORK/stopres.log"
same=1
for f in "$WORK"/long/step-1500/*; do
  cmp -s "$f" "$WORK/stop/step-1500/$(basename "$f")" || { same=0; echo "# differs: $(basename "$f")"; }
done
check "SIGTERM: resumed, the uninterrupted run's files bit for bit" [ "$same" -eq 1 ]
finish
