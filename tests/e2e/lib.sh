# shellcheck shell=bash
# Shared by the end-to-end tests of checkpoints, resuming and preemption (sourced, not run):
# dtrain at NP ranks (one process alone for NP 1, else mpirun), the PID of one rank, the log
# lines a resumed run must repeat, TAP-style ok/not ok lines and the exit status.
# The caller sets DTRAIN (the binary) before sourcing.

DTRAIN=$(realpath "$DTRAIN")
readonly DATA=${DTRAIN_E2E_DATA:-/usr/share/datasets/fashion-mnist}
# The language-model tests make their own token shards: they set E2E_NO_IDX=1 before sourcing.
if [ -z "${E2E_NO_IDX:-}" ] && [ ! -e "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -e "$DATA/train-images-idx3-ubyte" ]; then
  echo "SKIPPED: Fashion-MNIST not installed at $DATA (apt-get install dataset-fashion-mnist)"
  exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_e2e.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0

ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name" "failed: $*"; fi; }
# check runs ONE command: `check NAME [ a ] && [ b ]` would check only [ a ]. These join two.
same_nonempty() { [ -n "$1" ] && [ "$1" = "$2" ]; }             # $1 is set and equals $2
failed_not_timed_out() { [ "$1" -ne 0 ] && [ "$1" -ne 124 ]; }  # a non-zero exit that is not timeout's
finish() { if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi; echo "all passed"; exit 0; }

# A small, quick job: 1 BLAS thread per rank, a subset of the data.
# shellcheck disable=SC2034  # used by the scripts that source this file
COMMON=(--threads 1 --data "$DATA" --test-limit 500 --log-interval 10)

# dtrain_at NP LOG ARGS...: runs `dtrain ARGS...` at NP ranks (NP 1: the process alone, else
# under mpirun), stdout and stderr into LOG; returns its exit status.
dtrain_at() {
  start_dtrain "$@"
  wait "$LAUNCHED"
}

# start_dtrain NP LOG ARGS...: the same in the background; LAUNCHED is the process started (the
# rank itself for NP 1, else mpirun: see rank_pid). Local ranks inherit this environment
# (DTRAIN_TEST_SAMPLE_LOG, DTRAIN_CHECKPOINT_FAULT_AFTER_BYTES).
start_dtrain() {
  local np=$1 log=$2
  shift 2
  if [ "$np" = 1 ]; then
    OPENBLAS_NUM_THREADS=1 "$DTRAIN" "$@" >"$log" 2>&1 &
  else
    OPENBLAS_NUM_THREADS=1 mpirun -np "$np" --oversubscribe --bind-to none "$DTRAIN" "$@" >"$log" 2>&1 &
  fi
  LAUNCHED=$!
}

# rank_pid LAUNCHED NP RANK: the PID of rank RANK of a job started with dtrain_at NP ... &.
rank_pid() {
  local launched=$1 np=$2 rank=$3 child
  if [ "$np" = 1 ]; then echo "$launched"; return; fi
  for child in $(pgrep -P "$launched"); do
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
      echo "$child"
      return
    fi
  done
}

# wait_until SECONDS COMMAND...: polls COMMAND every 20 ms; false on timeout.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  while ! "$@"; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.02
  done
}

# stop_and_wait SIGNAL PID JOB: sends SIGNAL to rank PID of the job started as JOB and waits for
# the job; STATUS is its exit status, MS the milliseconds from the signal to its end. The rank is
# killed afterwards (a stopped one may outlive the job).
# shellcheck disable=SC2034  # STATUS and MS are the caller's
stop_and_wait() {
  local t0
  t0=$(date +%s%N)
  kill "-$1" "$2"
  STATUS=0
  wait "$3" || STATUS=$?
  MS=$((($(date +%s%N) - t0) / 1000000))
  kill -KILL "$2" 2>/dev/null
}

# latest_step DIR: N of DIR/latest's step-N (empty when there is none).
latest_step() { sed -n 's/^step-\([0-9]*\)$/\1/p' "$1/latest" 2>/dev/null; }
has_checkpoint() { [ -n "$(latest_step "$1")" ]; }
# step_at_least DIR N: DIR/latest names step-M with M >= N.
step_at_least() { local s; s=$(latest_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ]; }
# The file names the newest checkpoint in DIR.
final_model() { echo "$1/step-$(latest_step "$1")/model.safetensors"; }
# final_weights_close DIR_A DIR_B BOUND: the two runs' final models within BOUND relative
# (weights_close.py), its verdict printed as a comment.
final_weights_close() {
  /usr/bin/python3 "$(dirname "$0")/weights_close.py" "$(final_model "$1")" "$(final_model "$2")" "$3" \
    >"$WORK/close.log" 2>&1
  local status=$?
  echo "# $(tail -1 "$WORK/close.log")"
  return $status
}
# same_files A B: every .safetensors of checkpoint A is B's, byte for byte (each that differs named).
same_files() {
  local f same=0
  for f in "$1"/*.safetensors; do
    cmp -s "$f" "$2/$(basename "$f")" || { same=1; echo "# differs: $(basename "$f")"; }
  done
  return $same
}
# consolidate RUN...: `dtrain checkpoint consolidate` of each checkpoint folder $WORK/RUN into
# $WORK/RUN-optimizer.safetensors, its line in $WORK/consolidate-RUN.log.
consolidate() {
  local run
  for run in "$@"; do
    dtrain_at 1 "$WORK/consolidate-$run.log" checkpoint consolidate "$WORK/$run" -o "$WORK/$run-optimizer.safetensors"
  done
}

# The lines a resumed run must repeat, with the checkpoint directory DIR written as "DIR".
log_lines() { grep -E '^(Train Epoch|Test set|checkpoint: /)' "$1" | sed "s|$2|DIR|g"; }
# The lines of LOG after its line "checkpoint: DIR/step-STEP ..." (what follows a resume at STEP).
log_lines_after() { log_lines "$1" "$2" | sed -n "/^checkpoint: DIR\/step-$3 /,\$p" | tail -n +2; }

# same_tail REF_LOG REF_DIR LOG DIR: LOG's lines (at least one) are the last lines of REF_LOG.
same_tail() {
  local n
  n=$(log_lines "$3" "$4" | wc -l)
  [ "$n" -gt 0 ] && diff <(log_lines "$1" "$2" | tail -n "$n") <(log_lines "$3" "$4")
}

# lines LOG: its "Train Epoch" and "Test set" lines.
lines() { grep -E '^(Train Epoch|Test set)' "$1"; }
# same_lines A B: the same "Train Epoch" and "Test set" lines (at least one), the numbers after
# "Loss:" / "Average loss:" within 1e-5 relative (a pipeline's M accumulated GEMMs round unlike one)
# plus 1.5 units of their last printed digit (two such values can print a unit apart).
same_lines() {
  python3 - "$1" "$2" <<'PY'
import re, sys
def lines(path):
    return [l.strip() for l in open(path) if l.startswith(("Train Epoch", "Test set"))]
a, b = lines(sys.argv[1]), lines(sys.argv[2])
loss = re.compile(r"(Loss: |Average loss: )([0-9.]+)")
unit = lambda text: 10.0 ** -len(text.partition(".")[2])
ok = len(a) == len(b) and len(a) > 0
for x, y in zip(a, b):
    mx, my = loss.search(x), loss.search(y)
    if loss.sub("", x) != loss.sub("", y) or not mx or not my:
        ok = False
    elif abs(float(mx.group(2)) - float(my.group(2))) > 1e-5 * abs(float(my.group(2))) + 1.5 * unit(my.group(2)):
        ok = False
    if not ok:
        print(f"# differs: {x!r} vs {y!r}")
        break
sys.exit(0 if ok else 1)
PY
}

# lines_at_least LOG COUNT PATTERN: LOG has COUNT lines matching the extended regex PATTERN.
lines_at_least() { [ "$(grep -cE "$3" "$1")" -ge "$2" ]; }
# signal_and_wait LAUNCHED NP RANK SIGNAL: sends SIGNAL to rank RANK of the job start_dtrain
# launched and waits for the job (killed after a minute: a rank left waiting would hang it);
# returns the job's exit status.
signal_and_wait() {
  kill "-$4" "$(rank_pid "$1" "$2" "$3")"
  (sleep 60 && kill -KILL "$1" 2>/dev/null) &
  local watchdog=$! status
  wait "$1"
  status=$?
  pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null  # its sleep too: it would hold ctest's pipe open
  return "$status"
}

# The state of every file in DIR (names, sizes, contents): equal before and after means unchanged.
dir_state() { (cd "$1" && find . -printf '%p %y\n' | sort && find . -type f -exec md5sum {} + | sort); }

# json_byte_shards DIR: byte-level token shards of Python 3.11's json package in DIR (`dtrain data
# shard --bytes`): the test is skipped (77) without that package, and ends (not ok) if sharding fails.
json_byte_shards() {
  local text=/usr/lib/python3.11/json
  [ -d "$text" ] || { echo "SKIPPED: $text not found (Python 3.11's standard library)"; exit 77; }
  if ! "$DTRAIN" data shard --bytes "$text" -o "$1" >"$WORK/shard.log" 2>&1; then
    not_ok "byte shards of $text" "$(tail -3 "$WORK/shard.log")"
    finish
  fi
}

# every_sample_once STOP SAMPLES: the samples of the epoch that the first job used up to step STOP
# (DTRAIN_TEST_SAMPLE_LOG=$WORK/first: lines "<epoch> <step> <sample>...") and all that the resumed
# job used ($WORK/resumed) are 0 .. SAMPLES-1, each exactly once; prints the counts.
every_sample_once() {
  local stop=$1 samples=$2
  {
    awk -v stop="$stop" '$1 == 0 && $2 <= stop { for (i = 3; i <= NF; i++) print $i }' "$WORK"/first.rank*
    awk '$1 == 0 { for (i = 3; i <= NF; i++) print $i }' "$WORK"/resumed.rank*
  } | sort -n >"$WORK/used"
  seq 0 $((samples - 1)) >"$WORK/all"
  echo "# samples used: $(wc -l <"$WORK/used") in all, $(sort -u "$WORK/used" | wc -l) distinct, of $samples"
  cmp -s "$WORK/used" "$WORK/all"
}

# pipeline_layout NP: the pipeline tests' grid at NP ranks: P stages x D replicas, M micro-batches
# of a replica's batch B (the global batch D x B: 64 at NP 2 and 4, 48 at NP 3).
# shellcheck disable=SC2034  # P, D, M, B are the caller's
pipeline_layout() {
  case $1 in
    2) P=2; D=1; M=4; B=64 ;;
    3) P=3; D=1; M=3; B=48 ;;
    4) P=2; D=2; M=4; B=32 ;;
    *) echo "NP must be 2, 3 or 4"; exit 2 ;;
  esac
}

# fingerprint LOG: the final parameters' fingerprint a --json run printed ("" when none).
fingerprint() { sed -n 's/.*"parameters_fingerprint":"\([0-9a-f]*\)".*/\1/p' "$1" | tail -1; }

# The small GPT pipeline the --zero tests train (e2e/gpt_pipeline_zero_test.sh, and across the
# test bed multinode/gpt_pipeline_zero2_test.sh): byte shards in $WORK/shards (json_byte_shards),
# AdamW with clipping, 20 steps, a checkpoint every 10; P 2 x M 2 with GPT_PIPE.
# shellcheck disable=SC2034  # used by the scripts that source this file
GPT_ZERO_JOB=(train --model gpt --layers 2 --heads 2 --embd 32 --context 32 --data "$WORK/shards" --shuffle off --seed 3
  --steps 20 --warmup-steps 5 --lr-schedule cosine --optimizer adamw --lr 0.001 --weight-decay 0.1
  --clip-grad-norm 1.0 --eval-every 10 --eval-batches 2 --threads 1 --log-interval 1 --batch-size 12
  --checkpoint-every 10)
# shellcheck disable=SC2034
GPT_PIPE=(--pipeline-stages 2 --micro-batches 2)
# steps_of LOG: a GPT run's step and val lines without their timings.
steps_of() { grep -E '^(step [0-9]|val loss)' "$1" | sed -E 's/ \| [0-9.]+ ms \| [0-9,]+ tokens\/s$//'; }
