#!/usr/bin/env bash
# dtrain-launch --max-restarts: one rank of a checkpointing dtrain train is killed (SIGKILL) at a
# random step once; dtrain-launch relaunches the job with --resume auto, which finishes, and its
# final model.safetensors is byte-identical to an uninterrupted run's.
# Usage: restart_test.sh DTRAIN NP DTRAIN_LAUNCH
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
LAUNCH=$(realpath "$3")
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
export OPENBLAS_NUM_THREADS=1
args=(train "${COMMON[@]}" --hidden 1024,1024 --train-limit 4096 --epochs 3 --checkpoint-every 8)

dtrain_at "$NP" "$WORK/ref.log" "${args[@]}" --checkpoint-dir "$WORK/ref"
check "the uninterrupted run succeeded" [ $? = 0 ]
final=$(cat "$WORK/ref/latest")

"$LAUNCH" -n "$NP" --max-restarts 2 -- "$DTRAIN" "${args[@]}" --checkpoint-dir "$WORK/run" >"$WORK/run.log" 2>&1 &
launcher=$!
# A random step after the first checkpoint: wait for it, then a random 0-0.09 s more.
wait_until 60 test -e "$WORK/run/latest"
sleep "0.0$((RANDOM % 10))"
victim=$(pgrep -f -- "--checkpoint-dir $WORK/run" | while read -r p; do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$((NP - 1))" && [ "$(cat /proc/$p/comm)" = dtrain ] && echo "$p"
done | head -1)
echo "# killing rank $((NP - 1)) (pid $victim) after checkpoint $(cat "$WORK/run/latest")"
kill -KILL "$victim"
status=0
wait "$launcher" || status=$?
grep '^dtrain-launch:' "$WORK/run.log" | sed 's/^/#   /'
check "the job completed after a restart (exit $status)" [ "$status" = 0 ]
check "one restart line naming the killed rank" grep -qE "^dtrain-launch: restart 1 of 2 .* rank $((NP - 1)) on .* killed by signal 9" "$WORK/run.log"
echo "# cmp $WORK/ref/$final/model.safetensors $WORK/run/$final/model.safetensors"
check "final model.safetensors byte-identical to the uninterrupted run's" cmp "$WORK/ref/$final/model.safetensors" "$WORK/run/$final/model.safetensors"
finish
