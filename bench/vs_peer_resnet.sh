#!/usr/bin/env bash
# dtrain's resnet18 against the PyTorch ResNet peer (../shared/peers/torch_resnet_peer.py, DDP over
# gloo on CPU), same job, same sitting: width 16, batch 64 per rank, SGD lr 0.05 momentum 0.9
# weight decay 5e-4, --train-limit 12800, 1 BLAS/torch thread per rank, np 1 and 2 (and at np 2
# dtrain with --sync-bn, whose cost against plain BatchNorm the issue asks for). Each figure is
# the median of R runs; every row shows the test accuracy beside it.
#   bash bench/vs_peer_resnet.sh [--repeat R] [--nps "1 2"]     (also: bench/vs_peer.sh --model resnet18)
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=1; nps="1 2"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --nps) nps=$2; shift 2 ;;
    *) echo "usage: bash bench/vs_peer_resnet.sh [--repeat R] [--nps \"1 2\"]" >&2; exit 2 ;;
  esac
done
peer=${DTRAIN_RESNET_PEER:-../shared/peers/torch_resnet_peer.py}
[ -f "$peer" ] || { echo "bench: peer script not found at $peer (set DTRAIN_RESNET_PEER)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=${DTRAIN_BUILD_DIR:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
job=(--model resnet18 --width 16 --epochs 1 --train-limit 12800 --batch-size 64 --lr 0.05 --momentum 0.9
     --weight-decay 5e-4 --device cpu --threads 1 --quiet --json)
for r in $(seq "$repeat"); do
  for np in $nps; do
    /usr/bin/python3 "$peer" --np "$np" --epochs 1 --batch 64 --train-limit 12800 2>/dev/null | grep '^{' >>"$out/peer_$np"
    OPENBLAS_NUM_THREADS=1 "$build/launcher/dtrain-launch" -n "$np" -- "$build/app/dtrain" train "${job[@]}" \
      | grep '^{' >>"$out/dtrain_$np"
    if [ "$np" -gt 1 ]; then
      OPENBLAS_NUM_THREADS=1 "$build/launcher/dtrain-launch" -n "$np" -- "$build/app/dtrain" train "${job[@]}" --sync-bn \
        | grep '^{' >>"$out/syncbn_$np"
    fi
  done
done
python3 - "$out" "$repeat" $nps <<'PY'
import json, os, statistics, sys
out, repeat, nps = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3:]]
def load(name):
    rows = [json.loads(l) for l in open(os.path.join(out, name)) if l.strip()]
    return statistics.median(r["samples_per_s"] for r in rows), statistics.median(r["test_acc"] for r in rows)
print(f"{'resnet18 width 16':<22}{'peer samples/s':>16}{'dtrain samples/s':>18}{'speed-up':>10}{'peer acc':>10}{'dtrain acc':>12}")
for np_ in nps:
    p, pa = load(f"peer_{np_}"); d, da = load(f"dtrain_{np_}")
    print(f"{'np ' + str(np_):<22}{p:>16.1f}{d:>18.1f}{d / p:>9.2f}x{pa:>10.4f}{da:>12.4f}")
    if np_ > 1:
        s, sa = load(f"syncbn_{np_}")
        print(f"{'np ' + str(np_) + ' --sync-bn':<22}{'':>16}{s:>18.1f}{'':>10}{'':>10}{sa:>12.4f}"
              f"   (cost against plain BatchNorm by these samples/s medians: {100 * (d / s - 1):.1f}%; "
              "bench/syncbn_cost.sh measures it by median step time, which a held-up step does not move)")
print(f"(median of {repeat} run(s); 1 thread per rank; samples/s = training loop only, as the peer counts)")
PY
