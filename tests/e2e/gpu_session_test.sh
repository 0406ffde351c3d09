#!/usr/bin/env bash
# scripts/gpu_session.sh without a GPU and without a CUDA build (label e2e; no device needed):
# the --dry-run plan names every model; a stand-in dtrain (a shell script in a fake build folder)
# makes the training runs fail with "no CUDA device visible" (recorded "no GPU", exit 0), fail
# otherwise (a failure, exit 1) or succeed (rate and accuracy in the summary); a spent budget
# skips the rest with a line. The real CUDA build is never started here.
set -uo pipefail
src=$1
script=$src/scripts/gpu_session.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_gpu_session.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1"; failures=$((failures + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }

plan=$(bash "$script" --dry-run)
echo "$plan"
for model in mlp cnn resnet18 gpt; do
  check "plan trains $model on the GPU in stage train" grep -qE "^  train +$model +timeout .*--device cuda --model $model " <<<"$plan"
done
check "plan runs ctest -L gpu" grep -q "ctest -L gpu" <<<"$plan"
check "plan builds the CUDA variant for sm 90" grep -q -- "-DDTRAIN_CUDA=ON -DDTRAIN_CUDA_ARCHS=90" <<<"$plan"
for flags in "resnet18 .*--amp bf16" "gpt .*--amp bf16" "--pipeline-stages 1"; do
  check "plan has an extra run with $flags" grep -qE -- "^  extra .*$flags" <<<"$plan"
done
check "ctest comes before the first training run" \
  test "$(grep -n 'ctest -L gpu' <<<"$plan" | cut -d: -f1)" -lt "$(grep -n '^  train' <<<"$plan" | head -1 | cut -d: -f1)"
only=$(bash "$script" --dry-run --only ctest,train)
check "--only ctest,train leaves out build and extra" test -z "$(grep -E '^  (build|extra) ' <<<"$only")"
bad=$(bash "$script" --only train,gpus 2>&1); rc=$?
check "an unknown stage: exit 2 and one line naming it" test "$rc" = 2 -a "$(wc -l <<<"$bad")" = 1
check "the line names the stage" grep -q "'gpus'" <<<"$bad"

# A fake build folder: app/dtrain answers as FAKE_MODE says, `data shard` writes nothing needed.
fake=$work/build
mkdir -p "$fake/app" "$fake/launcher"
cat >"$fake/app/dtrain" <<'STUB'
#!/usr/bin/env bash
[ "$1" = data ] && exit 0
case "$FAKE_MODE" in
  nogpu) echo "dtrain: error: device cuda: no CUDA device visible (stand-in)" >&2; exit 1 ;;
  fail) echo "dtrain: error: something else broke (stand-in)" >&2; exit 1 ;;
  ok) echo '{"model":"x","samples_per_s":1234.5,"test_acc":0.875,"train_s":1.0}' ;;
esac
STUB
cp "$fake/app/dtrain" "$fake/launcher/dtrain-launch"
chmod +x "$fake/app/dtrain" "$fake/launcher/dtrain-launch"
run() {  # MODE OUTDIR ARGS...: the script's exit status
  local mode=$1 out=$2; shift 2
  FAKE_MODE=$mode OUT=$out DTRAIN_FMNIST_DIR=$work/no-such-dir bash "$script" --build-dir "$fake" "$@" >"$out.log" 2>&1
}
run nogpu "$work/nogpu" --only train,extra; rc=$?
cat "$work/nogpu.log"
check "no GPU: exit 0" test "$rc" = 0
check "no GPU: every run recorded 'no GPU'" test "$(grep -c '| no GPU |' "$work/nogpu/summary.md")" = 9
check "no GPU: a synthetic IDX set stands in for Fashion-MNIST" test -s "$fake/session-data/synthetic-idx/train-images-idx3-ubyte"
run fail "$work/fail" --only train; rc=$?
check "a run that fails otherwise: exit 1" test "$rc" = 1
check "a run that fails otherwise: its error in the summary" grep -q "| failed (exit 1): dtrain: error: something else broke" "$work/fail/summary.md"
run ok "$work/ok" --only train; rc=$?
check "runs that pass: exit 0" test "$rc" = 0
check "runs that pass: rate and accuracy in the summary" grep -q "| 1234 samples/s | acc 0.8750 | passed |" "$work/ok/summary.md"
run ok "$work/budget" --only train --budget 10; rc=$?
check "a spent budget: exit 0" test "$rc" = 0
check "a spent budget: every run skipped, saying so" test "$(grep -c '| skipped: budget |' "$work/budget/summary.md")" = 4
check "a spent budget: a line per skipped run" test "$(grep -c 'skipped: budget spent' "$work/budget.log")" = 4
FAKE_MODE=ok OUT=$work/none bash "$script" --build-dir "$work/no-build" --only train >"$work/none.log" 2>&1; rc=$?
check "no build and no build stage: exit 1" test "$rc" = 1
check "no build and no build stage: one line saying so" grep -q "need the build stage" "$work/none.log"

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
