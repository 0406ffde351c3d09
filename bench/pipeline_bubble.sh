#!/usr/bin/env bash
# The pipeline's bubble (issue 23's must-show): the MLP of the README's pipeline example cut into
# P = 2 stages on 2 ranks, for M = 2, 4, 8, 16 micro-batches and both schedules; per stage the
# measured idle share from --trace (1 - forwards and backwards / the step: of the fastest step,
# and the median step; bench/pipeline_timeline.py --idle says why both) beside (P-1)/(M+P-1), the
# run's mean as the log's end line says it (every step, stalls included), and the micro-batch
# inputs held at the peak. Then samples/s of P = 2 (pipeline, M = --m-rate) against D = 2 (data parallel) and one rank
# on the same global batch, interleaved, the median of --repeat runs each; and a PNG of a 1F1B
# step (bench/pipeline_timeline.py) with --png FILE.
#   bash bench/pipeline_bubble.sh [--batch 256] [--limit 8192] [--repeat 3] [--m-rate 4] [--png FILE]
# 1 BLAS thread per rank (OPENBLAS_NUM_THREADS=1, --threads 1). Prints Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
batch=256; limit=8192; repeat=3; m_rate=4; png=""
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) batch=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --m-rate) m_rate=$2; shift 2 ;;
    --png) png=$2; shift 2 ;;
    *) echo "usage: bash bench/pipeline_bubble.sh [--batch B] [--limit N] [--repeat R] [--m-rate M] [--png FILE]" >&2; exit 2 ;;
  esac
done
# shellcheck source=lib.sh
source bench/lib.sh
py=/usr/bin/python3
data=${DTRAIN_E2E_DATA:-/usr/share/datasets/fashion-mnist}
model=(--data "$data" --threads 1 --hidden 512,512,512 --train-limit "$limit" --test-limit 500 --epochs 1)
pipe() { mpirun --bind-to none -np 2 "$dtrain" train "${model[@]}" --pipeline-stages 2 "$@"; }

echo "MLP 784-512-512-512-10, P = 2 stages on 2 ranks, batch $batch, $((limit / batch)) steps; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| schedule | M | (P-1)/(M+P-1) | idle, fastest step: stage 0 / 1 | idle, median step: stage 0 / 1 | log's mean: stage 0 / 1 | inputs held at the peak: stage 0 / 1 |"
echo "|---|---|---|---|---|---|---|"
for schedule in 1f1b gpipe; do
  for m in 2 4 8 16; do
    pipe --batch-size "$batch" --micro-batches "$m" --pipeline-schedule "$schedule" --trace "$work/t.json" >"$work/log" 2>&1
    line=$(grep '^pipeline: idle share' "$work/log")
    mean=$(sed -E 's/.*per stage ([0-9.]+)%, ([0-9.]+)%.*/\1% \/ \2%/' <<<"$line")
    held=$(sed -E 's/.*peak per stage ([0-9]+), ([0-9]+).*/\1 \/ \2/' <<<"$line")
    read -r f0 f1 m0 m1 < <($py bench/pipeline_timeline.py "$work/t.json" --idle --stages 2)
    bubble=$(awk -v m="$m" 'BEGIN {printf "%.1f%%", 100 / (m + 1)}')
    echo "| $schedule | $m | $bubble | $f0% / $f1% | $m0% / $m1% | $mean | $held |"
    if [ "$schedule" = 1f1b ] && [ "$m" = 8 ] && [ -n "$png" ]; then
      $py bench/pipeline_timeline.py "$work/t.json" "$png" --stages 2 >&2
    fi
  done
done

echo
echo "Samples/s on the same global batch of $batch (median of $repeat, interleaved):"
rate() { grep -oE '^Epoch 1: [0-9.]+ samples/s' "$1" | awk '{print $3}'; }
: >"$work/p2"; : >"$work/d2"; : >"$work/p1"
for _ in $(seq "$repeat"); do
  pipe --batch-size "$batch" --micro-batches "$m_rate" >"$work/log" 2>&1; rate "$work/log" >>"$work/p2"
  mpirun --bind-to none -np 2 "$dtrain" train "${model[@]}" --batch-size $((batch / 2)) >"$work/log" 2>&1
  rate "$work/log" >>"$work/d2"
  "$dtrain" train "${model[@]}" --batch-size "$batch" >"$work/log" 2>&1; rate "$work/log" >>"$work/p1"
done
echo
echo "| layout | samples/s |"
echo "|---|---|"
echo "| 1 rank, batch $batch | $(median <"$work/p1") |"
echo "| P = 2 pipeline, M = $m_rate, batch $batch | $(median <"$work/p2") |"
echo "| D = 2 data parallel, batch $((batch / 2)) per rank | $(median <"$work/d2") |"
echo
echo "(each run: $(cat "$work/p1" | tr '\n' ' ')/ $(cat "$work/p2" | tr '\n' ' ')/ $(cat "$work/d2" | tr '\n' ' '); load average $(cut -d' ' -f1-3 /proc/loadavg))"
