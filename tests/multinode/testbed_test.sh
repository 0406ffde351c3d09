#!/usr/bin/env bash
# The test bed's own rules (scripts/testbed.sh): the caller's network namespace is never touched;
# every node has its own hostname and address and no route off the bed's /24; two beds can exist
# at once; a bed is torn down, with every process left in it, when its command ends, fails, is
# signalled or runs past --timeout, and a
# bed whose owner was SIGKILLed is removed by the next run; --rate shapes both ends of every
# link (or says why not); where beds cannot be made the script says why and exits 77 (skipped).
#   testbed_test.sh PATH/TO/testbed.sh
set -uo pipefail

testbed=${1:?usage: testbed_test.sh PATH/TO/testbed.sh}
readonly STATE_ROOT=/run/dtrain-testbed
prefix="tbt$$"
failures=0

if ! reason=$("$testbed" check 2>&1); then echo "SKIPPED: $reason"; exit 77; fi

ok() { echo "ok - $1"; }
not_ok() { echo "not ok - $1: $2"; failures=$((failures + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name" "failed: $*"; fi; }

# What a bed could disturb in the caller's namespace: interfaces, addresses, routes.
root_network() { ip -o link | awk '{print $2}'; ip -o addr | awk '{print $2, $4}'; ip route; }

# Nothing of bed NAME remains: no namespace, no state directory.
bed_gone() {
  ! ip netns list | grep -q "^$1-" && [ ! -e "$STATE_ROOT/$1" ]
}

wait_for() {  # up to 10 s for "$@" to succeed
  local i
  for ((i = 0; i < 100; i++)); do "$@" && return 0; sleep 0.1; done
  return 1
}

test_root_namespace_untouched_and_nodes() {
  local before during after name="${prefix}up" node i=0
  before=$(root_network)
  if ! "$testbed" up --nodes 3 --name "$name" >/dev/null 2>&1; then not_ok "up" "testbed.sh up failed"; return; fi
  during=$(root_network)
  for node in nodeA nodeB nodeC; do
    i=$((i + 1))
    check "$node has its hostname" [ "$("$testbed" exec "$name" "$node" -- hostname)" = "$node" ]
    check "$node has 198.18.0.$i on eth0" \
      [ "$("$testbed" exec "$name" "$node" -- ip -o -4 addr show dev eth0 | awk '{print $4}')" = "198.18.0.$i/24" ]
    check "$node has no route off the bed" \
      [ "$("$testbed" exec "$name" "$node" -- ip route)" = "198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.$i " ]
  done
  "$testbed" down "$name" 2>/dev/null
  after=$(root_network)
  check "the caller's namespace is untouched while a bed is up" [ "$before" = "$during" ]
  check "the caller's namespace is untouched after down" [ "$before" = "$after" ]
  check "down removes every namespace and the state" bed_gone "$name"
}

test_two_beds_at_once() {
  "$testbed" run --name "${prefix}p1" -- sleep 1 & local a=$!
  "$testbed" run --name "${prefix}p2" -- sleep 1 & local b=$!
  local sa=0 sb=0
  wait "$a" || sa=$?
  wait "$b" || sb=$?
  check "two beds side by side both run" [ "$sa.$sb" = "0.0" ]
  check "both are torn down" bed_gone "${prefix}p1"
  check "both are torn down (2)" bed_gone "${prefix}p2"
}

test_teardown_on_failure() {
  local status=0 name="${prefix}fail"
  "$testbed" run --name "$name" -- sh -c 'exit 3' 2>/dev/null || status=$?
  check "run passes the command's exit status on" [ "$status" = 3 ]
  check "a failing command's bed is torn down" bed_gone "$name"
}

test_teardown_on_signal() {
  local status=0 name="${prefix}sig" marker
  marker=$(mktemp)
  "$testbed" run --name "$name" -- sh -c "echo \$\$ > $marker; exec sleep 300" 2>/dev/null &
  local runner=$!
  wait_for test -s "$marker"
  local sleeper
  sleeper=$(cat "$marker")
  kill -TERM "$runner"
  wait "$runner" || status=$?
  check "SIGTERM ends run with 130" [ "$status" = 130 ]
  check "a signalled bed is torn down" bed_gone "$name"
  check "the command inside it is ended" wait_for sh -c "! kill -0 $sleeper 2>/dev/null"
  rm -f "$marker"
}

# A process the command leaves running on another node (as an orphaned orted would be) is
# ended with the bed.
test_no_process_left_behind() {
  local status=0 name="${prefix}orphan" marker
  marker=$(mktemp)
  # Through the rsh agent, a sleep on nodeB outlives the shell that started it.
  local leave_one='"$DTRAIN_TESTBED_RSH" nodeB "sh -c '\''echo \$\$ > $1; exec sleep 300'\'' >/dev/null 2>&1 &"
                   while [ ! -s "$1" ]; do sleep 0.1; done'
  "$testbed" run --name "$name" -- sh -c "$leave_one" sh "$marker" 2>/dev/null || status=$?
  check "a command that leaves a process behind succeeds" [ "$status" = 0 ]
  check "the left-behind process had started" test -s "$marker"
  check "and is ended with the bed" wait_for sh -c "! kill -0 $(cat "$marker" 2>/dev/null || echo 0) 2>/dev/null"
  check "whose namespaces are gone" bed_gone "$name"
  rm -f "$marker"
}

test_teardown_on_timeout() {
  local status=0 name="${prefix}tmo"
  "$testbed" run --name "$name" --timeout 1 -- sleep 300 2>/dev/null || status=$?
  check "--timeout stops the command (124)" [ "$status" = 124 ]
  check "a timed-out bed is torn down" bed_gone "$name"
}

test_sigkilled_owner_is_reaped() {
  local name="${prefix}k9"
  "$testbed" run --name "$name" -- sleep 300 2>/dev/null &
  local runner=$!
  wait_for test -e "$STATE_ROOT/$name/owner"
  wait_for sh -c "ip netns pids $name-nodeA | grep -q ."
  kill -KILL "$runner"
  wait "$runner" 2>/dev/null
  check "a SIGKILLed owner's bed is still there (no trap can run)" test -d "$STATE_ROOT/$name"
  "$testbed" run -- true 2>/dev/null
  check "the next run removes it" bed_gone "$name"
}

test_shaping() {
  local name="${prefix}tbf" out
  out=$("$testbed" up --name "$name" --rate 50mbit 2>&1)
  if grep -q "shaping skipped" <<<"$out"; then
    echo "ok - shaping # SKIP $(grep "shaping skipped" <<<"$out")"
  else
    check "--rate puts tbf at 50Mbit on the node's end" \
      sh -c "'$testbed' exec '$name' nodeA -- tc qdisc show dev eth0 | grep -q 'tbf .*rate 50Mbit'"
    check "--rate puts tbf at 50Mbit on the bridge's end" \
      sh -c "ip netns exec '$name-bridge' tc qdisc show dev vnodeB | grep -q 'tbf .*rate 50Mbit'"
  fi
  "$testbed" down "$name" 2>/dev/null
  check "a shaped bed is torn down" bed_gone "$name"
  local status=0
  "$testbed" up --name "${prefix}bad" --rate fast >/dev/null 2>&1 || status=$?
  check "a rate without a unit is refused" [ "$status" = 1 ]
  check "and leaves nothing behind" bed_gone "${prefix}bad"
}

test_skip_without_root() {
  if ! command -v setpriv >/dev/null; then echo "ok - skip path # SKIP setpriv is not installed"; return; fi
  local status=0 out
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all bash "$testbed" run -- true 2>&1) || status=$?
  check "not root: run exits 77 (skipped)" [ "$status" = 77 ]
  check "and says why" grep -q "SKIPPED: network namespaces need root" <<<"$out"
}

test_root_namespace_untouched_and_nodes
test_two_beds_at_once
test_teardown_on_failure
test_teardown_on_signal
test_no_process_left_behind
test_teardown_on_timeout
test_sigkilled_owner_is_reaped
test_shaping
test_skip_without_root
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
