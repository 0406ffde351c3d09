#!/usr/bin/env bash
# `dtrain checkpoint consolidate DIR [-o FILE]` (Note [Sharded optimizer state]): the optimizer
# state of a checkpoint saved in 3 shards becomes one file with the same bytes as the unsharded
# save of the same state writes; DIR may be the checkpoint or its folder (latest); an unsharded or
# a damaged checkpoint is refused with one line and the contract's status (core/exit_status.h).
#   consolidate_test.sh PATH/TO/dtrain PATH/TO/dtrain_checkpoint_tool
set -uo pipefail
DTRAIN=$(realpath -e "${1:?usage: consolidate_test.sh PATH/TO/dtrain PATH/TO/dtrain_checkpoint_tool}") || exit 1
TOOL=$(realpath -e "${2:?usage: consolidate_test.sh PATH/TO/dtrain PATH/TO/dtrain_checkpoint_tool}") || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_consolidate.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0
ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }

"$TOOL" save "$WORK/whole" 12 1001 && "$TOOL" save-sharded "$WORK/sharded" 12 1001 3 || { echo "cannot make the checkpoints"; exit 1; }
ls "$WORK/sharded/step-12" | grep -q "optimizer-rank2-of-3.safetensors" && ok "3 shard files" \
  || not_ok "3 shard files" "$(ls "$WORK/sharded/step-12")"

for dir in "$WORK/sharded" "$WORK/sharded/step-12"; do
  out=$WORK/out-$(basename "$dir").safetensors
  if "$DTRAIN" checkpoint consolidate "$dir" -o "$out" >"$WORK/c.out" 2>"$WORK/c.err"; then
    cmp -s "$out" "$WORK/whole/step-12/optimizer.safetensors" && ok "consolidate $dir: the unsharded save's bytes" \
      || not_ok "consolidate $dir" "bytes differ from the unsharded optimizer.safetensors"
    [ "$(wc -l <"$WORK/c.out")" = 1 ] && grep -q "from 3 shards: 2 tensors, 0 counts" "$WORK/c.out" \
      && ok "one summary line: $(cat "$WORK/c.out")" || not_ok "summary line" "$(cat "$WORK/c.out" "$WORK/c.err")"
  else
    not_ok "consolidate $dir" "$(cat "$WORK/c.err")"
  fi
done
(cd "$WORK" && "$DTRAIN" checkpoint consolidate sharded >/dev/null 2>&1) && cmp -s "$WORK/optimizer.safetensors" \
  "$WORK/whole/step-12/optimizer.safetensors" && ok "default output: ./optimizer.safetensors" || not_ok "default output" "missing or different"

# expect_failure NAME STATUS PATTERN ARGS...: one line matching PATTERN on stderr, exit STATUS.
expect_failure() {
  local name=$1 want=$2 pattern=$3 status
  shift 3
  "$DTRAIN" "$@" >"$WORK/f.out" 2>"$WORK/f.err"
  status=$?
  if [ "$status" = "$want" ] && [ "$(wc -l <"$WORK/f.err")" = 1 ] && grep -q -- "$pattern" "$WORK/f.err"; then
    ok "$name: exit $status, $(cat "$WORK/f.err")"
  else
    not_ok "$name" "exit $status (want $want): $(cat "$WORK/f.err")"
  fi
}
expect_failure "an unsharded checkpoint" 2 "the optimizer state is not sharded" checkpoint consolidate "$WORK/whole" -o "$WORK/x"
truncate -s 100 "$WORK/sharded/step-12/optimizer-rank1-of-3.safetensors"
expect_failure "a damaged shard" 66 "optimizer-rank1-of-3.safetensors: 100 bytes, state.json records" \
  checkpoint consolidate "$WORK/sharded" -o "$WORK/x"
[ ! -e "$WORK/x" ] && ok "nothing written on failure" || not_ok "nothing written on failure" "$WORK/x exists"
expect_failure "no folder" 66 "no such checkpoint directory" checkpoint consolidate "$WORK/none"
expect_failure "no DIR" 2 "expected one checkpoint folder" checkpoint consolidate
expect_failure "another subcommand" 2 "checkpoint: expected 'consolidate'" checkpoint merge "$WORK/sharded"
"$DTRAIN" checkpoint consolidate --help >"$WORK/help" 2>&1 && grep -q "dtrain checkpoint consolidate \[OPTION...\] DIR" "$WORK/help" \
  && ok "--help" || not_ok "--help" "$(cat "$WORK/help")"
exit $((failures > 0))
