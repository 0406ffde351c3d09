#!/usr/bin/env bash
# --zero 2 in the GPT pipeline (Note [Pipeline ZeRO-1] in app/pipeline_zero.h) at P 2 x D 2
# across the test bed's 2 nodes (2 ranks each: each replica's two stages on one node, each
# stage's two replicas on different nodes, so the tied wte's reduce-scatter and the clipping's
# norm cross the bed's TCP link) against the same job at np 4 on one node (shared memory): the
# same step and val lines and model.safetensors bit for bit. (The tied wte's two copies, bitwise
# equal on every replica across the bed, are mpi_pipeline_gpt_test's ZeroTwo case, which
# multinode_pipeline_gpt_2x2 runs.) Bit for bit only with the same GEMM kernels on every node:
# dtrain-launch forwards OPENBLAS_CORETYPE (without it the ranks started on the bed's nodes chose
# their own, and every tensor differed from the one-node run's: up to 5e-3 relative, more in the
# attention's near-zero key bias).
# Usage: gpt_pipeline_zero2_test.sh ON_TESTBED DTRAIN_LAUNCH DTRAIN
set -uo pipefail
ON_TESTBED=$1 LAUNCH=$2 DTRAIN=$3
E2E_NO_IDX=1
# shellcheck source=../e2e/lib.sh
source "$(dirname "$0")/../e2e/lib.sh"
json_byte_shards "$WORK/shards"
gpt=("${GPT_ZERO_JOB[@]}" "${GPT_PIPE[@]}" --zero 2)

# The bed first: where it cannot be made, skip before the one-node run.
"$ON_TESTBED" 2x2 launch "$LAUNCH" "$DTRAIN" "${gpt[@]}" --checkpoint-dir "$WORK/bed" >"$WORK/bed.log" 2>&1
status=$?
if [ "$status" -eq 77 ]; then
  echo "SKIPPED: $(tail -1 "$WORK/bed.log")"
  exit 77
fi
check "across the bed: --zero 2 at P 2 x D 2 ran (exit $status)" [ "$status" -eq 0 ]
dtrain_at 4 "$WORK/node.log" "${gpt[@]}" --checkpoint-dir "$WORK/node"
check "on one node: --zero 2 at P 2 x D 2 ran" grep -q "^memory per rank: .*(--zero 2 over 2 ranks: " "$WORK/node.log"
check "across the bed: step and val lines the one-node run's" \
  same_nonempty "$(steps_of "$WORK/bed.log")" "$(steps_of "$WORK/node.log")"
check "across the bed: model.safetensors bit for bit the one-node run's" \
  cmp "$WORK/bed/step-20/model.safetensors" "$WORK/node/step-20/model.safetensors"
[ "$failures" -eq 0 ] || tail -20 "$WORK/bed.log"
finish
