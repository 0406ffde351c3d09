#!/usr/bin/env bash
# dtrain-launch's supervision of a running job, as a user sees it: a rank that dies is named in
# one line (rank, host, signal or exit status, its last stderr line) and the job ends within 5 s;
# start-up is bounded by --start-timeout; SIGINT stops every rank within 5 s and leaves no
# process behind, and so does SIGTERM when the ranks ignore it (passed to them, then mpirun ends
# them); --max-restarts relaunches with --resume auto and gives up after K restarts.
#   supervision_test.sh CASE DTRAIN_LAUNCH LAUNCH_TEST_RANK [DTRAIN]
# CASE: dead_rank_signal | dead_rank_error_line | dead_rank_dtrain_train | start_timeout |
#       dtrain_train_outlasts_start_timeout |
#       sigint | sigterm_ignored | restart_resumes | restart_gives_up. Prints ok/not ok lines; exit 1 on a failure,
# 77 (skipped) when a case's inputs are missing.
set -uo pipefail

case_name=${1:?usage: supervision_test.sh CASE DTRAIN_LAUNCH LAUNCH_TEST_RANK [DTRAIN]}
launch=${2:?dtrain-launch path}
rank_prog=${3:?launch_test_rank path}
dtrain=${4:-}
readonly BOUND_S=5  # the issue's bound on "the job ends" after a rank dies or SIGINT
readonly DATA=/usr/share/datasets/fashion-mnist

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
host=$(hostname)

ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1"; failures=$((failures + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# The lines dtrain-launch itself printed.
launcher_lines() { grep '^dtrain-launch: ' "$work/out"; }
one_launcher_line_matching() {  # exactly one dtrain-launch line, and it matches the ERE $1
  local lines; lines=$(launcher_lines)
  [ "$(printf '%s\n' "$lines" | grep -c .)" = 1 ] && printf '%s\n' "$lines" | grep -Eq -- "$1"
}
last_launcher_line_matching() { launcher_lines | tail -1 | grep -Eq -- "$1"; }
within_bound() { [ "$1" -le $((BOUND_S * 1000)) ]; }
show() { echo "# exit $status after ${elapsed_ms} ms; dtrain-launch said:"; launcher_lines | sed 's/^/#   /'; }

# Runs dtrain-launch in the background (output to $work/out); sets $pid.
start() { "$launch" "$@" >"$work/out" 2>&1 & pid=$!; }
# Waits for it; sets $status and $elapsed_ms since $1 (ms).
finish() { status=0; wait "$pid" || status=$?; elapsed_ms=$(($(now_ms) - $1)); }
# Waits until file $1 exists (up to 30 s).
wait_for_file() { local i; for ((i = 0; i < 300; i++)); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
# A rank process that is neither gone nor a zombie (killed, waiting for init to reap it).
rank_alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# Every rank process is gone within the bound from $1 (ms): a rank killed with its supervisor
# (PR_SET_PDEATHSIG) may take a few milliseconds longer to go than dtrain-launch.
no_rank_left() {
  local f p
  for f in "$work"/pids/rank.*.pid; do
    p=$(cat "$f")
    while rank_alive "$p" && [ $(($(now_ms) - $1)) -le $((BOUND_S * 1000)) ]; do sleep 0.05; done
    if rank_alive "$p"; then echo "# rank process $p ($f) is still alive"; return 1; fi
  done
}

case_dead_rank_signal() {
  mkdir -p "$work/pids"
  start -n 2 -- "$rank_prog" --pid-dir "$work/pids"
  wait_for_file "$work/pids/rank.1.pid" && sleep 0.5
  local t0; t0=$(now_ms)
  kill -KILL "$(cat "$work/pids/rank.1.pid")"
  finish "$t0"; show
  check "the one line names rank 1, its host and SIGKILL" \
    one_launcher_line_matching "^dtrain-launch: rank 1 on $host was killed by signal 9 \(SIGKILL\)"
  check "exit status 137 (128 + SIGKILL)" [ "$status" = 137 ]
  check "the job ends within ${BOUND_S} s of the kill" within_bound "$elapsed_ms"
  check "no rank process is left" no_rank_left "$t0"
}

case_dead_rank_error_line() {
  local t0; t0=$(now_ms)
  start -n 2 -- "$rank_prog" --fail-rank 1 --fail-after 1 --fail exit:3 --error-line "dtrain: rank 1: cannot read shard 7"
  finish "$t0"; show
  check "the one line names rank 1, its host, the status and its last stderr line" \
    one_launcher_line_matching "^dtrain-launch: rank 1 on $host exited with status 3; its last line on stderr: dtrain: rank 1: cannot read shard 7$"
  check "exit status 3" [ "$status" = 3 ]
  check "the job ends within ${BOUND_S} s of the failure" within_bound $((elapsed_ms - 1000))
}

# The `dtrain train` processes under this test's dtrain-launch ($pid). Other tests that ctest
# runs beside this one train with the same binary, so a match on the command line alone may
# pick (and kill) one of theirs: match by ancestry.
job_dtrain_pids() {
  local p a
  for p in $(pgrep -f "^$dtrain train"); do
    a=$p
    while [ -n "$a" ] && [ "$a" -gt 1 ]; do
      [ "$a" = "$pid" ] && { echo "$p"; break; }
      a=$(ps -o ppid= -p "$a" 2>/dev/null | tr -d ' ')
    done
  done
}
# None of the processes $2... is alive within the bound from $1 (ms).
none_alive_after() {
  local t0=$1 p; shift
  for p in "$@"; do
    while rank_alive "$p" && [ $(($(now_ms) - t0)) -le $((BOUND_S * 1000)) ]; do sleep 0.05; done
    if rank_alive "$p"; then echo "# dtrain train process $p is still alive"; return 1; fi
  done
}

case_dead_rank_dtrain_train() {
  if [ -z "$dtrain" ] || [ ! -x "$dtrain" ] || [ ! -e "$DATA/train-images-idx3-ubyte.gz" ]; then
    echo "SKIPPED: needs the dtrain binary and $DATA"; exit 77
  fi
  # No start-up bound: the killed rank is the subject here.
  start -n 2 --start-timeout 0 -- "$dtrain" train --epochs 50 --test-limit 500
  local i victim="" ranks=""
  for ((i = 0; i < 300; i++)); do
    grep -q '^Train Epoch: 1 ' "$work/out" && ranks=$(job_dtrain_pids) && [ "$(echo $ranks | wc -w)" = 2 ] &&
      victim=$(printf '%s\n' $ranks | sort -n | tail -1) && break
    sleep 0.1
  done
  [ -n "$victim" ] || { not_ok "dtrain train reached epoch 1"; return; }
  local t0; t0=$(now_ms)
  kill -KILL "$victim"
  finish "$t0"; show
  check "the one line names the killed rank, its host and SIGKILL" \
    one_launcher_line_matching "^dtrain-launch: rank [01] on $host was killed by signal 9 \(SIGKILL\)$"
  check "exit status 137" [ "$status" = 137 ]
  check "the job ends within ${BOUND_S} s of the kill" within_bound "$elapsed_ms"
  check "no dtrain process of the job is left" none_alive_after "$t0" $ranks
}

# dtrain train tells dtrain-launch it reached training: a run that outlasts --start-timeout is not
# ended as a start-up that took too long (before, every job ended after 300 s with exit 124).
case_dtrain_train_outlasts_start_timeout() {
  if [ -z "$dtrain" ] || [ ! -x "$dtrain" ] || [ ! -e "$DATA/train-images-idx3-ubyte.gz" ]; then
    echo "SKIPPED: needs the dtrain binary and $DATA"; exit 77
  fi
  local t0; t0=$(now_ms)
  # Far more epochs than 17 s allow on any machine (a quiet one runs 1000 of these in 5 s).
  start -n 2 --start-timeout 15 -- "$dtrain" train --epochs 1000000 --train-limit 640 --test-limit 64 --threads 1
  local i
  for ((i = 0; i < 300; i++)); do grep -q '^Train Epoch: 1 ' "$work/out" && break; sleep 0.1; done
  # Past the bound, with a margin: the job must still be training.
  while [ $(($(now_ms) - t0)) -le 17000 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  check "the job is still running 2 s past --start-timeout" kill -0 "$pid"
  kill -INT "$pid" 2>/dev/null
  finish "$t0"; show
  check "no start-up line" bash -c "! grep -q 'start-up took longer' '$work/out'"
  check "exit status 130 (interrupted), not 124" [ "$status" = 130 ]
}

case_start_timeout() {
  local t0; t0=$(now_ms)
  start -n 3 --start-timeout 2 -- "$rank_prog" --silent-rank 1
  finish "$t0"; show
  check "the one line names rank 1 and its host as not having reached training" \
    one_launcher_line_matching "^dtrain-launch: start-up took longer than 2 s \(--start-timeout\): rank 1 on $host did not reach training"
  check "exit status 124" [ "$status" = 124 ]
  check "the job ends within ${BOUND_S} s of the bound" within_bound $((elapsed_ms - 2000))
}

case_sigint() {
  mkdir -p "$work/pids"
  # Ranks that ignore SIGTERM: only SIGKILL stops them, so the escalation is tested too.
  start -n 2 --stop-timeout 2.5 -- "$rank_prog" --ignore-sigterm --pid-dir "$work/pids"
  wait_for_file "$work/pids/rank.0.pid" && wait_for_file "$work/pids/rank.1.pid" && sleep 0.5
  local t0; t0=$(now_ms)
  kill -INT "$pid"
  finish "$t0"; show
  check "exit status 130" [ "$status" = 130 ]
  check "dtrain-launch ends within ${BOUND_S} s of SIGINT" within_bound "$elapsed_ms"
  check "no rank process is left" no_rank_left "$t0"
  check "one line says it was interrupted" one_launcher_line_matching "^dtrain-launch: interrupted"
}

case_sigterm_ignored() {
  mkdir -p "$work/pids"
  # dtrain-launch passes SIGTERM to the ranks, which ignore it: after --stop-timeout it ends them.
  start -n 2 --stop-timeout 2.5 -- "$rank_prog" --ignore-sigterm --pid-dir "$work/pids"
  wait_for_file "$work/pids/rank.0.pid" && wait_for_file "$work/pids/rank.1.pid" && sleep 0.5
  local t0; t0=$(now_ms)
  kill -TERM "$pid"
  finish "$t0"; show
  check "exit status 143" [ "$status" = 143 ]
  check "dtrain-launch ends within ${BOUND_S} s of SIGTERM" within_bound "$elapsed_ms"
  check "no rank process is left" no_rank_left "$t0"
  check "one line says the ranks had to be ended" \
    one_launcher_line_matching "^dtrain-launch: interrupted by SIGTERM: passed to all 2 rank\(s\); 2 had not stopped 2.5 s later: killed$"
}

case_restart_resumes() {
  mkdir -p "$work/ckpt"
  start -n 2 --max-restarts 2 -- "$rank_prog" --run 1 --checkpoint-dir "$work/ckpt" \
    --fail-rank 1 --fail-after 0.5 --fail kill
  finish "$(now_ms)"; show
  check "the job succeeds after one restart" [ "$status" = 0 ]
  check "one line for the restart, with the attempt and the cause" one_launcher_line_matching \
    "^dtrain-launch: restart 1 of 2 in 1 s with --resume auto, after: rank 1 on $host was killed by signal 9 \(SIGKILL\)$"
  check "the restart added --resume auto to the program's arguments" \
    [ "$(cat "$work/ckpt/starts.1")" = "$(printf '%s\n%s' "--run 1 --checkpoint-dir $work/ckpt --fail-rank 1 --fail-after 0.5 --fail kill" \
      "--run 1 --checkpoint-dir $work/ckpt --fail-rank 1 --fail-after 0.5 --fail kill --resume auto")" ]
}

case_restart_gives_up() {
  mkdir -p "$work/ckpt"
  start -n 2 --max-restarts 2 -- "$rank_prog" --run 30 --checkpoint-dir "$work/ckpt" --always-fail \
    --fail-rank 0 --fail-after 0.2 --fail exit:5 --error-line "broken for good"
  finish "$(now_ms)"; show
  check "exit status 5, the last failure's" [ "$status" = 5 ]
  check "two restart lines" [ "$(launcher_lines | grep -c '^dtrain-launch: restart [12] of 2 ')" = 2 ]
  check "then the last cause, saying it gave up" last_launcher_line_matching \
    "^dtrain-launch: rank 0 on $host exited with status 5; its last line on stderr: broken for good \(gave up after 2 restarts\)$"
  check "three starts in all" [ "$(wc -l <"$work/ckpt/starts.0")" = 3 ]
  check "both restarts with --resume auto, once" [ "$(grep -c -- ' --resume auto$' "$work/ckpt/starts.0")" = 2 ]
}

"case_$case_name"
exit $((failures > 0))
