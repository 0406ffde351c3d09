#!/usr/bin/env bash
# dtrain's GPT against the PyTorch GPT peer (torch_gpt_peer.py, gloo DDP on CPU), one sitting, one
# table (issue 21's "must show", speed). Run as `bash bench/vs_peer.sh --model gpt [flags]`:
#   --steps N (20)  --repeat R (3)  --text PATH (/usr/lib/python3.11)  --coretype NAME
# Config L4 H4 C256 T256, vocabulary 256 (byte shards of --text, written once with `dtrain data
# shard --bytes`), batch 8 per rank, 1 thread per rank, np 1 and np 2; both with AdamW (betas
# 0.9/0.95, weight decay 0.1 on 2-D tensors), warm-up 10% then cosine, clipping 1.0, shuffle off.
# Figures, each the median of R runs:
#   - tokens/s of the training loop (both count steps x ranks x B x T over the loop's wall time)
#     side by side, the ratio, and each one's scaling efficiency np 2 / (2 x np 1);
#   - model FLOP/s = FLOP per token x tokens/s per rank, against the float32 GEMM rate the same
#     dtrain binary measures (`dtrain bench gemm --threads 1`). FLOP per token of a training step:
#     6 x (12 L C^2 + V C) for the matmuls of the blocks and the tied output layer, + 12 L T C for
#     attention's two T x T products (nanoGPT's estimate_mfu; causal masking not discounted);
#   - peak RSS: the largest rank's VmHWM, from GNU time's "Maximum resident set size" of the job
#     (getrusage's children figure is the largest process, not a sum);
#   - the all-reduce time overlapping backward at np 2 with --bucket-cap-mb 1 (dtrain's --json
#     allreduce_overlap, measured with --trace).
# Correctness beside speed: both programs' last training loss and validation loss are printed
# (the same data, slots and schedule: they must be close; the initial weights differ by RNG).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=20; repeat=3; text=/usr/lib/python3.11
while [ $# -gt 0 ]; do
  case "$1" in
    --model) [ "$2" = gpt ] || { echo "bench: vs_peer_gpt.sh is --model gpt" >&2; exit 2; }; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --coretype) export OPENBLAS_CORETYPE=$2; shift 2 ;;
    *) echo "usage: bash bench/vs_peer.sh --model gpt [--steps N] [--repeat R] [--text PATH] [--coretype NAME]" >&2
       exit 2 ;;
  esac
done
peer=${DTRAIN_PEER:-../shared/peers/torch_gpt_peer.py}
[ -f "$peer" ] || { echo "bench: peer script not found at $peer (set DTRAIN_PEER)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench: GNU time (/usr/bin/time, Debian package time) is needed for peak RSS" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
L=4 H=4 C=256 T=256 V=256 B=8
warmup=$(( steps / 10 > 0 ? steps / 10 : 1 ))
"$dtrain" data shard --bytes "$text" -o "$work/shards" >/dev/null

# rss_kib LOG: GNU time's "Maximum resident set size (kbytes)" in LOG.
rss_kib() { sed -n 's/^\s*Maximum resident set size (kbytes): //p' "$1"; }
run_dtrain() {  # np name [extra flags]
  local np=$1 name=$2; shift 2
  /usr/bin/time -v -o "$work/$name.time" "$launch" -n "$np" -- "$dtrain" train --model gpt --layers $L --heads $H \
    --embd $C --context $T --data "$work/shards" --batch-size $B --steps "$steps" --warmup-steps "$warmup" \
    --lr-schedule cosine --optimizer adamw --lr 0.001 --beta2 0.95 --weight-decay 0.1 --clip-grad-norm 1.0 \
    --shuffle off --eval-batches 4 --device cpu --threads 1 --quiet --json "$@" | grep '^{' >"$work/$name.json"
  echo "$(cat "$work/$name.json") $(rss_kib "$work/$name.time")" >>"$work/dtrain_$np"
}
run_peer() {  # np
  /usr/bin/time -v -o "$work/peer.time" /usr/bin/python3 "$peer" --data "$work/shards" --np "$1" --threads 1 \
    --layers $L --heads $H --embd $C --context $T --vocab $V --batch $B --steps "$steps" --warmup "$warmup" \
    --val-batches 4 2>/dev/null | grep '^{' >"$work/peer.json"
  echo "$(cat "$work/peer.json") $(rss_kib "$work/peer.time")" >>"$work/peer_$1"
}

"$dtrain" bench gemm --threads 1 | grep '^{' >"$work/gemm.json"
for r in $(seq "$repeat"); do
  for np in 1 2; do
    run_peer "$np"
    run_dtrain "$np" "dtrain_run"
  done
done
run_dtrain 2 overlap --bucket-cap-mb 1 --trace "$work/trace.json"
echo "load after the runs: $(cat /proc/loadavg)"

python3 - "$work" "$repeat" $L $H $C $T $V $B "$steps" <<'PY'
import json, os, statistics, sys
work, repeat = sys.argv[1], int(sys.argv[2])
L, H, C, T, V, B, steps = map(int, sys.argv[3:10])
def rows(name):  # each line: the JSON summary, then the peak RSS in KiB
    out = []
    for line in open(os.path.join(work, name)):
        js, rss = line.rsplit(" ", 1)
        out.append((json.loads(js), int(rss)))
    return out
def med(rs, key):
    return statistics.median(r[0][key] for r in rs)
def rss(rs):
    return statistics.median(r[1] for r in rs) / 1024
flop_per_token = 6 * (12 * L * C * C + V * C) + 12 * L * T * C
gemm = json.load(open(os.path.join(work, "gemm.json")))
print(f"GPT L{L} H{H} C{C} T{T} V{V}, batch {B} per rank, {steps} steps, 1 thread per rank; "
      f"{flop_per_token / 1e6:.1f} MFLOP per token (training step)")
print(f"{'job':<8}{'peer tok/s':>12}{'dtrain tok/s':>14}{'ratio':>8}{'peer GFLOP/s/rank':>19}{'dtrain':>8}"
      f"{'peer RSS MiB':>14}{'dtrain':>8}{'peer loss/val':>16}{'dtrain':>16}")
res = {}
for np_ in (1, 2):
    p, d = rows(f"peer_{np_}"), rows(f"dtrain_{np_}")
    pt, dt = med(p, "tokens_per_s"), med(d, "tokens_per_s")
    res[np_] = (pt, dt)
    pf, df = flop_per_token * pt / np_ / 1e9, flop_per_token * dt / np_ / 1e9
    print(f"{'np ' + str(np_):<8}{pt:>12.0f}{dt:>14.0f}{dt / pt:>7.2f}x{pf:>19.1f}{df:>8.1f}{rss(p):>14.0f}{rss(d):>8.0f}"
          f"{med(p, 'train_loss'):>8.3f}/{med(p, 'val_loss'):<7.3f}{med(d, 'train_loss'):>8.3f}/{med(d, 'val_loss'):<7.3f}")
(p1, d1), (p2, d2) = res[1], res[2]
g = gemm["sgemm_gflops"]
print(f"\nscaling efficiency np 2 / (2 x np 1): peer {p2 / (2 * p1):.2f}, dtrain {d2 / (2 * d1):.2f}")
print(f"dtrain's sgemm rate (dtrain bench gemm --threads 1, {gemm['size']}^3, {gemm['wrong']} wrong): {g:.1f} GFLOP/s; "
      f"model FLOP/s of a rank against it: np 1 {flop_per_token * d1 / 1e9 / g:.2f} (peer {flop_per_token * p1 / 1e9 / g:.2f}),"
      f" np 2 {flop_per_token * d2 / 2e9 / g:.2f} (peer {flop_per_token * p2 / 2e9 / g:.2f})")
o = json.load(open(os.path.join(work, "overlap.json")))
ov = o.get("allreduce_overlap")
print("all-reduce time overlapping backward (np 2, --bucket-cap-mb 1, from --trace): "
      + (f"{100 * ov:.1f}%" if isinstance(ov, (int, float)) and ov >= 0 else f"not reported ({ov!r})"))
print(f"(median of {repeat} run(s) each; tokens/s = the training loop only, as the peer counts; "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '<unset>')})")
PY
