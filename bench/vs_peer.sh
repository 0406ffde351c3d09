#!/usr/bin/env bash
# dtrain against the PyTorch DDP peer (gloo, CPU), same job, same sitting, one table.
#   bash bench/vs_peer.sh [--model mlp|cnn|gpt] [--epochs N] [--repeat R] [--coretype NAME]
# Seed MLP on Fashion-MNIST (np 1 and 2, hidden 256 and 2048), or with --model cnn the LeNet-style
# CNN (np 1 and 2); batch 64 per rank, SGD lr 0.01 momentum 0.9; 1 BLAS/torch thread per rank
# (the peer's default). Each figure is the median of R runs. Every row also shows test accuracy:
# a fast wrong answer is a failure.
# It also runs two independent 1-rank dtrain jobs at once, one pinned to each of the first two
# cores: no communication at all, so their rate against one job alone is the most that two busy
# cores of this machine allow, the ceiling for any 2-rank scaling efficiency measured here.
# Both programs multiply with the same OpenBLAS; --coretype exports OPENBLAS_CORETYPE=NAME to
# both (e.g. SkylakeX for AVX-512 kernels), otherwise each runs with the environment as it is.
# --model gpt: the GPT language model against torch_gpt_peer.py instead (bench/vs_peer_gpt.sh);
# --model resnet18: the ResNet against torch_resnet_peer.py (bench/vs_peer_resnet.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do [ "$arg" = gpt ] && exec bash bench/vs_peer_gpt.sh "$@"; done
for arg in "$@"; do [ "$arg" = resnet18 ] && exec bash bench/vs_peer_resnet.sh "$@"; done
epochs=1; repeat=3; model=mlp
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --coretype) export OPENBLAS_CORETYPE=$2; shift 2 ;;
    *) echo "usage: bash bench/vs_peer.sh [--model mlp|cnn] [--epochs N] [--repeat R] [--coretype NAME]" >&2; exit 2 ;;
  esac
done
case "$model" in mlp) configs=("1 256" "2 256" "2 2048") ;; cnn) configs=("1 256" "2 256") ;;
  *) echo "bench: --model: expected mlp, cnn or gpt, got '$model'" >&2; exit 2 ;; esac
peer=${DTRAIN_PEER:-../shared/peers/torch_ddp_fmnist.py}
[ -f "$peer" ] || { echo "bench: peer script not found at $peer (set DTRAIN_PEER)" >&2; exit 1; }
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench: installing python3-torch for the peer" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch python3-numpy
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=${DTRAIN_BUILD_DIR:-build}
DTRAIN_BUILD_DIR=$build bash scripts/setup.sh build >/dev/null  # incremental: never time a stale binary
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run_dtrain() {  # np hidden [extra flags]
  local np=$1 hidden=$2; shift 2
  OPENBLAS_NUM_THREADS=1 "$build/launcher/dtrain-launch" -n "$np" -- "$build/app/dtrain" train \
    --model "$model" --epochs "$epochs" --hidden "$hidden" --batch-size 64 --lr 0.01 --momentum 0.9 --device cpu --threads 1 \
    --quiet --json "$@" | grep '^{'
}
run_peer() {  # np hidden
  /usr/bin/python3 "$peer" --model "$model" --np "$1" --hidden "$2" --epochs "$epochs" --batch 64 --threads 1 \
    2>/dev/null | grep '^{'
}

run_pair() {  # two independent 1-rank jobs at once, one per core; appends both rates
  local core
  for core in 0 1; do
    OPENBLAS_NUM_THREADS=1 taskset -c "$core" "$build/app/dtrain" train --model "$model" --epochs "$epochs" --hidden 256 \
      --batch-size 64 --lr 0.01 --momentum 0.9 --device cpu --threads 1 --quiet --json | grep '^{' >"$out/pair_$core" &
  done
  wait
  cat "$out/pair_0" "$out/pair_1" >>"$out/pair"
}

for r in $(seq "$repeat"); do
  for cfg in "${configs[@]}"; do
    set -- $cfg
    run_peer "$1" "$2" >>"$out/peer_$1_$2"
    run_dtrain "$1" "$2" >>"$out/dtrain_$1_$2"
  done
  run_pair
done
run_dtrain 2 256 --trace "$out/trace256.json" >"$out/trace_2_256"
if [ "$model" = mlp ]; then run_dtrain 2 1024,1024 --trace "$out/trace1024.json" >"$out/trace_2_1024,1024"; fi

python3 - "$out" "$repeat" "$model" <<'PY'
import json, statistics, sys, os
out, repeat, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
configs = [(1, 256), (2, 256), (2, 2048)] if model == "mlp" else [(1, 256), (2, 256)]
label = (lambda np_, h: f"np {np_}, hidden {h}") if model == "mlp" else (lambda np_, h: f"cnn, np {np_}")
def load(name):
    rows = [json.loads(l) for l in open(os.path.join(out, name))]
    return statistics.median(r["samples_per_s"] for r in rows), statistics.median(r["test_acc"] for r in rows)
print(f"{'job':<22}{'peer samples/s':>16}{'dtrain samples/s':>18}{'speed-up':>10}{'peer acc':>10}{'dtrain acc':>12}")
res = {}
for np_, h in configs:
    p, pa = load(f"peer_{np_}_{h}"); d, da = load(f"dtrain_{np_}_{h}")
    res[(np_, h)] = (p, d)
    print(f"{label(np_, h):<22}{p:>16.1f}{d:>18.1f}{d / p:>9.2f}x{pa:>10.4f}{da:>12.4f}")
p1, d1 = res[(1, 256)]; p2, d2 = res[(2, 256)]
which = "hidden 256" if model == "mlp" else "cnn"
print(f"\nscaling efficiency (np 2 / (2 x np 1), {which}): peer {p2 / (2 * p1):.2f}, dtrain {d2 / (2 * d1):.2f}")
pair = statistics.median(r["samples_per_s"] for r in (json.loads(l) for l in open(os.path.join(out, "pair")) if l.strip()))
print(f"two independent 1-rank dtrain jobs side by side: {pair:.1f} samples/s each = {pair / d1:.2f} of one alone "
      f"(the ceiling for 2-rank efficiency on this machine; dtrain reaches {d2 / (2 * d1) / (pair / d1):.2f} of it)")
for h in (["256", "1024,1024"] if model == "mlp" else ["256"]):
    t = json.loads(open(os.path.join(out, f"trace_2_{h}")).read())
    which = f"hidden {h}" if model == "mlp" else "cnn"
    print(f"all-reduce time overlapping backward (np 2, {which}, from --trace): {100 * t['allreduce_overlap']:.1f}%")
print(f"(median of {repeat} run(s) each; 1 thread per rank; samples/s = training loop only, as the peer counts;"
      f" OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')})")
PY
