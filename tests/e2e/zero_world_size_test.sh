#!/usr/bin/env bash
# ZeRO checkpoints re-shard (Note [Sharded optimizer state]): a `--zero 2` job at FROM ranks
# saves its optimizer state in FROM shards; a job at TO ranks with `--zero TO_ZERO` resumes from
# it. The two jobs use every sample of the epoch exactly once (as world_size_change_test.sh), and
# the resumed job continues from the same weights and optimizer state: its final model is
# byte for byte that of the same resume from a `--zero 0` job's checkpoint (one node: ZeRO's
# results are plain DDP's bits, Note [ZeRO shards]), whose step-STOP model it equals too. At TO > 1
# the checkpoints' bucket order is rewritten first (a layout unlike the one a fresh job starts
# with), so the resumed ZeRO job must take that layout before it cuts its shards and reads them.
# At FROM 1 the first job has no DDP and so saves no buckets (and one optimizer file): the resumed
# ZeRO job keeps the layout it starts with for good (no rebuild that could move imported state
# between ranks) and must still end with the --zero 0 resume's bytes.
#   zero_world_size_test.sh PATH/TO/dtrain FROM_NP TO_NP TO_ZERO
set -uo pipefail
usage="usage: zero_world_size_test.sh PATH/TO/dtrain FROM_NP TO_NP TO_ZERO"
DTRAIN=${1:?$usage}
FROM=${2:?$usage}
TO=${3:?$usage}
TO_ZERO=${4:?$usage}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

readonly SAMPLES=1200 BATCH=20 STOP=6  # 6 steps of 20 at 2 or 3 ranks: 240 or 360 used, 960 or 840 left
# Two hidden layers and a small cap: several buckets, so the shards depend on the layout.
args=(train "${COMMON[@]}" --train-limit "$SAMPLES" --batch-size "$BATCH" --epochs 1 --optimizer adamw
  --hidden 256,128 --bucket-cap-mb 0.25)

DTRAIN_TEST_SAMPLE_LOG="$WORK/first" dtrain_at "$FROM" "$WORK/first.log" "${args[@]}" --zero 2 \
  --checkpoint-dir "$WORK/ck" --checkpoint-every "$STOP" --keep 100
if [ "$FROM" -gt 1 ]; then
  check "the --zero 2 job at $FROM ranks saved step $STOP in $FROM shards" \
    [ -f "$WORK/ck/step-$STOP/optimizer-rank$((FROM - 1))-of-$FROM.safetensors" ]
else
  check "the one-rank job saved step $STOP without buckets" \
    bash -c "[ -f '$WORK/ck/step-$STOP/optimizer.safetensors' ] && ! grep -q '\"buckets\"' '$WORK/ck/step-$STOP/state.json'"
fi
dtrain_at "$FROM" "$WORK/plain.log" "${args[@]}" --zero 0 --checkpoint-dir "$WORK/plain" --checkpoint-every "$STOP" \
  --keep 100
check "the --zero 0 job at $FROM ranks saved step $STOP" [ -f "$WORK/plain/step-$STOP/optimizer.safetensors" ]
check "its step-$STOP model equals the --zero 2 job's (cmp)" \
  cmp "$WORK/ck/step-$STOP/model.safetensors" "$WORK/plain/step-$STOP/model.safetensors"

if [ "$TO" -gt 1 ] && [ "$FROM" -gt 1 ]; then
  # The saved bucket order, reversed in both checkpoints: a fresh job's own order would not do.
  for dir in "$WORK/ck" "$WORK/plain"; do
    python3 - "$dir/step-$STOP/state.json" <<'PY'
import json, sys, zlib
path = sys.argv[1]
state = json.load(open(path))
state["buckets"]["ready_order"].reverse()
# Its own checksum again (checkpoint/training_state.h: the compact dump, keys sorted).
state.pop("state_crc32", None)
text = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
state["state_crc32"] = "%08x" % zlib.crc32(text.encode())
json.dump(state, open(path, "w"), indent=2)
PY
  done
fi

DTRAIN_TEST_SAMPLE_LOG="$WORK/resumed" dtrain_at "$TO" "$WORK/resumed.log" "${args[@]}" --zero "$TO_ZERO" \
  --checkpoint-dir "$WORK/ck2" --resume "$WORK/ck/step-$STOP"
status=$?
check "the job resumed at $TO ranks with --zero $TO_ZERO ran (status $status)" [ "$status" -eq 0 ]
[ "$status" -eq 0 ] || tail -3 "$WORK/resumed.log"
check "it resumed from step $STOP saved at world size $FROM" \
  grep -q "^resume: saved at world size $FROM, running at $TO: " "$WORK/resumed.log"
if [ "$TO" -gt 1 ] && [ "$FROM" -gt 1 ]; then
  check "it took the checkpoint's buckets" grep -q "^resume: buckets from the checkpoint" "$WORK/resumed.log"
fi
dtrain_at "$TO" "$WORK/plain-resumed.log" "${args[@]}" --zero 0 --checkpoint-dir "$WORK/plain2" \
  --resume "$WORK/plain/step-$STOP"
check "the same resume from the --zero 0 checkpoint ran" [ "$?" -eq 0 ]
echo "# cmp $(final_model "$WORK/ck2") $(final_model "$WORK/plain2")"
check "$FROM (--zero 2) -> $TO (--zero $TO_ZERO): the final model equals the resume from --zero 0's checkpoint (cmp)" \
  cmp "$(final_model "$WORK/ck2")" "$(final_model "$WORK/plain2")"

check "$FROM -> $TO ranks: every sample of the epoch used exactly once" every_sample_once "$STOP" "$SAMPLES"
finish
