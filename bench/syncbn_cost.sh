#!/usr/bin/env bash
# The cost of --sync-bn against plain BatchNorm at np 2, measured interleaved (the machine is
# shared, so a plain run and a --sync-bn run alternate, R rounds, each pair in the same minute):
# the job bench/vs_peer_resnet.sh runs (resnet18 width 16, batch 64 per rank, 1 thread per rank,
# --train-limit 12800). Prints every run's median step time, each round's cost and the median cost.
# Note [Median step time]: a run's samples/s is its total time over its steps, so one step held up
# by another process moves it: on a quiet machine plain runs of one build gave 1601-1701
# samples/s (12800 samples) in one sitting, a spread above the cost measured. Each run here logs every step
# (--metrics with --log-interval 1) and gives the median of its step times (the first 5 left
# out): the same build's runs then agree within about 1-2%.
# With several build directories (BUILDS="build other/build"), each round runs every build's
# pair in turn, for before/after comparisons in one sitting.
# --hog session|group runs one busy loop beside every run, for repeatable contention: `session`
# in a session of its own, as another user's (or engineer's) build is, `group` in this one.
# Note [Contention across sessions]: with the kernel's autogroup on (/proc/sys/kernel/
# sched_autogroup_enabled; 6.18 here), each session is one scheduling group and `nice` acts only
# within it, so a nice 19 build in another shell competes at full weight. Under other sessions'
# load --sync-bn (40 blocking collectives a step) often ran faster than plain DDP (samples/s,
# pairs on this 2-core VM, AVX2 kernels; a busy loop in its own session: plain/--sync-bn 943/1133,
# 420/910, 871/1256, 892/916, 572/1486, but 1021/818, 1051/867), while the same loop in the job's
# own group gave the expected order every time (839/610, 879/633, 930/750, interleaved with the
# last three session pairs). In --sync-bn's traces forward and backward took about their quiet
# time, plain's 2-3x, and the ranks' compute threads waited on the run queue
# (/proc/<tid>/schedstat) 5-6 s under --sync-bn and 30 s under plain for ~11 s of running each:
# the scheduler gave --sync-bn's ranks (which sleep and wake at every collective) more of the
# cores against other groups. Neither the shared-memory all-reduce's spin nor the buckets decide
# it: plain with DTRAIN_SHM_ALLREDUCE=0, with one bucket or without the buffer broadcast was as
# slow. So such an inversion says nothing about either mode's cost: compare them quiet (--hog
# group adds a loop of the job's own group, but does not cancel other sessions' load: one round
# with others' builds running still gave plain 526 / --sync-bn 693).
#   bash bench/syncbn_cost.sh [--repeat R] [--np N] [--hog session|group]
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=3; np=2; hog=""
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --hog) hog=$2; shift 2; [ "$hog" = session ] || [ "$hog" = group ] || { echo "--hog: session or group, got '$hog'" >&2; exit 2; } ;;
    *) echo "usage: bash bench/syncbn_cost.sh [--repeat R] [--np N] [--hog session|group]" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
builds=${BUILDS:-${DTRAIN_BUILD_DIR:-build}}
job=(--model resnet18 --width 16 --epochs 1 --train-limit 12800 --batch-size 64 --lr 0.05 --momentum 0.9
     --weight-decay 5e-4 --device cpu --threads 1 --quiet --log-interval 1)
metrics=$(mktemp)
rate() {  # build, extra flags...: one run's median step time in ms (Note [Median step time])
  local b=$1; shift
  local busy=(python3 -c 'while 1: pass') pid=""
  case $hog in
    session) setsid "${busy[@]}" >/dev/null & pid=$! ;;
    group) "${busy[@]}" >/dev/null & pid=$! ;;
  esac
  OPENBLAS_NUM_THREADS=1 "$b/launcher/dtrain-launch" -n "$np" -- "$b/app/dtrain" train "${job[@]}" "$@" \
    --metrics "$metrics" >/dev/null
  python3 - "$metrics" <<'PY'
import json, statistics, sys
t = [r["time_s"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
print(f"{1000 * statistics.median(b - a for a, b in list(zip(t, t[1:]))[5:]):.2f}")
PY
  if [ -n "$pid" ]; then kill "$pid"; wait "$pid" 2>/dev/null || true; fi
}
out=$(mktemp)
trap 'rm -f "$out" "$metrics"' EXIT
echo "np $np, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, $repeat round(s)${hog:+, a busy loop in the $hog beside each run}"
for r in $(seq "$repeat"); do
  for b in $builds; do
    # Alternate which goes first, so neither always follows the other.
    if [ $((r % 2)) -eq 1 ]; then p=$(rate "$b"); s=$(rate "$b" --sync-bn); else s=$(rate "$b" --sync-bn); p=$(rate "$b"); fi
    echo "$b $p $s" >>"$out"
    python3 -c "import sys; p, s = float(sys.argv[2]), float(sys.argv[3]); print(f'round $r {sys.argv[1]}: step plain {p:.2f} ms  --sync-bn {s:.2f} ms  cost {100 * (s / p - 1):.1f}%')" "$b" "$p" "$s"
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, p, s = line.split()
    rows[b].append((float(p), float(s)))
for b, v in rows.items():
    costs = [100 * (s / p - 1) for p, s in v]
    print(f"{b}: median cost {statistics.median(costs):.1f}% (rounds: {', '.join(f'{c:.1f}' for c in costs)}); "
          f"median step plain {statistics.median(p for p, _ in v):.2f} ms, --sync-bn {statistics.median(s for _, s in v):.2f} ms")
PY
