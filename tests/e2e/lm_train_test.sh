#!/usr/bin/env bash
# A tiny GPT (--model gpt, L1 H2 C16 T16) on byte-level llm.c shards of the Python json package
# (written here as llmc_shards.py writes them): the loss falls and the validation loss is
# printed; a checkpoint resumed with --resume auto at the same world size ends bitwise equal to the
# uninterrupted run; resumed at another world size it continues from the saved slot position,
# every training slot read once (DTRAIN_TEST_SAMPLE_LOG), shuffled too; a malformed shard is one line and exit
# 65 (data); a bad GPT flag is one line and exit 2 (usage); --class-weights weigh token ids.
# With ZERO (1 or 2) every run uses --zero ZERO (with --clip-grad-norm: under ZeRO-2 the norm of
# the shards) and the resume compares every optimizer shard file.
#   lm_train_test.sh PATH/TO/dtrain NP [NP_RESUMED [ZERO]]
set -uo pipefail
DTRAIN=${1:?usage: lm_train_test.sh PATH/TO/dtrain NP [NP_RESUMED [ZERO]]}
NP=${2:?usage: lm_train_test.sh PATH/TO/dtrain NP [NP_RESUMED [ZERO]]}
NP2=${3:-$NP}
ZERO=${4:-0}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

SRC=/usr/lib/python3.11/json
if [ ! -d "$SRC" ] || ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "SKIPPED: needs $SRC and python3 with numpy to write the shards"
  exit 77
fi
SHARDS="$WORK/shards"
# llm.c's format (header of 256 int32: magic 20240520, version 1, count; uint16 tokens); the val
# shard is the first 1/20 of the bytes, as llmc_shards.py and `dtrain data shard --bytes` split.
/usr/bin/python3 - "$SHARDS" "$SRC" <<'PY'
import glob, os, sys, numpy as np
out, src = sys.argv[1], sys.argv[2]
data = b"".join(open(f, "rb").read() for f in sorted(glob.glob(os.path.join(src, "*.py"))))
os.makedirs(out, exist_ok=True)
def write(path, toks):
    h = np.zeros(256, dtype="<i4"); h[0], h[1], h[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(h.tobytes()); f.write(np.frombuffer(toks, dtype=np.uint8).astype("<u2").tobytes())
n_val = min(len(data) // 20, 1 << 20)
write(os.path.join(out, "bytes_val_000000.bin"), data[:n_val])
write(os.path.join(out, "bytes_train_000000.bin"), data[n_val:])
PY

GPT=(train --model gpt --threads 1 --layers 1 --heads 2 --embd 16 --context 16 --batch-size 4
     --lr 3e-3 --warmup-steps 2 --lr-schedule cosine --weight-decay 0.1 --beta2 0.95 --clip-grad-norm 1
     --eval-batches 4 --shuffle off --log-interval 5)
# Several buckets, and a model large enough (1.6 M parameters: DDP's first bucket is 1 MiB) that
# ZeRO-2's ring of two buckets holds less than the whole gradient (Note [ZeRO-2 gradient ring];
# wte is written by the head long before its bucket is ready).
EMBD=16
if [ "$ZERO" -gt 0 ]; then
  EMBD=64
  GPT+=(--zero "$ZERO" --bucket-cap-mb 0.5 --layers 32 --embd "$EMBD")
fi

# 1. Trains: the loss falls, the log is llm.c's, the JSON line carries the contract's fields.
if dtrain_at "$NP" "$WORK/train.log" "${GPT[@]}" --data "$SHARDS" --steps 30 --eval-every 10 --json --metrics "$WORK/m.jsonl"; then
  first=$(sed -n 's/^step 1\/30 | loss \([0-9.]*\) .*/\1/p' "$WORK/train.log")
  last=$(sed -n 's/^step 30\/30 | loss \([0-9.]*\) .*/\1/p' "$WORK/train.log")
  echo "# loss: step 1 $first, step 30 $last"
  check "the loss falls (step 1 $first > step 30 $last + 0.3)" \
    /usr/bin/python3 -c "import sys; sys.exit(0 if float('$first') > float('$last') + 0.3 else 1)"
  check "log lines: step | loss | norm | lr | ms | tokens/s" \
    grep -Eq '^step 10/30 \| loss [0-9.]+ \| norm [0-9.]+ \| lr [0-9.]+e-0[0-9] \| [0-9]+ ms \| [0-9,]+ tokens/s$' "$WORK/train.log"
  check "val loss at --eval-every and at the end (3 lines)" [ "$(grep -c '^val loss [0-9.]*$' "$WORK/train.log")" = 3 ]
  check "--json: tokens_per_s, train_loss, val_loss, steps 30, world_size $NP, parameters" \
    /usr/bin/python3 -c "
import json, sys
j = json.loads([l for l in open('$WORK/train.log') if l.startswith('{')][-1])
assert j['steps'] == 30 and j['world_size'] == $NP and j['parameters'] > 0, j
assert j['tokens_per_s'] > 0 and 0 < j['train_loss'] < 10 and 0 < j['val_loss'] < 10, j"
  check "--metrics: step and eval records" bash -c "grep -q '\"type\":\"step\"' '$WORK/m.jsonl' && grep -q '\"type\":\"eval\"' '$WORK/m.jsonl'"
else
  not_ok "training run" "$(tail -3 "$WORK/train.log")"
fi

# 2. Resume: the uninterrupted run saves step-10 and step-20; a copy of its step-10 resumed with
# --resume auto (at NP2 ranks) must end where it ended (bitwise at the same world size).
ref="$WORK/ref" run="$WORK/run"
export DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-ref"
if dtrain_at "$NP" "$WORK/ref.log" "${GPT[@]}" --data "$SHARDS" --steps 20 --checkpoint-every 10 --keep 5 --checkpoint-dir "$ref"; then
  mkdir -p "$run" && cp -r "$ref/step-10" "$run/" && echo step-10 >"$run/latest"
  export DTRAIN_TEST_SAMPLE_LOG="$WORK/slots-run"
  if dtrain_at "$NP2" "$WORK/run.log" "${GPT[@]}" --data "$SHARDS" --steps 20 --checkpoint-every 10 --keep 5 --checkpoint-dir "$run" \
      --resume auto; then
    check "the resumed run says where it resumed" grep -q "^resume: from $run/step-10 (step 10, $((10 * NP)) slots consumed)" "$WORK/run.log"
    if [ "$NP2" = "$NP" ]; then
      check "resume at np $NP: final model.safetensors bitwise identical (cmp)" cmp "$ref/step-20/model.safetensors" "$run/step-20/model.safetensors"
      if [ "$ZERO" = 2 ]; then
        check "--zero 2: the gradient ring is in use" grep -q "^memory per rank: .*a ring of bucket buffers" "$WORK/ref.log"
      fi
      if [ "$ZERO" -gt 0 ]; then
        for ((r = 0; r < NP; r++)); do
          f="optimizer-rank$r-of-$NP.safetensors"
          check "resume at np $NP, --zero $ZERO: $f bitwise identical (cmp)" cmp "$ref/step-20/$f" "$run/step-20/$f"
        done
      else
        check "resume at np $NP: optimizer state bitwise identical (cmp)" cmp "$ref/step-20/optimizer.safetensors" "$run/step-20/optimizer.safetensors"
      fi
    else
      check "resume at np $NP2 from np $NP: the world-size note" grep -q "^resume: saved at world size $NP, running at $NP2: continuing from slot $((10 * NP))" "$WORK/run.log"
      # Slots read: the first run's steps 1-10, then the resumed run's steps 11-20: each once, none skipped.
      total=$((10 * NP + 10 * NP2))
      check "every slot 0..$((total - 1)) read once over the two runs" bash -c "
        { awk '\$2 <= 10 { print \$3 }' '$WORK'/slots-ref.rank*; awk '{ print \$3 }' '$WORK'/slots-run.rank*; } | sort -n >'$WORK/slots'
        seq 0 $((total - 1)) | cmp -s - '$WORK/slots'"
    fi
  else
    not_ok "resumed run" "$(tail -3 "$WORK/run.log")"
  fi
else
  not_ok "uninterrupted run" "$(tail -3 "$WORK/ref.log")"
fi
unset DTRAIN_TEST_SAMPLE_LOG

# 2b. Shuffled (--shuffle on), resumed at another world size: the log records the slot read (not
# the counter), so the two runs together must read exactly the slots an uninterrupted run at NP2
# reads for the same counters (one seeded permutation per epoch), each once, and not in order.
total=$((10 * NP + 10 * NP2))
if [ "$NP2" != "$NP" ] && [ $((total % NP2)) = 0 ]; then
  SHUF=("${GPT[@]/off/on}")  # the only "off" in GPT is --shuffle's value
  sref="$WORK/sref" srun="$WORK/srun"
  export DTRAIN_TEST_SAMPLE_LOG="$WORK/sslots-ref"
  if dtrain_at "$NP" "$WORK/sref.log" "${SHUF[@]}" --data "$SHARDS" --steps 20 --checkpoint-every 10 --checkpoint-dir "$sref" &&
      mkdir -p "$srun" && cp -r "$sref/step-10" "$srun/" && echo step-10 >"$srun/latest" &&
      DTRAIN_TEST_SAMPLE_LOG="$WORK/sslots-run" dtrain_at "$NP2" "$WORK/srun.log" "${SHUF[@]}" --data "$SHARDS" --steps 20 \
        --checkpoint-every 10 --checkpoint-dir "$srun" --resume auto &&
      DTRAIN_TEST_SAMPLE_LOG="$WORK/sslots-all" dtrain_at "$NP2" "$WORK/sall.log" "${SHUF[@]}" --data "$SHARDS" \
        --steps $((total / NP2)); then
    { awk '$2 <= 10 { print $3 }' "$WORK"/sslots-ref.rank*; awk '{ print $3 }' "$WORK"/sslots-run.rank*; } | sort -n >"$WORK/sslots"
    awk '{ print $3 }' "$WORK"/sslots-all.rank* | sort -n >"$WORK/sslots-expected"
    echo "# shuffled slots read: $(tr '\n' ' ' <"$WORK/sslots" | cut -c1-80)..."
    check "shuffled: $total slots read, each once" [ "$(sort -u "$WORK/sslots" | wc -l)" = "$total" ]
    check "shuffled: the slots are the permutation's, not the counters 0..$((total - 1))" \
      bash -c "! seq 0 $((total - 1)) | cmp -s - '$WORK/sslots'"
    check "shuffled: resumed at np $NP2 from np $NP, the slots an uninterrupted np $NP2 run reads" \
      cmp -s "$WORK/sslots-expected" "$WORK/sslots"
  else
    not_ok "shuffled runs" "$(tail -3 "$WORK/sref.log" "$WORK/srun.log" "$WORK/sall.log" 2>/dev/null)"
  fi
  unset DTRAIN_TEST_SAMPLE_LOG
fi

# 3. A malformed shard through `dtrain train`: one line naming the file, exit 65 (data).
bad="$WORK/bad" && mkdir -p "$bad" && cp "$SHARDS"/*.bin "$bad/"
printf '\x01\x02\x03\x04' | dd of="$bad/bytes_train_000000.bin" bs=1 count=4 conv=notrunc status=none
dtrain_at "$NP" "$WORK/bad.log" "${GPT[@]}" --steps 2 --data "$bad"
status=$?
check "a shard with a wrong magic: exit 65 (status $status)" [ "$status" = 65 ]
check "one line naming the file" bash -c "[ \$(grep -c 'dtrain: error: .*bytes_train_000000.bin' '$WORK/bad.log') = 1 ]"

# 4. A bad GPT flag: one usage line, exit 2.
dtrain_at 1 "$WORK/flag.log" "${GPT[@]}" --data "$SHARDS" --heads 3
status=$?
check "--heads 3 with --embd $EMBD: exit 2 (status $status)" [ "$status" = 2 ]
check "one line naming the flag" grep -qx "dtrain: error: --heads: must divide --embd $EMBD (each head takes embd / heads), got 3" "$WORK/flag.log"

# 5. --class-weights weigh token ids (the same loss): one per id of the vocabulary (256 here), or one
# line and exit 2; weighted, training runs and its loss differs from the unweighted run's.
dtrain_at 1 "$WORK/weights-count.log" "${GPT[@]}" --steps 2 --data "$SHARDS" --class-weights 1,2
status=$?
check "--class-weights 1,2 for 256 token ids: exit 2 (status $status)" [ "$status" = 2 ]
check "one line naming the count" grep -qx 'dtrain: error: --class-weights: 2 weights for the 256 token ids of the vocabulary (one weight per class)' "$WORK/weights-count.log"
weights=$(/usr/bin/python3 -c 'print(",".join(str(1 + (i % 3)) for i in range(256)))')
if dtrain_at 1 "$WORK/weighted.log" "${GPT[@]}" --steps 5 --data "$SHARDS" --class-weights "$weights" &&
  dtrain_at 1 "$WORK/unweighted.log" "${GPT[@]}" --steps 5 --data "$SHARDS"; then
  check "weighted token loss differs from the unweighted one" \
    bash -c "! diff -q <(grep -o '^step 1/5 | loss [0-9.]*' '$WORK/weighted.log') <(grep -o '^step 1/5 | loss [0-9.]*' '$WORK/unweighted.log') >/dev/null"
else
  not_ok "gpt with --class-weights" "$(tail -3 "$WORK/weighted.log")"
fi

finish
