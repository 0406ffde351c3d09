#!/usr/bin/env bash
# One process, its threads: samples/s of `dtrain train` (one rank, CPU) at --threads 1, at
# --threads 2 and with the default (no --threads), beside the PyTorch peer at 1 and 2 threads,
# for hidden 256 and 2048 (issue 20: 2 threads must beat 1, the default never lose to 1).
#   bash bench/threads.sh [--repeat R] [--train-limit N] [--before PATH/TO/OLD/dtrain] [--no-peer]
# Runs are interleaved (every configuration once per round, R rounds) and each figure is the
# median, so a machine that gets busier mid-way skews every column alike; the load average is
# printed before and after: quote figures only from a quiet machine. --before adds a column for
# another dtrain binary (e.g. a build of the old main). Every row shows test accuracy too.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=3; limit=0; before=""; peer=1
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --train-limit) limit=$2; shift 2 ;;
    --before) before=$(realpath "$2"); shift 2 ;;
    --no-peer) peer=0; shift ;;
    *) echo "usage: bash bench/threads.sh [--repeat R] [--train-limit N] [--before PATH] [--no-peer]" >&2; exit 2 ;;
  esac
done
build=${DTRAIN_BUILD_DIR:-build}
cmake --build "$build" --target dtrain >/dev/null  # never time a stale binary
dtrain=$(realpath "$build/app/dtrain")
peer_script=${DTRAIN_PEER:-../shared/peers/torch_ddp_fmnist.py}
if [ "$peer" = 1 ] && { [ ! -f "$peer_script" ] || ! /usr/bin/python3 -c "import torch" 2>/dev/null; }; then
  echo "bench: no PyTorch peer ($peer_script, python3-torch): its columns are left out" >&2; peer=0
fi
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS  # the flags decide, as for a user's plain run

limit_flag=(); [ "$limit" -gt 0 ] && limit_flag=(--train-limit "$limit")
dtrain_run() {  # binary hidden [--threads N] -> one JSON line
  local bin=$1 hidden=$2; shift 2
  "$bin" train --epochs 1 --hidden "$hidden" --batch-size 64 --device cpu --quiet --json "${limit_flag[@]}" "$@" \
    2>/dev/null | grep '^{'
}
peer_run() {  # hidden threads
  /usr/bin/python3 "$peer_script" --np 1 --hidden "$1" --threads "$2" --epochs 1 --batch 64 2>/dev/null | grep '^{'
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
for r in $(seq "$repeat"); do
  for h in 256 2048; do
    dtrain_run "$dtrain" "$h" --threads 1 >>"$out/new_t1_$h"
    dtrain_run "$dtrain" "$h" --threads 2 >>"$out/new_t2_$h"
    dtrain_run "$dtrain" "$h" >>"$out/new_def_$h"
    if [ -n "$before" ]; then
      dtrain_run "$before" "$h" --threads 1 >>"$out/old_t1_$h"
      dtrain_run "$before" "$h" --threads 2 >>"$out/old_t2_$h"
      dtrain_run "$before" "$h" >>"$out/old_def_$h"
    fi
    if [ "$peer" = 1 ]; then
      peer_run "$h" 1 >>"$out/peer_t1_$h"
      peer_run "$h" 2 >>"$out/peer_t2_$h"
    fi
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" "$repeat" <<'PY'
import json, os, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
def med(name):
    p = os.path.join(out, name)
    if not os.path.exists(p): return None
    rows = [json.loads(l) for l in open(p) if l.strip()]
    return statistics.median(r["samples_per_s"] for r in rows), statistics.median(r["test_acc"] for r in rows)
cols = [("dtrain", "new"), ("before", "old"), ("peer", "peer")]
print(f"{'hidden':<8}{'program':<9}{'1 thread':>12}{'2 threads':>12}{'default':>12}{'2t / 1t':>9}{'def / 1t':>10}{'acc (1t)':>10}")
for h in (256, 2048):
    for label, key in cols:
        t1, t2, d = med(f"{key}_t1_{h}"), med(f"{key}_t2_{h}"), med(f"{key}_def_{h}")
        if t1 is None: continue
        f = lambda v: f"{v[0]:>12.0f}" if v else f"{'-':>12}"
        r = lambda v: f"{v[0] / t1[0]:>8.2f}x" if v else f"{'-':>9}"
        print(f"{h:<8}{label:<9}{f(t1)}{f(t2)}{f(d)}{r(t2)}{r(d):>10}{t1[1]:>10.4f}")
print(f"(samples/s of the training loop, median of {repeat} interleaved run(s); one process, batch 64; "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')})")
PY
