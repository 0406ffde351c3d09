#!/usr/bin/env bash
# A malformed llm.c token shard through `dtrain train --model gpt --data DIR` at NP ranks: each case
# is one line naming the file (or the folder), exit status 65 (bad data, Note [Exit statuses]),
# no rank left running, no checkpoint written. The shards are made by `dtrain data shard --bytes`
# and then damaged one way per case.
#   bad_shard_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=$(realpath -e "${1:?usage: bad_shard_test.sh PATH/TO/dtrain NP}") || exit 1
NP=${2:?usage: bad_shard_test.sh PATH/TO/dtrain NP}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_bad_shard.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0
ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }

# ~40 KB of text: 2 KB of val, the rest train; bytes up to 'z' (122).
for i in $(seq 1 800); do echo "line $i: the quick brown fox jumps over the lazy dog"; done >"$WORK/text.txt"
if ! "$DTRAIN" data shard --bytes "$WORK/text.txt" -o "$WORK/good" >"$WORK/shard.log" 2>&1; then
  echo "not ok - dtrain data shard: $(cat "$WORK/shard.log")"
  exit 1
fi

run() {
  local log=$1
  shift
  if [ "$NP" = 1 ]; then
    OPENBLAS_NUM_THREADS=1 timeout 120 "$DTRAIN" "$@" >"$log" 2>&1
  else
    OPENBLAS_NUM_THREADS=1 timeout 120 mpirun -np "$NP" --oversubscribe --bind-to none "$DTRAIN" "$@" >"$log" 2>&1
  fi
}
MODEL=(--model gpt --layers 1 --heads 2 --embd 16 --context 16 --batch-size 2 --steps 2 --threads 1)

help=$("$DTRAIN" train --help 2>/dev/null)
if ! grep -q -- '--layers' <<<"$help"; then
  echo "SKIPPED: this dtrain does not train --model gpt (no --layers in dtrain train --help)"
  exit 77
fi
if ! run "$WORK/good.log" train "${MODEL[@]}" --data "$WORK/good"; then
  echo "not ok - the good shards train: $(tail -3 "$WORK/good.log")"
  exit 1
fi
ok "the good shards train at np $NP"

# case_ NAME PATTERN SETUP [EXTRA FLAGS...]: a copy of the good shards damaged by SETUP (run in it),
# then training on it fails with exit 65, one error line (from the ranks together) matching PATTERN
# (DIR: the damaged copy), and no checkpoint.
case_() {
  local name=$1 pattern=$2 setup=$3 dir="$WORK/$1" status lines
  shift 3
  rm -rf "$dir" && cp -a "$WORK/good" "$dir"
  (cd "$dir" && eval "$setup")
  run "$WORK/$name.log" train "${MODEL[@]}" --data "$dir" --checkpoint-dir "$WORK/$name.ck" "$@"
  status=$?
  lines=$(grep -c '^dtrain: error: ' "$WORK/$name.log")
  if [ "$status" = 65 ] && [ "$lines" = 1 ] && grep -q -- "^dtrain: error: ${pattern//DIR/$dir}" "$WORK/$name.log" \
     && [ -z "$(ls -A "$WORK/$name.ck" 2>/dev/null | grep step-)" ]; then
    ok "$name: exit 65, $(grep '^dtrain: error: ' "$WORK/$name.log")"
  else
    not_ok "$name" "exit $status, $lines error line(s): $(cat "$WORK/$name.log")"
  fi
}
le32() { printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"; }
patch_int() { le32 "$3" | dd of="$1" bs=1 seek=$((4 * $2)) conv=notrunc status=none; }

case_ wrong_magic "DIR/bytes_train_000000.bin: not an llm.c token shard (magic 12345" \
  'patch_int bytes_train_000000.bin 0 12345'
case_ wrong_version "DIR/bytes_val_000000.bin: version 7 for magic 20240520" \
  'patch_int bytes_val_000000.bin 1 7'
case_ negative_count "DIR/bytes_train_000000.bin: the header's token count is negative" \
  'patch_int bytes_train_000000.bin 2 -1'
case_ cut_file "DIR/bytes_train_000000.bin: the header says [0-9]* tokens" \
  'truncate -s -3 bytes_train_000000.bin'
case_ short_header "DIR/bytes_val_000000.bin: 100 bytes, shorter than the 1024-byte header" \
  'truncate -s 100 bytes_val_000000.bin'
case_ token_above_vocab "DIR/bytes_train_000000.bin: token [0-9]* (id 1[0-9][0-9]) is not below the vocabulary size 100" \
  ':' --vocab 100
case_ no_val "DIR: no validation shards (\*val\*.bin)" 'rm bytes_val_000000.bin'
case_ no_train "DIR: no training shards (\*train\*.bin)" 'rm bytes_train_000000.bin'
case_ short_split "DIR/bytes_val_000000.bin: [0-9]* tokens, fewer than one batch of 4096 tokens" \
  ':' --batch-size 256 --context 16
# Matched by both globs, it was trained on and validated on without a word.
case_ both_splits "DIR/interval_train.bin: the name matches both \*train\*.bin and \*val\*.bin" \
  'cp bytes_train_000000.bin interval_train.bin'

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
