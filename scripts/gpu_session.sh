#!/usr/bin/env bash
# The day a GPU machine is lent: one command that builds the CUDA variant, runs `ctest -L gpu`
# and a short GPU training run of every model, and writes every log and a summary table to
# ${OUT:-./gpu-session-out}/ (summary.md). Made for a device call of one command line, at most
# 10 minutes: it stops at a global time budget, skipping what is left with a line saying so.
#   bash scripts/gpu_session.sh [--budget SECONDS] [--only STAGES] [--build-dir DIR] [--dry-run]
#     --budget S   stop starting work after S seconds in all (default 540, for a 600 s call)
#     --only LIST  comma-separated stages: build, ctest, train (one run of each model),
#                  extra (bf16, P 1, TF32, dtrain-launch); default all, in that order
#     --dry-run    print the plan (every step, its timeout) and exit 0
# Exit status: 0 when everything that could run passed; runs that fail only because no GPU is
# visible are recorded as "no GPU" and are not failures (so a CPU machine checks the script).
# No apt here: a device machine may have no network. Missing packages are named in one line.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

budget=540
only=build,ctest,train,extra
build="build-gpu-session"
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --only) only=${2:?--only needs a list}; shift 2 ;;
    --build-dir) build=${2:?--build-dir needs a folder}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_session: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$budget" in ''|*[!0-9]*) echo "gpu_session: --budget '$budget' is not a whole number of seconds" >&2; exit 2 ;; esac
for s in ${only//,/ }; do
  case "$s" in build|ctest|train|extra) ;; *) echo "gpu_session: unknown stage '$s' in --only (build, ctest, train, extra)" >&2; exit 2 ;; esac
done
want() { [[ ",$only," == *",$1,"* ]]; }

out=${OUT:-$root/gpu-session-out}
logs=$out/logs
dtrain=$build/app/dtrain
launch=$build/launcher/dtrain-launch

# The training runs: NAME|STAGE|TIMEOUT|MODEL AND FLAGS (after `dtrain train --device cuda`).
# Sized for an H100 so that the train stage takes about 2 minutes and extra about 2 more; the
# timeouts are ceilings, never the expected time. DATA and SHARDS are filled in at run time.
fmnist_runs=(
  "mlp|train|60|--model mlp --epochs 1 --data DATA"
  "cnn|train|90|--model cnn --epochs 1 --data DATA"
  "resnet18|train|90|--model resnet18 --width 16 --epochs 1 --train-limit 8192 --test-limit 2000 --data DATA"
)
gpt_runs=(
  "gpt|train|90|--model gpt --layers 4 --heads 4 --embd 256 --context 256 --batch-size 8 --steps 200 --eval-batches 20 --data SHARDS"
)
extra_runs=(
  "resnet18-bf16|extra|90|--model resnet18 --width 16 --epochs 1 --train-limit 8192 --test-limit 2000 --amp bf16 --data DATA"
  "gpt-bf16|extra|90|--model gpt --layers 4 --heads 4 --embd 256 --context 256 --batch-size 8 --steps 200 --eval-batches 20 --amp bf16 --data SHARDS"
  # No --sync-bn run: one rank builds no DDP (--sync-bn then changes nothing), and two ranks need
  # two GPUs (NCCL takes one GPU per rank); a one-GPU machine cannot run SyncBatchNorm over NCCL.
  # P 1 is accepted and is the plain DDP path (app/trainer.cpp: the pipeline needs P > 1, and
  # P > 1 needs one GPU per rank); the one-GPU pipeline itself is ctest's PipelineOneGpu cases.
  "cnn-pipeline-p1|extra|60|--model cnn --epochs 1 --train-limit 20000 --pipeline-stages 1 --data DATA"
  "mlp-tf32|extra|60|--model mlp --epochs 1 --tf32 --data DATA"
  "mlp-launch|extra|60|LAUNCH --model mlp --epochs 1 --data DATA"
)
runs=()
want train && runs+=("${fmnist_runs[@]}" "${gpt_runs[@]}")
want extra && runs+=("${extra_runs[@]}")

ctest_timeout=180
build_timeout=420
targets=(dtrain dtrain-launch dtrain_cuda dtrain_nccl dtrain_gpu_tests mpi_gpu_nccl_communicator
         mpi_gpu_pipeline_nccl dtrain_gpu_nccl_watchdog)

if [ "$dry" = 1 ]; then
  echo "gpu_session plan (budget ${budget} s, build dir $build, output $out):"
  want build && echo "  build  cmake Release -DDTRAIN_CUDA=ON -DDTRAIN_CUDA_ARCHS=90; targets ${targets[*]} (timeout ${build_timeout} s)"
  want ctest && echo "  ctest  ctest -L gpu --output-on-failure (timeout ${ctest_timeout} s)"
  for r in "${runs[@]}"; do
    IFS='|' read -r name stage tmo flags <<<"$r"
    prog="dtrain train"
    [[ "$flags" == LAUNCH* ]] && { prog="dtrain-launch -n 1 --gpus-per-node 1 -- dtrain train"; flags=${flags#LAUNCH }; }
    printf '  %-6s %-16s timeout %3s s: %s --device cuda %s\n' "$stage" "$name" "$tmo" "$prog" "$flags"
  done
  echo "  then   $out/summary.md (a row per step) and $out/logs/"
  exit 0
fi

# Data made here (token shards, synthetic images: tens of MB) stays out of $OUT, which comes back.
work=$build/session-data
mkdir -p "$logs" "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$SECONDS
failures=0
rows=()
note() { echo "gpu_session: $*"; echo "- $*" >>"$out/notes.md"; }
: >"$out/notes.md"
left() { echo $((budget - (SECONDS - start))); }
# row STEP FLAGS THROUGHPUT QUALITY STATUS SECONDS
row() { rows+=("| $1 | \`$2\` | $3 | $4 | $5 | $6 |"); echo "gpu_session: $1: $5 ($6 s)"; }
# fits WANTED: the timeout a step gets, at most what is left of the budget less 5 s; 0 when
# fewer than 15 s would be left (not worth starting).
fits() { local l=$(($(left) - 5)); [ "$l" -lt 15 ] && { echo 0; return; }; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }

write_summary() {
  {
    echo "# GPU session $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Machine: ${gpu_line:-no GPU visible}; $(nproc) CPU cores; commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown); budget ${budget} s, used $((SECONDS - start)) s"
    echo
    echo "| step | flags | samples/s or tokens/s | test accuracy / val loss | status | seconds |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Notes:"
    cat "$out/notes.md"
    echo
    echo "Logs: logs/<step>.log; exit status $([ "$failures" -eq 0 ] && echo 0 || echo 1) ($failures failure(s))."
  } >"$out/summary.md"
}
trap write_summary EXIT

gpu_line=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
[ -n "$gpu_line" ] || note "no GPU visible (nvidia-smi lists none): GPU tests skip and training runs are recorded as 'no GPU'"

# --- Prerequisites: one line naming what is missing (no apt here: the machine may be offline).
cuda_root=${CUDA_HOME:-/usr/local/cuda}
missing=()
[ -x "$cuda_root/bin/nvcc" ] || missing+=("nvcc ($cuda_root/bin/nvcc)")
[ -e "$cuda_root/include/nccl.h" ] || [ -e "${NCCL_HOME:-/nonexistent}/include/nccl.h" ] || [ -e /usr/include/nccl.h ] ||
  missing+=("NCCL (nccl.h under $cuda_root/include, \$NCCL_HOME or /usr/include)")
if command -v dpkg-query >/dev/null; then
  while read -r p; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done < <(sh scripts/packages.sh build)
else
  for c in cmake g++ mpirun; do command -v "$c" >/dev/null || missing+=("$c"); done
fi
[ ${#missing[@]} -eq 0 ] || note "missing build prerequisites: ${missing[*]} (scripts/packages.txt, group build; this script installs nothing)"

# --- Build: only the programs and the binaries `ctest -L gpu` runs.
built=1
if want build; then
  t=$(fits "$build_timeout")
  if [ "$t" = 0 ]; then row build "" "" "" "skipped: budget" 0; built=0
  else
    s=$SECONDS
    launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    rc=0
    { timeout "$t" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_CUDA=ON -DDTRAIN_CUDA_ARCHS=90 "${launcher[@]}" &&
      timeout $((t - (SECONDS - s) > 1 ? t - (SECONDS - s) : 1)) cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"; } >"$logs/build.log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then row build "cuda archs 90, ${#targets[@]} targets" "" "" passed $((SECONDS - s))
    else
      built=0; failures=$((failures + 1))
      what="failed (exit $rc)"; [ "$rc" -eq 124 ] && what="timed out"
      [ ${#missing[@]} -eq 0 ] || what="$what; missing: ${missing[*]}"
      row build "" "" "" "$what" $((SECONDS - s))
      if [ "$rc" -eq 124 ]; then
        note "build: timed out after $t s at $(grep -oE '^\[ *[0-9]+%\]' "$logs/build.log" | tail -1 || true) (logs/build.log)"
      else
        note "build: $(grep -m1 -E 'error:|CMake Error|Could NOT find|No such file' "$logs/build.log" || tail -1 "$logs/build.log")"
      fi
    fi
  fi
fi
if [ ! -x "$dtrain" ]; then
  if [ "$built" = 1 ] && { [ ${#runs[@]} -gt 0 ] || want ctest; }; then
    note "no $dtrain: ctest and the training runs need the build stage (--only build,...) first"
    failures=$((failures + 1))
  fi
  built=0
fi

# --- ctest -L gpu
if want ctest; then
  t=$(fits "$ctest_timeout")
  if [ "$built" = 0 ]; then row "ctest -L gpu" "" "" "" "skipped: no build" 0
  elif [ "$t" = 0 ]; then row "ctest -L gpu" "" "" "" "skipped: budget" 0; note "ctest -L gpu skipped: budget spent"
  else
    s=$SECONDS; rc=0
    (cd "$build" && timeout "$t" ctest -L gpu --output-on-failure --timeout 150) >"$logs/ctest-gpu.log" 2>&1 || rc=$?
    total=$(grep -oE 'failed out of [0-9]+' "$logs/ctest-gpu.log" | tail -1 | grep -oE '[0-9]+$' || true)
    nfail=$(grep -oE '[0-9]+ tests failed out of' "$logs/ctest-gpu.log" | tail -1 | grep -oE '^[0-9]+' || true)
    nskip=$(grep -cE '\*\*\*Skipped|Not Run' "$logs/ctest-gpu.log" || true)
    line="no CTest summary (logs/ctest-gpu.log)"
    [ -n "$total" ] && line="$total tests: $((total - ${nfail:-0} - nskip)) passed, $nskip skipped, ${nfail:-0} failed"
    if [ "$rc" -eq 0 ]; then st=passed; else failures=$((failures + 1)); st="failed (exit $rc)"; [ "$rc" -eq 124 ] && st="timed out"; fi
    row "ctest -L gpu" "--output-on-failure" "" "$line" "$st" $((SECONDS - s))
    failed=$(sed -n '/The following tests FAILED/,$p' "$logs/ctest-gpu.log" | grep -E '^[[:space:]]+[0-9]+ - ' |
             sed -E 's/^[[:space:]]+[0-9]+ - //' | tr '\n' ';' || true)
    [ -z "$failed" ] || note "ctest -L gpu failed: ${failed%;}"
    [ -n "$gpu_line" ] || note "ctest -L gpu without a GPU: every case skips (the reasons are in logs/ctest-gpu.log)"
  fi
fi

# --- Data: Fashion-MNIST where installed, else a small synthetic IDX set; byte shards for the GPT.
data=${DTRAIN_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
make_synthetic_idx() {  # DIR: 6000 train and 1000 test 28x28 images, labels 0-9 (IDX, as tests do)
  python3 - "$1" <<'EOF'
import os, random, struct, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True); rng = random.Random(0)
for split, n in (("train", 6000), ("t10k", 1000)):
    labels = bytes(rng.randrange(10) for _ in range(n))
    # Each class a brighter band at its own rows, so a model can learn something.
    imgs = bytearray(rng.randrange(64) for _ in range(n * 784))
    for i, y in enumerate(labels):
        for p in range(y * 78, y * 78 + 78): imgs[i * 784 + p] = 200
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + labels)
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(imgs))
EOF
}
need_data=0; need_shards=0; shards=$work/shards
for r in "${runs[@]}"; do [[ "$r" == *DATA* ]] && need_data=1; [[ "$r" == *SHARDS* ]] && need_shards=1; done
if [ ${#runs[@]} -gt 0 ] && [ "$built" = 1 ]; then
  if [ "$need_data" = 1 ] && [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
    if make_synthetic_idx "$work/synthetic-idx" >"$logs/data.log" 2>&1; then
      note "Fashion-MNIST not at $data: image runs use a synthetic IDX set (6000/1000 samples), so their accuracies mean nothing"
      data=$work/synthetic-idx
    else
      note "Fashion-MNIST not at $data and no python3 for a synthetic set: image runs will fail (logs/data.log)"
    fi
  fi
  if [ "$need_shards" = 1 ]; then
    text=$(ls -d /usr/lib/python3.* 2>/dev/null | head -1 || true)
    [ -n "$text" ] || { text=$root; note "no /usr/lib/python3.*: GPT shards made from this repository's sources"; }
    "$dtrain" data shard --bytes "$text" -o "$shards" >"$logs/shards.log" 2>&1 ||
      note "dtrain data shard --bytes $text failed: $(tail -1 "$logs/shards.log")"
  fi
fi

# --- Training runs, one at a time (one GPU); each under timeout, never past the budget.
json_field() { grep -o "\"$1\":[-0-9.eE+]*" "$2" | tail -1 | cut -d: -f2 || true; }
for r in "${runs[@]}"; do
  IFS='|' read -r name stage tmo flags <<<"$r"
  flags=${flags//DATA/$data}; flags=${flags//SHARDS/$shards}
  shown=${flags//$root\//}; shown=${shown/#LAUNCH /dtrain-launch -n 1 -- }
  if [ "$built" = 0 ]; then row "$name" "$shown" "" "" "skipped: no build" 0; continue; fi
  t=$(fits "$tmo")
  if [ "$t" = 0 ]; then row "$name" "$shown" "" "" "skipped: budget" 0; note "$name skipped: budget spent ($(left) s left)"; continue; fi
  cmd=("$dtrain" train)
  if [[ "$flags" == LAUNCH* ]]; then cmd=("$launch" -n 1 --gpus-per-node 1 -- "$dtrain" train); flags=${flags#LAUNCH }; fi
  # shellcheck disable=SC2206  # the flags are words by design
  cmd+=(--device cuda --json --log-interval 50 --progress off $flags)
  s=$SECONDS; rc=0
  echo "+ ${cmd[*]}" >"$logs/$name.log"
  timeout "$t" "${cmd[@]}" >>"$logs/$name.log" 2>&1 || rc=$?
  secs=$((SECONDS - s))
  rate=$(json_field samples_per_s "$logs/$name.log"); unit=samples/s
  [ -n "$rate" ] || { rate=$(json_field tokens_per_s "$logs/$name.log"); unit=tokens/s; }
  [ -n "$rate" ] && rate="$(printf '%.0f' "$rate") $unit"
  q=$(json_field test_acc "$logs/$name.log"); [ -n "$q" ] && q="acc $(printf '%.4f' "$q")"
  [ -n "$q" ] || { q=$(json_field val_loss "$logs/$name.log"); [ -n "$q" ] && q="val loss $(printf '%.4f' "$q")"; }
  if [ "$rc" -eq 0 ]; then st=passed
  elif grep -q "no CUDA device visible" "$logs/$name.log"; then st="no GPU"
  elif [ "$rc" -eq 124 ]; then st="timed out after $t s"; failures=$((failures + 1))
  else st="failed (exit $rc): $(grep -m1 'error' "$logs/$name.log" | cut -c1-120 || true)"; failures=$((failures + 1))
  fi
  row "$name" "$shown" "${rate:-}" "${q:-}" "$st" "$secs"
done

echo "gpu_session: $failures failure(s) in $((SECONDS - start)) s; summary: $out/summary.md"
[ "$failures" -eq 0 ]
