#!/usr/bin/env bash
# Ranks that issue different collectives through the library API end the job with one line
# naming the difference and the ranks, within seconds (--timeout is 120 s there), never a hang:
# a barrier against a broadcast (the watchdog's board check), float32 all-reduces of different
# lengths (the shared-memory all-reduce's check), int32 ones with the --debug-collectives check;
# the same for reduce-scatters (rs_*), and a reduce-scatter one rank never joins (rs_late: the
# deadline's line naming the collective and the missing rank), and at np 3 a rank waiting on a
# live rank that waits on a stopped one (chain: the stopped rank is named too).
# Usage: collective_mismatch_test.sh RANK_PROGRAM NP
set -uo pipefail
PROGRAM=$1
NP=${2:-2}
failures=0
ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_mismatch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
readonly LIMIT_S=20

modes=(kinds counts checked rs_kinds rs_counts rs_checked rs_late)
[ "$NP" = 3 ] && modes+=(chain)  # a stopped rank beyond the waiting rank's communicator
for mode in "${modes[@]}"; do
  t0=$(date +%s%N)
  (cd "$WORK" && timeout -s KILL $((LIMIT_S + 10)) mpirun -np "$NP" --oversubscribe --bind-to none "$PROGRAM" "$mode" \
    >"$WORK/$mode.log" 2>&1)
  status=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  if [ "$mode" = rs_late ]; then line=$(grep -m1 "timed out after" "$WORK/$mode.log")
  elif [ "$mode" = chain ]; then line=$(grep -m1 "rank 0: .*timed out after" "$WORK/$mode.log")
  else line=$(grep -m1 "ranks issued different collectives" "$WORK/$mode.log"); fi
  echo "# $mode: exit $status after $ms ms: $line"
  if [ "$status" -eq 0 ] || [ "$status" -eq 137 ]; then not_ok "$mode: non-zero exit, not killed" "exit $status"; else ok "$mode: exit $status"; fi
  if [ "$ms" -le $((LIMIT_S * 1000)) ]; then ok "$mode: ends within $LIMIT_S s"; else not_ok "$mode: ends within $LIMIT_S s" "$ms ms"; fi
  case $mode in
    kinds) want="rank 0: barrier of 0 uint8.*rank 1: broadcast of 1048576 int32" ;;
    counts) want="rank 0: allreduce of 1000 float32.*rank 1: allreduce of 2000 float32" ;;
    checked) want="rank 0: allreduce of 1000 int32; ranks? 1[,0-9]*: allreduce of 2000 int32" ;;
    rs_kinds) want="rank 0: reduce_scatter of 1000 float32.*rank 1: allreduce of 1000 float32" ;;
    rs_counts) want="rank 0: reduce_scatter of 1000 float32.*rank 1: reduce_scatter of 2000 float32" ;;
    rs_checked) want="rank 0: reduce_scatter of 1000 int32; ranks? 1[,0-9]*: reduce_scatter of 2000 int32" ;;
    chain) want="collective #[0-9]+ \(allreduce of 1000 float32\) timed out after .*rank 1 has not arrived.*beyond this communicator, rank 2 is not responding" ;;
    rs_late) want="collective #[0-9]+ \(reduce_scatter of 1000 float32\) timed out after .*rank $((NP - 1)) has not arrived" ;;
  esac
  if grep -qE "$want" <<<"$line"; then ok "$mode: the line names the difference and the ranks"; else
    not_ok "$mode: the line names the difference and the ranks" "$(tail -3 "$WORK/$mode.log")"; fi
  # (A broadcast may complete on ranks that do not need rank 0, and MPI's reduce-scatter on the
  # ranks with the larger count: only the rank with the smaller one sees MPI_ERR_TRUNCATE, and
  # its line, from the board, ends the job. In chain the stopped rank goes on when mpirun continues
  # it to end it. The other modes stop every rank.)
  if [ "$mode" != kinds ] && [ "$mode" != rs_counts ] && [ "$mode" != chain ] && grep -q "the mismatched collective completed" "$WORK/$mode.log"; then
    not_ok "$mode: no rank went on" "$(grep completed "$WORK/$mode.log")"; fi
done
[ "$failures" -gt 0 ] && { echo "$failures failure(s)"; exit 1; }
echo "all passed"
