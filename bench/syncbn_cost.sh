#!/usr/bin/env bash
# The cost of --sync-bn against plain BatchNorm at np 2, measured interleaved (the machine is
# shared, so a plain run and a --sync-bn run alternate, R rounds, each pair in the same minute):
# the job bench/vs_peer_resnet.sh runs (resnet18 width 16, batch 64 per rank, 1 thread per rank,
# --train-limit 12800). Prints every run's samples/s, each round's cost and the median cost.
# With several build directories (BUILDS="build other/build"), each round runs every build's
# pair in turn, for before/after comparisons in one sitting.
#   bash bench/syncbn_cost.sh [--repeat R] [--np N]
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=3; np=2
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    *) echo "usage: bash bench/syncbn_cost.sh [--repeat R] [--np N]" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
builds=${BUILDS:-${DTRAIN_BUILD_DIR:-build}}
job=(--model resnet18 --width 16 --epochs 1 --train-limit 12800 --batch-size 64 --lr 0.05 --momentum 0.9
     --weight-decay 5e-4 --device cpu --threads 1 --quiet --json)
rate() {  # build, extra flags...: one run's samples/s
  local b=$1; shift
  OPENBLAS_NUM_THREADS=1 "$b/launcher/dtrain-launch" -n "$np" -- "$b/app/dtrain" train "${job[@]}" "$@" |
    grep '^{' | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["samples_per_s"])'
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "np $np, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, $repeat round(s)"
for r in $(seq "$repeat"); do
  for b in $builds; do
    # Alternate which goes first, so neither always follows the other.
    if [ $((r % 2)) -eq 1 ]; then p=$(rate "$b"); s=$(rate "$b" --sync-bn); else s=$(rate "$b" --sync-bn); p=$(rate "$b"); fi
    echo "$b $p $s" >>"$out"
    python3 -c "import sys; p, s = float(sys.argv[2]), float(sys.argv[3]); print(f'round $r {sys.argv[1]}: plain {p:.1f}  --sync-bn {s:.1f}  cost {100 * (p / s - 1):.1f}%')" "$b" "$p" "$s"
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, p, s = line.split()
    rows[b].append((float(p), float(s)))
for b, v in rows.items():
    costs = [100 * (p / s - 1) for p, s in v]
    print(f"{b}: median cost {statistics.median(costs):.1f}% (rounds: {', '.join(f'{c:.1f}' for c in costs)}); "
          f"median plain {statistics.median(p for p, _ in v):.1f}, --sync-bn {statistics.median(s for _, s in v):.1f} samples/s")
PY
