#!/usr/bin/env bash
# Non-finite values stop the run and never reach a checkpoint (Note [Stopping on non-finite
# values] in app/divergence.h): a loss that becomes NaN or infinite (--lr 1e6, --normalize
# 0,1e-38, --lr-gamma 1e30) ends the job at NP ranks with one line naming the step, the epoch
# and what went non-finite, exit status 3 on every rank, and every checkpoint in the directory
# (`latest` and each step-N) finite and intact, the finite ones not pruned; --init-weights and
# resuming refuse a non-finite tensor in one line naming the file and the tensor.
#   nonfinite_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: nonfinite_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: nonfinite_test.sh PATH/TO/dtrain NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

args=(train "${COMMON[@]}" --train-limit 1000 --test-limit 200)

# all_finite FILE...: every F32 and F64 value of these safetensors files is finite.
all_finite() {
  python3 - "$@" <<'PY'
import json, math, struct, sys
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    for name, t in json.loads(data[8:8 + n]).items():
        if name == "__metadata__" or t["dtype"] not in ("F32", "F64"):
            continue
        begin, end = t["data_offsets"]
        fmt = "<%d%s" % ((end - begin) // (4 if t["dtype"] == "F32" else 8), "f" if t["dtype"] == "F32" else "d")
        if not all(math.isfinite(v) for v in struct.unpack(fmt, data[8 + n + begin:8 + n + end])):
            sys.exit("%s: %s is not finite" % (path, name))
PY
}

# poison FILE TENSOR [STATE_JSON]: TENSOR's values in the safetensors FILE become NaN; with
# STATE_JSON (the checkpoint's), its size and CRC-32 of FILE, and state.json's own checksum, are
# updated to match.
poison() {
  python3 - "$@" <<'PY'
import json, os, struct, sys, zlib
path, tensor = sys.argv[1], sys.argv[2]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
begin, end = json.loads(data[8:8 + n])[tensor]["data_offsets"]
data[8 + n + begin:8 + n + end] = struct.pack("<f", float("nan")) * ((end - begin) // 4)
open(path, "wb").write(data)
if len(sys.argv) > 3:
    state = json.load(open(sys.argv[3]))
    state["files"][os.path.basename(path)] = {"bytes": len(data), "crc32": "%08x" % zlib.crc32(data)}
    # state.json's own checksum (checkpoint/training_state.h): zlib's CRC-32 of the compact
    # dump, keys sorted, without the field itself.
    state.pop("state_crc32", None)
    compact = json.dumps(state, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    state["state_crc32"] = "%08x" % zlib.crc32(compact.encode())
    json.dump(state, open(sys.argv[3], "w"))
PY
}

# every_checkpoint_finite DIR: `latest` names a step-N, and every step-N holds finite values only.
every_checkpoint_finite() {
  local d
  has_checkpoint "$1" || return 1
  for d in "$1"/step-*; do all_finite "$d/model.safetensors" "$d/optimizer.safetensors" || return 1; done
}

# expect_diverged NAME LOG STATUS PATTERN: exit status 3 and one `dtrain: error:` line, `training
# diverged: ` followed by the extended regex PATTERN.
expect_diverged() {
  local name=$1 log=$2 status=$3 pattern=$4 line
  line=$(grep '^dtrain: error: ' "$log")
  echo "#   $line"
  if [ "$status" -ne 3 ]; then
    not_ok "$name" "status $status (expected 3): $(grep -v '^Train Epoch' "$log" | tail -4)"
  elif [ "$(grep -c '^dtrain: error: ' "$log")" -ne 1 ] || ! grep -qE "^dtrain: error: training diverged: $pattern" "$log"; then
    not_ok "$name" "expected one line matching '$pattern', got: $line"
  else
    ok "$name: status 3, one line"
  fi
}

# 1. --lr 1e6: the loss overflows within a few steps. A checkpoint at every step: the finite
# ones are kept (the newest is what `latest` names), none is written from the non-finite state.
ck="$WORK/lr"
dtrain_at "$NP" "$WORK/lr.log" "${args[@]}" --lr 1e6 --epochs 3 --checkpoint-dir "$ck" --checkpoint-every 1 --keep 2
expect_diverged "--lr 1e6" "$WORK/lr.log" $? \
  "(the loss is (nan|inf|-inf) at step [0-9]+ \(epoch 1, batch [0-9]+\) on rank\(s\) 0|the state to checkpoint is not finite after step [0-9]+ \(epoch 1, batch [0-9]+\): (model|optimizer)\.safetensors: ).*; no checkpoint written from it \(newest: $ck/step-[0-9]+\)$"
check "--lr 1e6: latest and every step-N finite" every_checkpoint_finite "$ck"
newest=$(latest_step "$ck")
check "--lr 1e6: the line names the newest checkpoint, step-$newest" grep -q "(newest: $ck/step-$newest)" "$WORK/lr.log"
check "--lr 1e6: the finite checkpoints kept (2)" [ "$(find "$ck" -maxdepth 1 -name 'step-*' | wc -l)" -eq 2 ]
stepped=$(grep -oE 'at step [0-9]+|after step [0-9]+' "$WORK/lr.log" | head -1 | grep -oE '[0-9]+$')
older_than() { [ -n "$1" ] && [ -n "$2" ] && [ "$1" -lt "$2" ]; }
check "--lr 1e6: no checkpoint of step $stepped or later" older_than "$newest" "$stepped"
# The same resumed: the checkpoint is finite, so the run starts and diverges again, the same way.
before=$(dir_state "$ck")
dtrain_at "$NP" "$WORK/lr_resume.log" "${args[@]}" --lr 1e6 --epochs 3 --checkpoint-dir "$ck" --checkpoint-every 1 --keep 2 --resume auto
expect_diverged "--lr 1e6, resumed" "$WORK/lr_resume.log" $? "the (loss is|state to checkpoint is not finite)"
check "--lr 1e6, resumed: the directory unchanged" [ "$before" = "$(dir_state "$ck")" ]

# 2. Without --checkpoint-dir: the same stop, and the line says nothing was saved.
dtrain_at "$NP" "$WORK/nodir.log" "${args[@]}" --lr 1e6 --epochs 3
expect_diverged "--lr 1e6 without checkpoints" "$WORK/nodir.log" $? ".*; nothing saved \(no --checkpoint-dir\)$"

# 3. --normalize 0,1e-38: inputs near the float range's end overflow the first layer at once.
dtrain_at "$NP" "$WORK/norm.log" "${args[@]}" --normalize 0,1e-38 --checkpoint-dir "$WORK/norm"
expect_diverged "--normalize 0,1e-38" "$WORK/norm.log" $? "the loss is (nan|inf|-inf) at step 1 \(epoch 1, batch 1\) on rank\(s\) 0"
check "--normalize 0,1e-38: no checkpoint written" [ -z "$(find "$WORK/norm" -name 'step-*' 2>/dev/null)" ]

# 4. --lr-gamma 1e30: epoch 1 trains (and is saved), epoch 2's learning rate of 1e28 diverges.
ck="$WORK/gamma"
dtrain_at "$NP" "$WORK/gamma.log" "${args[@]}" --lr-schedule step --lr-step-size 1 --lr-gamma 1e30 --epochs 3 --checkpoint-dir "$ck"
expect_diverged "--lr-gamma 1e30" "$WORK/gamma.log" $? ".* \(epoch 2, batch [0-9]+\).*; no checkpoint written from it \(newest: $ck/step-[0-9]+\)$"
check "--lr-gamma 1e30: epoch 1's checkpoint is latest, finite" every_checkpoint_finite "$ck"
check "--lr-gamma 1e30: one checkpoint (epoch 1)" [ "$(find "$ck" -maxdepth 1 -name 'step-*' | wc -l)" -eq 1 ]

# A good checkpoint to damage below (finite: a normal learning rate).
good="$WORK/good"
dtrain_at "$NP" "$WORK/good.log" "${args[@]}" --epochs 1 --checkpoint-dir "$good" || not_ok "a good checkpoint" "$(tail -3 "$WORK/good.log")"
step=$(latest_step "$good")

# expect_refused NAME LOG STATUS EXPECTED: a non-zero status and one dtrain line containing EXPECTED.
expect_refused() {
  local name=$1 log=$2 status=$3 expected=$4 line
  line=$(grep '^dtrain: ' "$log")
  echo "#   $line"
  if [ "$status" -eq 0 ] || [ "$(grep -c '^dtrain: ' "$log")" -ne 1 ] || [[ $line != *"$expected"* ]]; then
    not_ok "$name" "status $status, output: $(head -c 600 "$log")"
  else
    ok "$name: one line, status $status"
  fi
}

# 5. --init-weights with a NaN tensor: refused, naming the file and the tensor.
init="$WORK/init.safetensors"
cp "$good/step-$step/model.safetensors" "$init" && poison "$init" 1.weight
dtrain_at "$NP" "$WORK/init.log" "${args[@]}" --init-weights "$init" --checkpoint-dir "$WORK/init_ck"
expect_refused "--init-weights with NaN" "$WORK/init.log" $? \
  "dtrain: error: $init: 1.weight: 200704 non-finite value(s) (first: nan at index 0)"
check "--init-weights with NaN: no checkpoint written" [ -z "$(find "$WORK/init_ck" -name 'step-*' 2>/dev/null)" ]
# The pipeline reads the file a tensor at a time (each stage takes its own): the same refusal.
if [ "$NP" -gt 1 ]; then
  dtrain_at "$NP" "$WORK/init_pipe.log" "${args[@]}" --init-weights "$init" --pipeline-stages "$NP" \
    --batch-size $((16 * NP))
  expect_refused "--init-weights with NaN, --pipeline-stages $NP" "$WORK/init_pipe.log" $? \
    "$init: 1.weight: 200704 non-finite value(s) (first: nan at index 0)"
fi

# 6. Resuming from a checkpoint whose weights are NaN (its checksums made to match): refused,
# the directory left as it was.
poison "$good/step-$step/model.safetensors" 3.bias "$good/step-$step/state.json"
before=$(dir_state "$good")
dtrain_at "$NP" "$WORK/resume.log" "${args[@]}" --epochs 2 --checkpoint-dir "$good" --resume auto
expect_refused "resume from NaN weights" "$WORK/resume.log" $? \
  "dtrain: error: $good/step-$step/model.safetensors: 3.bias: 10 non-finite value(s) (first: nan at index 0)"
check "resume from NaN weights: the directory unchanged" [ "$before" = "$(dir_state "$good")" ]

finish
