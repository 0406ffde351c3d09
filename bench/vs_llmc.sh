#!/usr/bin/env bash
# dtrain's GPT against llm.c's train_gpt2cu on one GPU, one sitting, one table (issue 21's GPU
# anchor): GPT-2 124M's shape (L12 H12 C768 T1024, vocabulary 50257), batch 8, bf16 matmuls with
# TF32 for the rest (llm.c's defaults; dtrain --amp bf16 --tf32), on byte shards of --text.
#   bash bench/vs_llmc.sh --llmc DIR [--steps N (20)] [--batch B (8)] [--text PATH]
# DIR is a checkout of github.com/karpathy/llm.c: a peer program built beside ours, not code of
# the project. It is copied and built with `make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1
# PRECISION=BF16`, after the edits CUDA 13 needs (its cudaMemAdvise takes a cudaMemLocation: the
# managed-memory fallback on out-of-memory is removed, two lines, so llm.c fails instead; NVML is
# not used, one line); each edit is checked, and a checkout they no longer fit is refused.
# Figures: the median tokens/s of steps 5..N of each (both print it per step), and the ratio.
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
edit() {  # FILE SED-EXPRESSION TEXT-IT-REPLACES: the text must be there before and gone after
  grep -qF "$3" "$work/llmc/$1" && sed -i "$2" "$work/llmc/$1" && ! grep -qF "$3" "$work/llmc/$1" ||
    { echo "bench: llm.c's $1 no longer fits this script's CUDA 13 edit of '$3'" >&2; exit 1; }
}
edit llmc/cuda_utils.cuh 's/cudaCheck_(cudaMallocManaged(out, bytes), file, line);/cudaCheck_(err, file, line);/' \
  'cudaMallocManaged(out, bytes)'
edit llmc/cuda_utils.cuh \
  's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaErrorMemoryAllocation/' \
  'cudaMemAdviseSetPreferredLocation'
edit llmc/mfu.h 's/^#if __has_include(<nvml.h>)/#if 0/' '#if __has_include(<nvml.h>)'
(cd "$work/llmc" && make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 PRECISION=BF16 NVCC_LDFLAGS="-lcublas -lcublasLt" \
   >"$work/llmc-build.log" 2>&1) || { echo "bench: llm.c did not build; see its log:" >&2; tail -20 "$work/llmc-build.log" >&2; exit 1; }

"$dtrain" data shard --bytes "$text" -o "$work/shards" >/dev/null
T=1024
"$dtrain" train --model gpt --device cuda --data "$work/shards" --layers 12 --heads 12 --embd 768 --context $T \
  --vocab 50257 --batch-size "$batch" --steps "$steps" --log-interval 1 --eval-every 0 --eval-batches 1 --lr 3e-4 \
  --beta2 0.95 --amp bf16 --tf32 >"$work/dtrain.log" 2>&1 || { tail -5 "$work/dtrain.log" >&2; exit 1; }
(cd "$work/llmc" && ./train_gpt2cu -i "$work/shards/*train*.bin" -j "$work/shards/*val*.bin" -e d12 -b "$batch" \
   -t $T -x "$steps" -v 100000 -m 1 -s 100000 >"$work/llmc.log" 2>&1) || { tail -5 "$work/llmc.log" >&2; exit 1; }

# "step S/N | ... | 112,691 tokens/s" (dtrain) and "step S/N | ... | 292194 tok/s" (llm.c)
tokens_per_s() { awk -v first=5 '/^step +[0-9]+\/[0-9]+ \|/ {split($2, s, "/"); if (s[1] + 0 >= first)
                  for (i = 2; i <= NF; i++) if ($i == "tokens/s" || $i == "tok/s") {v = $(i-1); gsub(",", "", v); print v}}' \
                  "$1" | median; }
ours=$(tokens_per_s "$work/dtrain.log"); theirs=$(tokens_per_s "$work/llmc.log")
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
printf 'GPT-2 124M shape, B=%s T=%s, bf16 + TF32, %s, median of steps 5..%s\n' "$batch" $T "${gpu:-GPU}" "$steps"
printf '%-10s %12s\n' program "tokens/s"
awk -v o="$ours" -v t="$theirs" 'BEGIN {
  printf "%-10s %12.0f\n", "dtrain", o
  printf "%-10s %12.0f\n", "llm.c", t
  printf "dtrain / llm.c tokens/s: %.2f\n", o / t }'
