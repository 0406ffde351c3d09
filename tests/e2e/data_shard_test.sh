#!/usr/bin/env bash
# `dtrain data shard --bytes`: byte for byte the files shared/peers/llmc_shards.py writes from the
# same text (Python's own json package, and a tree with nested folders, a link to a folder and
# files of other suffixes), one summary line, a rerun that removes the stale shards of a larger
# earlier run, and one line with the contract's status for each way it can fail.
#   data_shard_test.sh PATH/TO/dtrain PATH/TO/llmc_shards.py
set -uo pipefail
DTRAIN=$(realpath -e "${1:?usage: data_shard_test.sh PATH/TO/dtrain PATH/TO/llmc_shards.py}") || exit 1
PEER=${2:?usage: data_shard_test.sh PATH/TO/dtrain PATH/TO/llmc_shards.py}
PYTHON=/usr/bin/python3
if [ ! -f "$PEER" ]; then echo "SKIPPED: the peer $PEER is not there"; exit 77; fi
if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then echo "SKIPPED: $PYTHON cannot import numpy (apt-get install python3-numpy)"; exit 77; fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_data_shard.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0
ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }

# same_shards NAME DIR_A DIR_B: the same file names, each file the same bytes.
same_shards() {
  local name=$1 a=$2 b=$3 f
  if [ "$(cd "$a" && ls)" != "$(cd "$b" && ls)" ]; then
    not_ok "$name" "different files: $(cd "$a" && ls | tr '\n' ' ') vs $(cd "$b" && ls | tr '\n' ' ')"
    return
  fi
  for f in "$a"/*; do
    if ! cmp -s "$f" "$b/$(basename "$f")"; then not_ok "$name" "$(basename "$f") differs"; return; fi
  done
  ok "$name ($(cd "$a" && ls | tr '\n' ' '))"
}

# A tree that exercises the walk: files before subfolders, sorted names, suffixes, a link to a folder.
tree=$WORK/tree
mkdir -p "$tree/b/deep" "$tree/a" "$tree/B"
for f in z.py a.txt M.md b/x.rst b/deep/y.h b/deep/w.c a/q.py B/u.txt skip.pyc b/notes noext.pyx; do
  for i in $(seq 1 40); do echo "$f line $i: the quick brown fox"; done >"$tree/$f"
done
printf '\xff\xfe\x00 bytes above 127 and a NUL\n' >>"$tree/a.txt"
ln -s "$tree/b" "$tree/link_to_b"
extra=$WORK/extra.log
seq 1 300 >"$extra"

json=/usr/lib/python3.11/json
[ -d "$json" ] || json=$(dirname "$("$PYTHON" -c 'import json; print(json.__file__)')")
for case in "json:$json" "tree:$tree" "tree+file:$tree $extra"; do
  name=${case%%:*}
  read -r -a inputs <<<"${case#*:}"
  "$PYTHON" "$PEER" write "$WORK/py-$name" "${inputs[@]}" >/dev/null
  if ! "$DTRAIN" data shard --bytes "${inputs[@]}" -o "$WORK/dt-$name" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
    not_ok "dtrain data shard $name" "$(cat "$WORK/$name.err")"
    continue
  fi
  same_shards "byte-identical to llmc_shards.py: $name" "$WORK/py-$name" "$WORK/dt-$name"
  if [ "$(wc -l <"$WORK/$name.out")" = 1 ] && [ ! -s "$WORK/$name.err" ] \
     && grep -q "^$WORK/dt-$name: [0-9]* train and [0-9]* val tokens (bytes, vocabulary 256) in 1 train shard" "$WORK/$name.out"; then
    ok "one summary line: $(cat "$WORK/$name.out")"
  else
    not_ok "one summary line" "$(cat "$WORK/$name.out" "$WORK/$name.err")"
  fi
done

# A rerun over the output of a larger run: the extra train shards go, so the split is this text only.
cp "$WORK/dt-json/bytes_train_000000.bin" "$WORK/dt-tree/bytes_train_000003.bin"
"$DTRAIN" data shard --bytes "$tree" -o "$WORK/dt-tree" >"$WORK/rerun.out" 2>&1
same_shards "a rerun removes the stale shards of a larger earlier run" "$WORK/py-tree" "$WORK/dt-tree"
grep -q "removed 1 train shard of an earlier run" "$WORK/rerun.out" && ok "the rerun says so" \
  || not_ok "the rerun says so" "$(cat "$WORK/rerun.out")"

# --val-fraction: the first tenth of the bytes.
"$DTRAIN" data shard --bytes "$extra" -o "$WORK/tenth" --val-fraction 0.1 >/dev/null 2>&1
size=$(stat -c %s "$extra")
val=$(($(stat -c %s "$WORK/tenth/bytes_val_000000.bin") - 1024))
[ "$val" = $((size / 10 * 2)) ] && ok "--val-fraction 0.1: $((size / 10)) of $size bytes" \
  || not_ok "--val-fraction 0.1" "val shard holds $val bytes of tokens for $size bytes of text"

# expect_failure NAME STATUS PATTERN ARGS...: one line matching PATTERN on stderr, exit STATUS, nothing on stdout.
expect_failure() {
  local name=$1 want=$2 pattern=$3 status
  shift 3
  "$DTRAIN" data "$@" >"$WORK/f.out" 2>"$WORK/f.err"
  status=$?
  if [ "$status" = "$want" ] && [ "$(wc -l <"$WORK/f.err")" = 1 ] && [ ! -s "$WORK/f.out" ] \
     && grep -q -- "^dtrain: error: $pattern" "$WORK/f.err"; then
    ok "$name: exit $status, $(cat "$WORK/f.err")"
  else
    not_ok "$name" "exit $status (expected $want): $(cat "$WORK/f.out" "$WORK/f.err")"
  fi
}
expect_failure "a missing input" 65 "$WORK/absent: no such file or folder" shard --bytes "$WORK/absent" -o "$WORK/o1"
mkdir -p "$WORK/binary" && printf 'x' >"$WORK/binary/a.pyc"
expect_failure "a folder without text" 65 "no text found in $WORK/binary" shard --bytes "$WORK/binary" -o "$WORK/o2"
expect_failure "an output under a file" 73 "$extra/sub: cannot create the output folder" shard --bytes "$tree" -o "$extra/sub"
expect_failure "no -o" 2 "-o: required" shard --bytes "$tree"
expect_failure "no --bytes" 2 "--bytes: required" shard "$tree" -o "$WORK/o3"
expect_failure "no paths" 2 "data shard: expected text files or folders" shard --bytes -o "$WORK/o4"
expect_failure "--val-fraction 1" 2 "--val-fraction: must be above 0 and below 1, got 1" shard --bytes "$tree" -o "$WORK/o5" --val-fraction 1
printf 'twenty bytes of text\n' >"$WORK/small.txt"
expect_failure "a validation split under 2 tokens" 65 "$WORK/o6: 21 bytes of text split into 1 validation and 20 train" \
  shard --bytes "$WORK/small.txt" -o "$WORK/o6"
expect_failure "no subcommand" 2 "data: expected 'shard'" frobnicate
for o in o1 o2 o4 o5 o6; do [ -e "$WORK/$o" ] && not_ok "no output after a failure" "$WORK/$o exists"; done

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
