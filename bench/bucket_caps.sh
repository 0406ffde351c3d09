#!/usr/bin/env bash
# --bucket-cap-mb auto against a sweep of fixed caps on one model: samples/s of each (median of
# --repeat runs, the configurations interleaved so that a noisy minute hits all of them), and
# the buckets auto chose in each of its runs (Note [Bucket cap autotuning] in
# ddp/bucket_cap_tuner.h). The goal: auto within 5% of the best fixed cap.
#   bash bench/bucket_caps.sh [--np 2] [--hidden 1024,1024] [--caps "1 4 16 64"] [--repeat 5] [--epochs 1]
set -euo pipefail
cd "$(dirname "$0")/.."
np=2; hidden=1024,1024; caps="1 4 16 64"; repeat=5; epochs=1
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --caps) caps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    *) echo "usage: bash bench/bucket_caps.sh [--np N] [--hidden W[,W...]] [--caps \"MiB ...\"] [--repeat R] [--epochs N]" >&2; exit 2 ;;
  esac
done
# shellcheck source=lib.sh
source bench/lib.sh

for r in $(seq "$repeat"); do
  for cap in $caps auto; do
    "$launch" -n "$np" -- "$dtrain" train --model mlp --hidden "$hidden" --epochs "$epochs" --batch-size 64 \
      --threads 1 --device cpu --json --bucket-cap-mb "$cap" >"$work/log" 2>&1
    /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["samples_per_s"])' \
      "$(grep '^{' "$work/log" | tail -1)" >>"$work/$cap"
    if [ "$cap" = auto ]; then grep -o 'auto chose a [0-9.]* MiB first bucket and a [0-9.]* MiB cap' "$work/log" |
      sed 's/auto chose //' >>"$work/choices" || echo "(no choice logged)" >>"$work/choices"; fi
  done
  echo "# sitting $r of $repeat done" >&2
done

echo "np $np, --hidden $hidden, $epochs epoch(s), median of $repeat runs (samples/s):"
best=0; best_cap=""
for cap in $caps; do
  m=$(median <"$work/$cap")
  printf '  --bucket-cap-mb %-5s %10.0f   (runs: %s)\n' "$cap" "$m" "$(sort -g "$work/$cap" | xargs printf '%.0f ')"
  if awk -v m="$m" -v b="$best" 'BEGIN {exit !(m > b)}'; then best=$m; best_cap=$cap; fi
done
a=$(median <"$work/auto")
printf '  --bucket-cap-mb auto  %10.0f   (runs: %s)\n' "$a" "$(sort -g "$work/auto" | xargs printf '%.0f ')"
echo "  auto chose: $(sort "$work/choices" | uniq -c | sed 's/^ *//' | paste -sd';' | sed 's/;/; /g')"
awk -v a="$a" -v b="$best" -v c="$best_cap" 'BEGIN {printf "auto / best fixed cap (%s MiB): %.3f (goal: at least 0.95)\n", c, a / b}'
