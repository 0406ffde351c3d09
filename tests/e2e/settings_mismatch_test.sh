#!/usr/bin/env bash
# Ranks started with different settings (an MPMD mpirun line: `mpirun -np 1 dtrain train A :
# -np N-1 dtrain train B`) stop at start-up with one line naming the setting and the ranks,
# within seconds, instead of hanging in collectives that no longer match.
# Usage: settings_mismatch_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
readonly BOUND_S=20  # "within seconds": start-up plus data loading on a loaded 2-core machine

# mismatch NAME FLAG EXPECTED_VALUE_A EXPECTED_VALUE_B -- ARGS_A -- ARGS_B
mismatch() {
  local name=$1 flag=$2 a=$3 b=$4
  shift 4
  local args_a=() args_b=()
  shift  # --
  while [ "$1" != -- ]; do args_a+=("$1"); shift; done
  shift
  args_b=("$@")
  local log="$WORK/$name.log" t0 status
  t0=$(date +%s%N)
  OPENBLAS_NUM_THREADS=1 timeout 120 mpirun --oversubscribe --bind-to none \
    -np 1 "$DTRAIN" train "${COMMON[@]}" --train-limit 256 "${args_a[@]}" : \
    -np $((NP - 1)) "$DTRAIN" train "${COMMON[@]}" --train-limit 256 "${args_b[@]}" >"$log" 2>&1
  status=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  local lines; lines=$(grep -c '^dtrain: error:' "$log")
  local want_b="rank 1 has"; [ "$NP" -gt 2 ] && want_b="ranks 1,$(seq -s, 2 $((NP - 1))) have"
  local want="dtrain: error: ranks disagree on $flag: rank 0 has $a, $want_b $b"
  echo "# $name: exit $status after $ms ms: $(grep '^dtrain: error:' "$log" | head -1)"
  check "$name: non-zero exit (not a timeout)" failed_not_timed_out "$status"
  check "$name: within ${BOUND_S} s" [ "$ms" -le $((BOUND_S * 1000)) ]
  check "$name: exactly one error line" [ "$lines" = 1 ]
  check "$name: the line names $flag and both values" grep -qF -- "$want" "$log"
}

mismatch bucket_cap --bucket-cap-mb "25 (26214400 bytes)" "0.000999 (1048 bytes)" \
  -- --bucket-cap-mb 25 -- --bucket-cap-mb 0.001
mismatch batch_size --batch-size 32 64 -- --batch-size 32 -- --batch-size 64
mismatch epochs --epochs 1 2 -- --epochs 1 -- --epochs 2
mismatch comm_hook --comm-hook allreduce bf16 -- --comm-hook allreduce -- --comm-hook bf16
mismatch hidden --hidden 256 128,64 -- --hidden 256 -- --hidden 128,64
# A rank that loads weights or a checkpoint waits in broadcasts the others never join: that
# crashed (SIGSEGV in the collectives' worker). The agreement comes before any file is opened.
mismatch init_weights "--init-weights (set or not)" set unset -- --init-weights "$WORK/absent.safetensors" --
mismatch resume --resume auto unset -- --checkpoint-dir "$WORK/ck-resume" --resume auto -- \
  --checkpoint-dir "$WORK/ck-resume"
finish
