#!/usr/bin/env bash
# The checkpoint folder's integrity (issue 19, items 2, 5, 7, 15). C is a folder with complete
# step-8 and step-16:
#  - without `latest`, --resume auto, --resume C and `dtrain eval --weights C` use the newest
#    complete step-N (a damaged one skipped) and say so; none complete is an error, not a fresh
#    start; a fresh run saving lower steps into C deletes none of C's newer checkpoints;
#  - one changed value in state.json (its checksum) is one line naming state.json;
#  - a second job on a folder in use fails at start in one line naming the holder, and the first
#    job's checkpoints are intact;
#  - temporary files of an interrupted atomic write (flight recorder, trace) of a dead process
#    are removed at the next start, a live process's are not.
#   checkpoint_folder_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: checkpoint_folder_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: checkpoint_folder_test.sh PATH/TO/dtrain NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# 16 optimizer steps per epoch at any NP; a checkpoint every 8.
args=(train "${COMMON[@]}" --train-limit $((1024 * NP)) --batch-size 64 --checkpoint-every 8)
C="$WORK/C"
if ! dtrain_at "$NP" "$WORK/C.log" "${args[@]}" --epochs 1 --checkpoint-dir "$C" ||
  [ ! -d "$C/step-8" ] || [ ! -d "$C/step-16" ] || [ "$(latest_step "$C")" != 16 ]; then
  not_ok "a folder with step-8 and step-16" "$(ls -A "$C" 2>&1) $(tail -3 "$WORK/C.log")"
  finish
fi

# copy NAME SETUP: a fresh copy of C at $WORK/NAME with the shell command SETUP run inside it.
copy() {
  rm -rf "${WORK:?}/$1" && cp -a "$C" "$WORK/$1" && (cd "$WORK/$1" && eval "$2")
}
error_line() { grep '^dtrain: error: ' "$1" | head -1; }
error_lines() { grep -c '^dtrain: ' "$1"; }

# --- Item 2: no `latest` -------------------------------------------------------------------
copy nolatest "rm latest"
dtrain_at "$NP" "$WORK/nolatest.log" "${args[@]}" --epochs 2 --checkpoint-dir "$WORK/nolatest" --resume auto
status=$?
echo "#   $(grep '^resume: ' "$WORK/nolatest.log" | head -2 | tr '\n' '|')"
check "no latest: --resume auto exits 0 (status $status)" [ "$status" -eq 0 ]
check "no latest: the log says it uses step-16, the newest complete checkpoint" \
  grep -qF "resume: $WORK/nolatest has no latest; using $WORK/nolatest/step-16, the newest complete checkpoint" \
  "$WORK/nolatest.log"
check "no latest: it resumes from step-16" grep -q "^resume: from $WORK/nolatest/step-16 " "$WORK/nolatest.log"

copy newest-damaged "rm latest && truncate -s 1000 step-16/model.safetensors"
dtrain_at "$NP" "$WORK/newest-damaged.log" "${args[@]}" --epochs 1 --checkpoint-dir "$WORK/newest-damaged" \
  --resume auto
status=$?
check "no latest, step-16 damaged: exits 0 (status $status)" [ "$status" -eq 0 ]
check "no latest, step-16 damaged: uses step-8 and names step-16's damage" \
  grep -qF "using $WORK/newest-damaged/step-8, the newest complete checkpoint (skipped: $WORK/newest-damaged/step-16/model.safetensors: 1000 bytes" \
  "$WORK/newest-damaged.log"

copy eval-nolatest "rm latest && truncate -s 1000 step-16/model.safetensors"
dtrain_at "$NP" "$WORK/eval.log" eval --weights "$WORK/eval-nolatest" --data "$DATA" --test-limit 200 --threads 1
status=$?
check "eval --weights of a folder without latest: status $status, says it uses step-8" \
  [ "$status" -eq 0 -a -n "$(grep -F "weights: $WORK/eval-nolatest has no latest; using $WORK/eval-nolatest/step-8" "$WORK/eval.log")" ]

copy none-complete "rm latest && truncate -s 1000 step-16/model.safetensors && rm step-8/optimizer.safetensors"
before=$(dir_state "$WORK/none-complete")
dtrain_at "$NP" "$WORK/none-complete.log" "${args[@]}" --epochs 1 --checkpoint-dir "$WORK/none-complete" --resume auto
status=$?
echo "#   $(error_line "$WORK/none-complete.log")"
check "no latest, none complete: an error, not a fresh start (status $status, one line)" \
  [ "$status" -ne 0 -a "$(error_lines "$WORK/none-complete.log")" -eq 1 -a \
    -n "$(grep -F "$WORK/none-complete has no latest and none of its 2 checkpoint(s) is complete" "$WORK/none-complete.log")" ]
check "no latest, none complete: the folder is unchanged" [ "$(dir_state "$WORK/none-complete")" = "$before" ]

# A fresh run (no --resume) saving step-2 and step-4 into C: step-8 and step-16 are newer, kept.
copy fresh ":"
dtrain_at "$NP" "$WORK/fresh.log" train "${COMMON[@]}" --train-limit $((256 * NP)) --batch-size 64 --epochs 1 \
  --checkpoint-every 2 --keep 2 --checkpoint-dir "$WORK/fresh"
status=$?
echo "#   $(find "$WORK/fresh" -mindepth 1 -maxdepth 1 -printf "%f ")"
check "a fresh run saving lower steps keeps step-8 and step-16 (status $status)" \
  [ "$status" -eq 0 -a "$(dir_state "$WORK/fresh/step-8")" = "$(dir_state "$C/step-8")" -a \
    "$(dir_state "$WORK/fresh/step-16")" = "$(dir_state "$C/step-16")" ]

# --- Item 5: state.json's checksum ---------------------------------------------------------
copy epoch "sed -i 's/\"epoch\": 1,/\"epoch\": 3,/' step-16/state.json"
check "(setup) the epoch was changed" grep -q '"epoch": 3,' "$WORK/epoch/step-16/state.json"
before=$(dir_state "$WORK/epoch")
dtrain_at "$NP" "$WORK/epoch.log" "${args[@]}" --epochs 2 --checkpoint-dir "$WORK/epoch" --resume auto
status=$?
echo "#   $(error_line "$WORK/epoch.log")"
check "\"epoch\": 1 -> 3 in state.json: status $status, one line naming state.json's checksum" \
  [ "$status" -ne 0 -a "$(error_lines "$WORK/epoch.log")" -eq 1 -a \
    -n "$(grep -F "dtrain: error: $WORK/epoch/step-16/state.json: state_crc32: " "$WORK/epoch.log")" ]
check "  and the folder is unchanged" [ "$(dir_state "$WORK/epoch")" = "$before" ]

copy sample "sed -i 's/\"sample_in_epoch\": [0-9]*,/\"sample_in_epoch\": 8,/' step-8/state.json"
check "(setup) the position was changed" grep -q '"sample_in_epoch": 8,' "$WORK/sample/step-8/state.json"
dtrain_at "$NP" "$WORK/sample.log" "${args[@]}" --epochs 1 --checkpoint-dir "$WORK/sample-out" \
  --resume "$WORK/sample/step-8"
status=$?
echo "#   $(error_line "$WORK/sample.log")"
check "\"sample_in_epoch\" changed: status $status, one line naming state.json's checksum" \
  [ "$status" -ne 0 -a "$(error_lines "$WORK/sample.log")" -eq 1 -a \
    -n "$(grep -F "dtrain: error: $WORK/sample/step-8/state.json: state_crc32: " "$WORK/sample.log")" ]

# --- Item 7: one job per folder ------------------------------------------------------------
# Job A (alone: one process, so that SIGTERM reaches it) trains long; job B (NP ranks) is
# started on the same folder once A has saved, must fail at once in one line naming A, and must
# leave A's checkpoints alone. Then A is stopped (it saves) and its checkpoint must evaluate.
busy="$WORK/busy"
start_dtrain 1 "$WORK/A.log" train "${COMMON[@]}" --train-limit 1024 --batch-size 64 --checkpoint-every 8 \
  --epochs 100000 --checkpoint-dir "$busy"
A=$LAUNCHED
if ! wait_until 120 step_at_least "$busy" 8; then
  not_ok "job A saves a checkpoint" "$(tail -3 "$WORK/A.log")"
else
  t0=$SECONDS
  (sleep 60 && kill -KILL "$A" 2>/dev/null) &  # a job left running fails the test, not the machine
  guard=$!
  dtrain_at "$NP" "$WORK/B.log" "${args[@]}" --epochs 1 --checkpoint-dir "$busy"
  status=$?
  echo "#   $(error_line "$WORK/B.log")"
  if [ "$status" -ne 0 ] && [ "$(error_lines "$WORK/B.log")" -eq 1 ] &&
    grep -qE "^dtrain: error: $busy is in use by another dtrain job \(pid $A on [^,]+, since [^)]+\); one job per --checkpoint-dir$" "$WORK/B.log"; then
    ok "a second job on the folder fails (status $status) in one line naming the holder (pid $A)"
  else
    not_ok "a second job on the folder fails in one line naming the holder (pid $A)" \
      "status $status, output: $(grep -v '^Train Epoch' "$WORK/B.log" | head -c 600)"
  fi
  check "  within 20 s ($((SECONDS - t0)) s)" [ $((SECONDS - t0)) -le 20 ]
  check "  job A is still running" kill -0 "$A"
  kill -TERM "$A"
  wait "$A"
  status=$?
  kill "$guard" 2>/dev/null
  check "job A stops on SIGTERM and saves (status $status)" [ "$status" -eq 143 ]
  check "  no temporary entry and no lock file left" [ -z "$(find "$busy" -maxdepth 1 -name '.tmp-*' -o -maxdepth 1 -name dtrain.lock)" ]
  dtrain_at "$NP" "$WORK/eval.log" eval --weights "$busy" --data "$DATA" --test-limit 200 --threads 1
  check "  A's newest checkpoint (step-$(latest_step "$busy")) evaluates" grep -q '^Test set: ' "$WORK/eval.log"
fi

# --- Item 15: temporaries of a dead writer -------------------------------------------------
dead() { sh -c 'exit 0' & local pid=$!; wait "$pid"; echo "$pid"; }
fr="$WORK/fr"
mkdir -p "$fr"
gone=("$fr/flight_recorder_rank0.json.tmp$(dead)" "$fr/flight_recorder_rank1.json.tmp$(dead)" "$fr/trace.json.tmp$(dead)")
kept="$fr/flight_recorder_rank1.json.tmp$$"  # this shell is alive: its temporary stays
for f in "${gone[@]}" "$kept"; do echo '{"format": "dtrain-flight' >"$f"; done
dtrain_at 2 "$WORK/fr.log" train "${COMMON[@]}" --train-limit 256 --batch-size 64 --epochs 1 \
  --flight-recorder-dir "$fr" --trace "$fr/trace.json"
status=$?
echo "#   $(find "$fr" -mindepth 1 -maxdepth 1 -printf "%f ")"
check "a run at np 2 (status $status) removes the dead writers' temporaries in its flight recorder dir and beside its trace" \
  [ "$status" -eq 0 -a ! -e "${gone[0]}" -a ! -e "${gone[1]}" -a ! -e "${gone[2]}" ]
check "  and keeps a live process's" [ -e "$kept" ]
finish
