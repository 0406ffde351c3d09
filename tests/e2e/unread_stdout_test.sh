#!/usr/bin/env bash
# A rank whose log nobody reads still saves on SIGTERM: its stdout is a pipe whose reader has
# stopped (as mpirun stops reading its ranks' output once it is signalled), training is held up
# by the full pipe, and SIGTERM still makes rank 0 stop, save the checkpoint of that step, say so
# on stderr and exit 143 (app/log_output.h: the log gives way to a stop).
#   unread_stdout_test.sh PATH/TO/dtrain
set -uo pipefail
DTRAIN=${1:?usage: unread_stdout_test.sh PATH/TO/dtrain}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export OPENBLAS_NUM_THREADS=1

mkfifo "$WORK/stdout"
cat "$WORK/stdout" >"$WORK/out" &
reader=$!
# A log line every step (--log-interval 1) fills the pipe quickly; a metrics record every step
# shows whether training goes on. No checkpoint until the stop.
"$DTRAIN" train --threads 1 --data "$DATA" --train-limit 1000 --test-limit 200 --batch-size 16 --epochs 100000 \
  --log-interval 1 --metrics "$WORK/metrics" --checkpoint-dir "$WORK/ckpt" --checkpoint-every 1000000 \
  >"$WORK/stdout" 2>"$WORK/err" &
rank=$!
if ! wait_until 60 lines_at_least "$WORK/out" 1 '^Train Epoch: '; then
  not_ok "training started" "$(tail -3 "$WORK/err")"
  kill -KILL "$rank" "$reader"; finish
fi
kill -STOP "$reader"
# Training is held up once the pipe is full: the metrics stop growing (a step takes milliseconds).
stalled() { local before; before=$(stat -c %s "$WORK/metrics"); sleep 1; [ "$(stat -c %s "$WORK/metrics")" = "$before" ]; }
check "training is held up by the unread pipe" wait_until 60 stalled
kill -TERM "$rank"
(sleep 20 && kill -KILL "$rank" 2>/dev/null) &
watchdog=$!
status=0
wait "$rank" || status=$?
pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null  # its sleep too: it would hold ctest's pipe open
kill -KILL "$reader" 2>/dev/null; kill -CONT "$reader" 2>/dev/null
echo "# exit $status; stderr:"
sed 's/^/#   /' "$WORK/err"
check "it stopped on SIGTERM with exit 143 (got $status)" [ "$status" -eq 143 ]
step=$(sed -n 's/^dtrain: stopped by SIGTERM at step \([0-9]*\) .*/\1/p' "$WORK/err")
check "one line on stderr says it stopped" [ "$(grep -c '^dtrain: stopped by SIGTERM at step ' "$WORK/err")" -eq 1 ]
saved_at() { [ -n "$1" ] && [ "$(latest_step "$WORK/ckpt")" = "$1" ]; }
check "the checkpoint of step $step was saved and latest names it" saved_at "$step"
finish
