#!/usr/bin/env bash
# The scaling benchmark: samples/s, scaling efficiency, the all-reduce's share of the step and
# the share of it hidden behind backward, over rank counts and models; optionally the PyTorch
# peer beside each row and the 2-node test bed (2x1, 2x2). Writes DIR/scaling.csv and
# DIR/scaling.png (throughput and efficiency against ranks).
#   bash bench/scaling.sh [--ranks "1 2"] [--models "mlp mlp-1024 cnn"] [--epochs 1] [--repeat 3]
#                         [--peer] [--testbed] [--out DIR]
# Ranks beyond the cores are oversubscribed (function, not speed: say so when you quote them).
# Each figure is the median of --repeat runs. 1 BLAS thread per rank, batch 64 per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks="1 2"; models="mlp mlp-1024 cnn"; epochs=1; repeat=3; peer=0; testbed=0; out=bench/results
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --peer) peer=1; shift ;;
    --testbed) testbed=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: bash bench/scaling.sh [--ranks \"1 2\"] [--models \"mlp mlp-1024 cnn\"] [--epochs N] [--repeat R] [--peer] [--testbed] [--out DIR]" >&2; exit 2 ;;
  esac
done
# shellcheck source=lib.sh
source bench/lib.sh
peer_script=${DTRAIN_PEER:-../shared/peers/torch_ddp_fmnist.py}
mkdir -p "$out"

model_flags() {  # name -> dtrain flags
  case "$1" in
    mlp) echo "--model mlp --hidden 256" ;;
    mlp-1024) echo "--model mlp --hidden 1024,1024" ;;
    cnn) echo "--model cnn" ;;
    *) echo "bench/scaling.sh: unknown model '$1' (mlp, mlp-1024, cnn)" >&2; exit 2 ;;
  esac
}

# One run: prints "samples_per_s allreduce_share hidden_share" from the --json summary and the
# --metrics records (all-reduce seconds over the epoch's seconds; overlapped over all-reduce).
one_run() {  # model launcher-args...
  local m=$1; shift
  rm -f "$work/m.jsonl"
  # shellcheck disable=SC2046
  "$@" -- "$dtrain" train $(model_flags "$m") --epochs "$epochs" --batch-size 64 --threads 1 --device cpu \
    --quiet --json --metrics "$work/m.jsonl" | grep '^{' >"$work/summary.json"
  /usr/bin/python3 - "$work/summary.json" "$work/m.jsonl" <<'PY'
import json, sys
summary = json.loads(open(sys.argv[1]).read().splitlines()[-1])
steps = [json.loads(l) for l in open(sys.argv[2]) if '"type":"step"' in l]
epochs = [json.loads(l) for l in open(sys.argv[2]) if '"type":"epoch"' in l]
ar = sum(s.get("allreduce_s", 0.0) for s in steps)
hidden = sum(s.get("allreduce_s", 0.0) * s.get("allreduce_overlap", 0.0) for s in steps)
train_s = sum(e["epoch_s"] for e in epochs) or 1.0
print(summary["samples_per_s"], ar / train_s, hidden / ar if ar > 0 else 0.0)
PY
}

measure() {  # model nodes ranks launcher-args... -> appends a CSV row
  local m=$1 nodes=$2 np=$3; shift 3
  : >"$work/runs"
  for _ in $(seq "$repeat"); do one_run "$m" "$@" >>"$work/runs"; done
  local sps share hid peer_sps=""
  sps=$(cut -d' ' -f1 "$work/runs" | median); share=$(cut -d' ' -f2 "$work/runs" | median)
  hid=$(cut -d' ' -f3 "$work/runs" | median)
  if [ "$peer" = 1 ] && [ "$nodes" = 1 ] && [ "$m" != mlp-1024 ]; then
    local pm=mlp; [ "$m" = cnn ] && pm=cnn
    peer_sps=$(for _ in $(seq "$repeat"); do /usr/bin/python3 "$peer_script" --model "$pm" --np "$np" --hidden 256 \
      --epochs "$epochs" --batch 64 --threads 1 2>/dev/null | grep '^{' | /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_s"])'; done | median)
  fi
  echo "$m,$nodes,$np,$sps,$share,$hid,$peer_sps" >>"$work/rows"
  printf '%-9s %d node(s) %2d rank(s): %10.0f samples/s  all-reduce %4.1f%% of the step, %4.1f%% of it hidden%s\n' \
    "$m" "$nodes" "$np" "$sps" "$(echo "$share * 100" | bc -l)" "$(echo "$hid * 100" | bc -l)" \
    "${peer_sps:+  (PyTorch DDP: $peer_sps)}"
}

: >"$work/rows"
cores=$(nproc)
for m in $models; do
  for np in $ranks; do
    [ "$np" -gt "$cores" ] && echo "# $np ranks on $cores cores: oversubscribed, for function not speed"
    measure "$m" 1 "$np" "$launch" -n "$np"
  done
  if [ "$testbed" = 1 ]; then
    if ! scripts/testbed.sh check >/dev/null 2>&1; then
      echo "# test bed skipped: $(scripts/testbed.sh check 2>&1 | tail -1)"
    else
      for per in 1 2; do
        measure "$m" 2 $((2 * per)) scripts/testbed.sh run --nodes 2 -- "$launch" --hosts "nodeA:$per,nodeB:$per" \
          --iface 198.18.0.0/24
      done
    fi
  fi
done

# Efficiency: samples/s at n ranks / (n x samples/s at 1 rank on one node), per model.
/usr/bin/python3 - "$work/rows" "$out/scaling.csv" <<'PY'
import csv, sys
rows = [r.split(",") for r in open(sys.argv[1]).read().split()]
base = {r[0]: float(r[3]) for r in rows if r[1] == "1" and r[2] == "1"}
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["model", "nodes", "ranks", "samples_per_s", "efficiency", "allreduce_share", "allreduce_hidden", "peer_samples_per_s"])
    for m, nodes, np, sps, share, hid, peer in rows:
        eff = float(sps) / (int(np) * base[m]) if m in base else ""
        w.writerow([m, nodes, np, f"{float(sps):.1f}", f"{eff:.3f}" if eff != "" else "", f"{float(share):.4f}", f"{float(hid):.4f}", peer])
PY
/usr/bin/python3 scripts/plot_scaling.py "$out/scaling.csv" -o "$out/scaling.png" --title "dtrain on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "wrote $out/scaling.csv and $out/scaling.png"
