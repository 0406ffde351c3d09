#!/usr/bin/env bash
# SIGTERM to plain mpirun saves, as README ("Preemption") says: Open MPI 4.1 stops passing the
# ranks' output on at once, sends them SIGTERM odls_base_sigkill_timeout seconds later and SIGKILL
# as long again after that. Rank 0, whose log lines mpirun no longer reads, is held up in them
# (old main: for good) until the SIGTERM; then the ranks stop at one step, rank 0 saves it, and
# mpirun ends by the second period, leaving no rank behind.
#   mpirun_sigterm_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: mpirun_sigterm_test.sh PATH/TO/dtrain NP}
NP=${2:?NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export OPENBLAS_NUM_THREADS=1
readonly TIMEOUT_S=10  # --mca odls_base_sigkill_timeout: long enough for rank 0 to be held up first
now_ms() { echo $(($(date +%s%N) / 1000000)); }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
none_alive() { local p; for p in "$@"; do alive "$p" && return 1; done; return 0; }

# Small data, a tiny model, one sample a step and a log line each: rank 0 fills what mpirun's side of its
# output holds (about 14 KB, measured) within a second or two once mpirun stops reading. Rank 0's
# metrics (a file) show whether it is held up. No checkpoint until the stop.
mpirun -np "$NP" --oversubscribe --bind-to none --mca odls_base_sigkill_timeout "$TIMEOUT_S" \
  "$DTRAIN" train --threads 1 --data "$DATA" --train-limit 1000 --test-limit 200 --hidden 8 --batch-size 1 --epochs 100000 \
  --log-interval 1 --metrics "$WORK/metrics" --checkpoint-dir "$WORK/ckpt" --checkpoint-every 1000000 >"$WORK/log" 2>&1 &
mpirun_pid=$!
if ! wait_until 120 lines_at_least "$WORK/log" 2 '^Train Epoch: '; then
  not_ok "the job reached training" "$(tail -3 "$WORK/log")"
  kill -KILL "$mpirun_pid"; finish
fi
ranks=$(pgrep -P "$mpirun_pid")
t0=$(now_ms)
kill -TERM "$mpirun_pid"
(sleep 60 && kill -KILL "$mpirun_pid" 2>/dev/null) &
watchdog=$!
stalled() { local before; before=$(stat -c %s "$WORK/metrics"); sleep 0.5; [ "$(stat -c %s "$WORK/metrics")" = "$before" ]; }
if wait_until "$TIMEOUT_S" stalled; then
  echo "# rank 0 was held up by its unread output $(($(now_ms) - t0)) ms after the signal"
else
  echo "# rank 0 was not held up by its output before its SIGTERM (a slow machine)"
fi
status=0
wait "$mpirun_pid" || status=$?
elapsed=$(($(now_ms) - t0))
pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null  # its sleep too: it would hold ctest's pipe open
echo "# mpirun exited with $status after $elapsed ms; checkpoints: $(ls "$WORK/ckpt" 2>/dev/null | tr '\n' ' ')"
grep -E '^dtrain' "$WORK/log" | sed 's/^/#   /'
check "a checkpoint was saved at the stop and latest names it" has_checkpoint "$WORK/ckpt"
step=$(latest_step "$WORK/ckpt")
check "it is a mid-run step, not a step 0 (step ${step:-none})" [ "${step:-0}" -gt 0 ]
check "mpirun ended within 2 x odls_base_sigkill_timeout + 2 s ($elapsed ms)" [ "$elapsed" -le $((2 * TIMEOUT_S * 1000 + 2000)) ]
# shellcheck disable=SC2086  # one PID per word
check "no rank is left" wait_until 2 none_alive $ranks
finish
