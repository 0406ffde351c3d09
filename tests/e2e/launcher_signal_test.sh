#!/usr/bin/env bash
# SIGINT (Ctrl-C) or SIGTERM to dtrain-launch saves: it passes the signal to every rank, the ranks
# agree on a step and stop there, rank 0 saves that step's checkpoint and says so (`stopped by`),
# and dtrain-launch exits with 128 + the signal's number and one line, within 5 s, leaving no
# process of the job behind.
#   launcher_signal_test.sh PATH/TO/dtrain NP SIGNAL PATH/TO/dtrain-launch
set -uo pipefail
DTRAIN=${1:?usage: launcher_signal_test.sh PATH/TO/dtrain NP SIGNAL PATH/TO/dtrain-launch}
NP=${2:?NP}
SIGNAL=${3:?SIGNAL (INT or TERM)}
LAUNCH=$(realpath "${4:?PATH/TO/dtrain-launch}")
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
readonly BOUND_MS=5000  # README, "When things go wrong": the job ends within 5 s
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# Every process below PID (pgrep -P: the job's own, never another test's).
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
none_alive() { local p; for p in "$@"; do alive "$p" && return 1; done; return 0; }
saved_at() { [ -n "$1" ] && [ "$(latest_step "$WORK/ckpt")" = "$1" ]; }

# No checkpoint until the stop: --checkpoint-every far beyond the run.
"$LAUNCH" -n "$NP" -- "$DTRAIN" train "${COMMON[@]}" --train-limit 1000 --batch-size 16 --epochs 1000 \
  --checkpoint-dir "$WORK/ckpt" --checkpoint-every 1000000 >"$WORK/log" 2>&1 &
launcher=$!
if ! wait_until 120 lines_at_least "$WORK/log" 2 '^Train Epoch: '; then
  not_ok "the job reached training" "$(tail -3 "$WORK/log")"
  kill -KILL "$launcher"; finish
fi
job=$(descendants "$launcher")
t0=$(now_ms)
kill "-$SIGNAL" "$launcher"
# A launcher that never ends would hang the test: give it a minute, then kill it and fail.
(sleep 60 && kill -KILL "$launcher" 2>/dev/null) &
watchdog=$!
status=0
wait "$launcher" || status=$?
elapsed=$(($(now_ms) - t0))
pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null  # its sleep too: it would hold ctest's pipe open
echo "# exit $status after $elapsed ms; the job's lines:"
grep -E '^(dtrain-launch|dtrain): ' "$WORK/log" | sed 's/^/#   /'
signal_number=$(kill -l "$SIGNAL")
check "dtrain-launch exited with $((128 + signal_number)) (got $status)" [ "$status" -eq $((128 + signal_number)) ]
check "within $BOUND_MS ms of the signal (took $elapsed)" [ "$elapsed" -le "$BOUND_MS" ]
check "one line from rank 0 says it stopped" [ "$(grep -c "^dtrain: stopped by SIG$SIGNAL at step " "$WORK/log")" -eq 1 ]
step=$(sed -n "s/^dtrain: stopped by SIG$SIGNAL at step \([0-9]*\) .*/\1/p" "$WORK/log")
check "the checkpoint of step $step was saved and latest names it" saved_at "$step"
check "one line from dtrain-launch says every rank stopped" \
  [ "$(grep -c "^dtrain-launch: interrupted by SIG$SIGNAL: all $NP rank(s) stopped$" "$WORK/log")" -eq 1 ]
# shellcheck disable=SC2086  # one PID per word
check "no process of the job is left" wait_until 2 none_alive $job
finish
