#!/usr/bin/env bash
# dtrain's GPT against llm.c's train_gpt2cu on one GPU, one sitting, one table (issue 21's GPU
# anchor): GPT-2 124M's shape (L12 H12 C768 T1024, vocabulary 50257), batch 8, bf16 matmuls with
# TF32 for the rest (llm.c's defaults; dtrain --amp bf16 --tf32), on byte shards of --text.
#   bash bench/vs_llmc.sh --llmc DIR [--steps N (20)] [--batch B (8)] [--text PATH]
# DIR is a checkout of github.com/karpathy/llm.c: a peer program built beside ours, not code of
# the project. It is copied and built with `make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1
# PRECISION=BF16`, after two edits CUDA 13 needs (its cudaMemAdvise takes a cudaMemLocation: the
# managed-memory fallback on out-of-memory is removed, so llm.c fails instead; NVML is not used).
# Figures: the median step time of steps 5..N of each (llm.c prints its own per-step ms; dtrain's
# log line every step), tokens/s = B*T / step time, and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
llmc=""; steps=20; batch=8; text=/usr/lib/python3.11
while [ $# -gt 0 ]; do
  case "$1" in
    --llmc) llmc=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    *) echo "usage: bash bench/vs_llmc.sh --llmc DIR [--steps N] [--batch B] [--text PATH]" >&2; exit 2 ;;
  esac
done
[ -f "$llmc/train_gpt2.cu" ] || { echo "bench: --llmc DIR must be a checkout of karpathy/llm.c (no train_gpt2.cu in '$llmc')" >&2; exit 2; }
[ "$steps" -ge 8 ] || { echo "bench: --steps must be at least 8 (steps 5.. are timed)" >&2; exit 2; }
command -v nvcc >/dev/null || { echo "bench: nvcc not found: llm.c's trainer needs the CUDA toolkit" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh

cp -r "$llmc" "$work/llmc"
sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaErrorMemoryAllocation/' \
  "$work/llmc/llmc/cuda_utils.cuh"
sed -i 's/^#if __has_include(<nvml.h>)/#if 0/' "$work/llmc/llmc/mfu.h"
sed -i 's/cudaCheck_(cudaMallocManaged(out, bytes), file, line);/cudaCheck_(err, file, line);/' "$work/llmc/llmc/cuda_utils.cuh"
(cd "$work/llmc" && make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 PRECISION=BF16 NVCC_LDFLAGS="-lcublas -lcublasLt" \
   >"$work/llmc-build.log" 2>&1) || { echo "bench: llm.c did not build; see its log:" >&2; tail -20 "$work/llmc-build.log" >&2; exit 1; }

"$dtrain" data shard --bytes "$text" -o "$work/shards" >/dev/null
T=1024
"$dtrain" train --model gpt --device cuda --data "$work/shards" --layers 12 --heads 12 --embd 768 --context $T \
  --vocab 50257 --batch-size "$batch" --steps "$steps" --log-interval 1 --eval-every 0 --eval-batches 1 --lr 3e-4 \
  --beta2 0.95 --amp bf16 --tf32 >"$work/dtrain.log" 2>&1 || { tail -5 "$work/dtrain.log" >&2; exit 1; }
(cd "$work/llmc" && ./train_gpt2cu -i "$work/shards/*train*.bin" -j "$work/shards/*val*.bin" -e d12 -b "$batch" \
   -t $T -x "$steps" -v 100000 -m 1 -s 100000 >"$work/llmc.log" 2>&1) || { tail -5 "$work/llmc.log" >&2; exit 1; }

# "step S/N | ... | 73 ms | ..." (dtrain) and "step S/N | ... | 28.05 ms | ..." (llm.c)
step_ms() { awk -v first=5 '/^step +[0-9]+\/[0-9]+ \|/ {split($2, s, "/"); if (s[1] + 0 >= first)
             for (i = 1; i <= NF; i++) if ($(i+1) == "ms" || $(i+1) == "ms,") print $i}' "$1" | median; }
ours=$(step_ms "$work/dtrain.log"); theirs=$(step_ms "$work/llmc.log")
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
printf 'GPT-2 124M shape, B=%s T=%s, bf16 + TF32, %s, median of steps 5..%s\n' "$batch" $T "${gpu:-GPU}" "$steps"
printf '%-10s %10s %12s\n' program "ms/step" "tokens/s"
awk -v o="$ours" -v t="$theirs" -v n=$((batch * T)) 'BEGIN {
  printf "%-10s %10.1f %12.0f\n", "dtrain", o, n / o * 1000
  printf "%-10s %10.1f %12.0f\n", "llm.c", t, n / t * 1000
  printf "dtrain / llm.c tokens/s: %.2f\n", t / o }'
