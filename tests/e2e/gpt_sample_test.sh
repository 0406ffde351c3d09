#!/usr/bin/env bash
# `dtrain sample` (issue 21, item 6) with a tiny GPT trained on byte shards: the output is the
# prompt and then exactly N bytes; the same seed gives the same text, another seed other text,
# temperature 0 the same text whatever the seed; a checkpoint directory, a step-N and the
# model.safetensors file are the same weights; a prompt longer than the context is fine. Bad
# flags are one line and exit 2; weights that are not a byte-level GPT one line and exit 66.
#   gpt_sample_test.sh PATH/TO/dtrain
set -uo pipefail
DTRAIN=${1:?usage: gpt_sample_test.sh PATH/TO/dtrain}
E2E_NO_IDX=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
json_byte_shards "$WORK/shards"
tiny=(train --model gpt --layers 1 --heads 2 --embd 16 --context 16 --data "$WORK/shards" --batch-size 4
  --optimizer adamw --lr 0.01 --threads 1 --quiet)
C="$WORK/C"
if ! dtrain_at 1 "$WORK/train.log" "${tiny[@]}" --steps 20 --checkpoint-dir "$C" || ! has_checkpoint "$C"; then
  not_ok "a tiny byte-level GPT trained" "$(tail -3 "$WORK/train.log")"
  finish
fi

# sample NAME ARGS...: stdout to $WORK/NAME.out, stderr to $WORK/NAME.err; returns the status.
sample() {
  local name=$1
  shift
  OPENBLAS_NUM_THREADS=1 "$DTRAIN" sample --threads 1 "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
}
same() { cmp -s "$WORK/$1.out" "$WORK/$2.out"; }
differ() { ! same "$1" "$2"; }
N=40
sample a --weights "$C" --prompt "def " --tokens $N --seed 1
status=$?
check "sample exits 0 (got $status: $(head -c 200 "$WORK/a.err"))" [ "$status" -eq 0 ]
echo "#   $(od -c "$WORK/a.out" | head -3 | tr '\n' ' ')"
check "the output is the prompt, then $N bytes, then a newline" \
  [ "$(head -c 4 "$WORK/a.out")" = "def " -a "$(stat -c %s "$WORK/a.out")" -eq $((4 + N + 1)) ]
sample b --weights "$C" --prompt "def " --tokens $N --seed 1
check "the same seed, the same text" same a b
sample c --weights "$C" --prompt "def " --tokens $N --seed 2
check "another seed, other text" differ a c
sample g1 --weights "$C" --prompt "def " --tokens $N --temperature 0 --seed 1
sample g2 --weights "$C" --prompt "def " --tokens $N --temperature 0 --seed 2
check "temperature 0 (greedy): the same text whatever the seed" same g1 g2
sample k1 --weights "$C" --prompt "def " --tokens $N --top-k 1 --seed 5
check "top-k 1 is greedy" same g1 k1
step="$C/step-$(latest_step "$C")"
sample s --weights "$step" --prompt "def " --tokens $N --seed 1
check "a step-N is the same weights" same a s
sample f --weights "$step/model.safetensors" --prompt "def " --tokens $N --seed 1
check "its model.safetensors is the same weights" same a f
long=$(printf 'import json\n%.0s' 1 2 3 4 5 6)  # 72 bytes, context 16
sample l --weights "$C" --prompt "$long" --tokens 8 --seed 1
status=$?
check "a prompt longer than the context (exit $status, $(head -c 200 "$WORK/l.err"))" \
  [ "$(stat -c %s "$WORK/l.out" 2>/dev/null)" = $((${#long} + 8 + 1)) ]

# No training data is needed to sample or to time a GEMM: with the default --data folder
# (Fashion-MNIST's) hidden by an empty tmpfs in a private mount namespace, both still run.
hidden=/usr/share/datasets
if [ -d "$hidden" ] && unshare -rm true 2>/dev/null; then
  unshare -rm bash -c "mount -t tmpfs none $hidden && OPENBLAS_NUM_THREADS=1 '$DTRAIN' sample --threads 1 \
    --weights '$C' --prompt 'def ' --tokens $N --seed 1" >"$WORK/nodata.out" 2>"$WORK/nodata.err"
  status=$?
  check "sample without the default data folder: exit 0 (got $status: $(head -c 200 "$WORK/nodata.err"))" [ "$status" -eq 0 ]
  check "sample without the default data folder: the same text" same a nodata
  unshare -rm bash -c "mount -t tmpfs none $hidden && '$DTRAIN' bench gemm --threads 1 --size 16 --repeat 1" \
    >"$WORK/gemm.out" 2>"$WORK/gemm.err"
  status=$?
  check "bench gemm without the default data folder: exit 0 (got $status: $(head -c 200 "$WORK/gemm.err"))" [ "$status" -eq 0 ]
else
  echo "# skipped the no-data-folder cases: no $hidden or no unshare -rm here"
fi

# refused NAME STATUS WORDS ARGS...: one line "dtrain: error: ...WORDS...", exit STATUS, no text.
refused() {
  local name=$1 status=$2 words=$3
  shift 3
  sample "$name" "$@"
  local got=$?
  check "$name: exit $status (got $got: $(head -c 300 "$WORK/$name.err"))" [ "$got" -eq "$status" ]
  check "$name: one line naming '$words'" [ "$(wc -l <"$WORK/$name.err")" -eq 1 -a \
    "$(grep -c "^dtrain: error: .*$words" "$WORK/$name.err")" -eq 1 ]
  check "$name: no text printed" [ ! -s "$WORK/$name.out" ]
}
refused no_tokens 2 "--tokens" --weights "$C" --prompt "def "
refused zero_tokens 2 "--tokens" --weights "$C" --prompt "def " --tokens 0
refused no_prompt 2 "--prompt" --weights "$C" --tokens 3
refused no_weights 2 "--weights" --prompt "def " --tokens 3
refused negative_temperature 2 "--temperature" --weights "$C" --prompt "x" --tokens 3 --temperature -0.5
refused negative_top_k 2 "--top-k" --weights "$C" --prompt "x" --tokens 3 --top-k -1
refused unknown_flag 2 "beam" --weights "$C" --prompt "x" --tokens 3 --beam 4
refused missing_weights 66 "$WORK/nowhere" --weights "$WORK/nowhere" --prompt "x" --tokens 3
# A GPT over 300 tokens is not byte-level.
V="$WORK/V300"
dtrain_at 1 "$WORK/v300.log" "${tiny[@]}" --vocab 300 --steps 1 --checkpoint-dir "$V"
refused vocab_300 66 "byte-level" --weights "$V" --prompt "x" --tokens 3
# A file without the architecture (the image models' weights, or a file written elsewhere).
python3 - "$step/model.safetensors" "$WORK/bare.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n]); header.pop("__metadata__", None)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
refused no_metadata 66 "not a GPT" --weights "$WORK/bare.safetensors" --prompt "x" --tokens 3
finish
