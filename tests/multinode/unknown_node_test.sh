#!/usr/bin/env bash
# The bed has no hole (issue 19 item 14): a node that does not exist, a bed that does not exist,
# or a name that is a path is refused, with one line and a non-zero exit, by every subcommand
# that resolves one (exec, rsh, the rsh agent mpirun runs, down) before anything runs: the
# command never runs outside the bed. dtrain-launch --hosts nodeA:1,nodeZ:1 inside the bed fails
# with one line naming nodeZ and trains nothing (it used to put both ranks on nodeA, exit 0).
#   unknown_node_test.sh PATH/TO/testbed.sh PATH/TO/dtrain-launch PATH/TO/dtrain
set -uo pipefail

testbed=${1:?usage: unknown_node_test.sh TESTBED DTRAIN_LAUNCH DTRAIN}
launch=${2:?usage: unknown_node_test.sh TESTBED DTRAIN_LAUNCH DTRAIN}
dtrain=${3:?usage: unknown_node_test.sh TESTBED DTRAIN_LAUNCH DTRAIN}
readonly STATE_ROOT=/run/dtrain-testbed
readonly DATA=${DTRAIN_E2E_DATA:-/usr/share/datasets/fashion-mnist}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0

if ! reason=$("$testbed" check 2>&1); then echo "SKIPPED: $reason"; exit 77; fi

ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name" "failed: $*"; fi; }

bed="tbu$$"
work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain_unknown_node.XXXXXX")
trap '"$testbed" down "$bed" 2>/dev/null; rm -rf "$work"' EXIT
if ! "$testbed" up --nodes 2 --name "$bed" >/dev/null 2>"$work/up.err"; then
  echo "not ok - testbed.sh up: $(cat "$work/up.err")"
  exit 1
fi
agent="$STATE_ROOT/$bed/rsh"

# refused LABEL COMMAND... MARKER: COMMAND (whose last word is a file it would create) exits
# non-zero, says why in one line, and the file does not exist.
n=0
refused() {
  local label=$1 status=0 marker=${*: -1}
  shift
  n=$((n + 1))
  "$@" >"$work/out.$n" 2>"$work/err.$n" || status=$?
  check "$label: exits non-zero (was $status)" [ "$status" -ne 0 ]
  check "$label: runs nothing" [ ! -e "$marker" ]
  check "$label: one line on stderr ($(head -c 200 "$work/err.$n" | tr '\n' '|'))" \
    [ "$(wc -l <"$work/err.$n")" = 1 ]
}

# (a) and (b): every way of naming a node, and a bed, that does not exist or is a path.
refused "exec BED nodeZ" "$testbed" exec "$bed" nodeZ -- touch "$work/m1"
refused "exec BED nodeC (no --)" "$testbed" exec "$bed" nodeC touch "$work/m2"
refused "exec BED ../nodes (a path)" "$testbed" exec "$bed" ../nodes -- touch "$work/m3"
refused "exec BED nodeA/../nodeA (a path)" "$testbed" exec "$bed" nodeA/../nodeA -- touch "$work/m4"
refused "exec NOBED nodeA" "$testbed" exec "${bed}none" nodeA -- touch "$work/m5"
refused "exec ../dtrain-testbed/BED nodeA (a path)" "$testbed" exec "../dtrain-testbed/$bed" nodeA -- touch "$work/m6"
refused "rsh BED nodeZ" "$testbed" rsh "$bed" nodeZ touch "$work/m7"
refused "rsh NOBED nodeA" "$testbed" rsh "${bed}none" nodeA touch "$work/m8"
refused "the bed's rsh agent, nodeZ" "$agent" nodeZ touch "$work/m9"
refused "the bed's rsh agent, an option as the node" "$agent" -x touch "$work/m10"

# The known nodes still work, through exec and through the agent.
check "exec BED nodeB still runs in nodeB" [ "$("$testbed" exec "$bed" nodeB -- hostname)" = nodeB ]
check "the agent still reaches nodeB" [ "$("$agent" nodeB hostname)" = nodeB ]

# (c): dtrain-launch with a node that is not in the bed.
if [ ! -e "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -e "$DATA/train-images-idx3-ubyte" ]; then
  echo "ok - dtrain-launch --hosts nodeA:1,nodeZ:1 # SKIP Fashion-MNIST not installed at $DATA"
else
  status=0
  timeout --kill-after=5 90 "$testbed" exec "$bed" nodeA -- "$launch" --hosts nodeA:1,nodeZ:1 \
    --iface 198.18.0.0/24 --start-timeout 60 -- "$dtrain" train --data "$DATA" --threads 1 \
    --train-limit 200 --test-limit 100 --epochs 1 --log-interval 1 >"$work/launch.out" 2>"$work/launch.err" || status=$?
  echo "# dtrain-launch printed:"; sed 's/^/#   /' "$work/launch.out" "$work/launch.err"
  check "dtrain-launch --hosts nodeA:1,nodeZ:1: exits non-zero (was $status)" [ "$status" -ne 0 ]
  # shellcheck disable=SC2016  # $1 is sh's
  check "and not by the 90 s timeout" sh -c '[ "$1" -ne 124 ] && [ "$1" -ne 137 ]' sh "$status"
  check "one line names nodeZ as unknown" [ "$(grep -c "no node 'nodeZ'" "$work/launch.err")" = 1 ]
  check "no Open MPI banner (at most that line and dtrain-launch's own)" [ "$(wc -l <"$work/launch.err")" -le 2 ]
  check "nothing trained" sh -c "! grep -qE 'Train Epoch|Test set' '$work/launch.out' '$work/launch.err'"
fi

# Last, as it would remove the bed on the old script: down with a name that is a path.
status=0
"$testbed" down "../dtrain-testbed/$bed" 2>"$work/down.err" || status=$?
check "down ../dtrain-testbed/BED (a path): exits non-zero (was $status)" [ "$status" -ne 0 ]
check "down ../dtrain-testbed/BED: the bed is still there" [ -f "$STATE_ROOT/$bed/nodes" ]
status=0
"$testbed" down "${bed}none" 2>/dev/null || status=$?
check "down NOBED: exits non-zero" [ "$status" -ne 0 ]

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
