#!/usr/bin/env bash
# A multi-node test bed on one Linux machine: N fake nodes (nodeA, nodeB, ...), each a network
# namespace with its own hostname (a UTS namespace) and its own address on a private /24, joined
# by a bridge that lives in a namespace of its own. Nothing in the caller's network namespace is
# touched: no address, route or interface is added there, and the bridge has no uplink, so test
# traffic cannot leave the bed. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ip (iproute2),
# unshare and nsenter (util-linux); tc for --rate.
#
#   testbed.sh run [--nodes N] [--rate RATE] [--timeout S] -- CMD...
#       make a bed, run CMD inside nodeA (a login node that is also a compute node) with the
#       variables below, and tear the bed down however CMD ends (exit, failure, signal, timeout).
#   testbed.sh up [--nodes N] [--rate RATE] [--name NAME]   make a bed and print its variables
#   testbed.sh exec NAME NODE -- CMD...   run CMD inside NODE's namespaces (environment kept)
#   testbed.sh down NAME                  tear a bed down (processes inside it are killed)
#   testbed.sh list                       the beds that exist
#   testbed.sh check                      exit 0 if a bed can be made here, else 77 and the reason
#   testbed.sh rsh NAME NODE CMD...       what mpirun's rsh agent runs (like ssh NODE CMD...)
#
# Variables CMD gets (and `up` prints): DTRAIN_TESTBED (the bed's name), DTRAIN_TESTBED_HOSTS
# ("nodeA nodeB"), DTRAIN_TESTBED_SUBNET (the /24), DTRAIN_TESTBED_RSH (the rsh agent, a file);
# for Open MPI, as a cluster's MCA defaults would: OMPI_MCA_plm_rsh_agent (mpirun reaches the
# other nodes through the agent as it would through ssh), and OMPI_MCA_pml=ob1 with
# OMPI_MCA_btl=tcp,self,vader (shared memory inside a node, TCP between nodes, nothing else).
# The network for TCP and mpirun's out-of-band traffic is the caller's choice, e.g.
#   mpirun --host nodeA:2,nodeB:2 --mca btl_tcp_if_include "$DTRAIN_TESTBED_SUBNET" \
#          --mca oob_tcp_if_include "$DTRAIN_TESTBED_SUBNET" ...
#   dtrain-launch --hosts nodeA:2,nodeB:2 --iface "$DTRAIN_TESTBED_SUBNET" -- dtrain train ...
# An agent, like ssh, starts commands with a fresh environment: ranks on other nodes see only
# what mpirun passes them (OMPI_MCA_* and -x VAR).
#
# --rate RATE shapes every node's link in both directions with a token bucket (tc tbf; RATE as
# tc writes it: 10gbit, 500mbit); where tbf cannot be set up, the bed is made unshaped and the
# reason is printed. A bed made by `run` records its owner process; a later `up`/`run` removes
# beds whose owner died without cleaning up (killed by SIGKILL, for instance).
#
# A bed or node name that does not exist (or is not a plain name: no paths) is refused with one
# line and exit status 1 before anything runs, by exec, rsh (so mpirun fails to reach an unknown
# host) and down alike: a command meant for the bed never runs outside it.
set -euo pipefail

readonly STATE_ROOT=/run/dtrain-testbed
# 198.18.0.0/15 is reserved for network benchmark tests (RFC 2544). Each bed has its own
# namespaces, so beds existing side by side may all use the same /24 without meeting.
readonly SUBNET_PREFIX=198.18.0
readonly SUBNET="$SUBNET_PREFIX.0/24"
readonly SKIP=77  # CTest's SKIP_RETURN_CODE for the multinode tests

say() { echo "testbed: $*" >&2; }
die() { say "$*"; exit 1; }
script_path() { cd "$(dirname "${BASH_SOURCE[0]}")" && echo "$PWD/$(basename "${BASH_SOURCE[0]}")"; }

readonly LETTERS=ABCDEFGHIJKLMNOPQRSTUVWXYZ
node_name() { echo "node${LETTERS:$1:1}"; }  # 0 -> nodeA
netns_of() { echo "$1-$2"; }  # bed, node (or "bridge")

# A bed's name is a directory under $STATE_ROOT and the prefix of its namespaces' names, so it
# must be a plain name: no '/', and no leading '.' (which would allow '.' and '..').
valid_bed_name() { [[ "$1" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]]; }

# The checks below die, so they must run in the calling shell, never inside $(...) or <(...):
# there `die` would end only the subshell and the caller would go on (with nsenter given no
# namespace at all, CMD would run outside the bed).
require_bed() {  # NAME: an existing bed (possibly half made or half torn down)
  valid_bed_name "$1" || die "'$1' is not a test bed name (letters, digits, '.', '_' and '-'; no leading '.')"
  [ -d "$STATE_ROOT/$1" ] || die "no test bed named '$1'"
}

require_node() {  # NAME NODE: NODE is one of the bed's nodes
  require_bed "$1"
  local dir="$STATE_ROOT/$1"
  if ! [[ "$2" =~ ^node[A-Z]$ ]] || ! grep -qxF -- "$2" "$dir/nodes" 2>/dev/null || [ ! -f "$dir/uts/$2" ]; then
    die "test bed '$1' has no node '$2' (nodes: $(bed_hosts "$1"))"
  fi
}

bed_hosts() { [ ! -f "$STATE_ROOT/$1/nodes" ] || tr '\n' ' ' <"$STATE_ROOT/$1/nodes" | sed 's/ $//'; }

# Why a bed cannot be made here (empty when it can). Makes and removes a scratch namespace
# with a bridge and a veth pair, so kernel support is tested, not guessed.
cannot_make_bed() {
  local tool
  for tool in ip unshare nsenter; do
    command -v "$tool" >/dev/null || { echo "'$tool' is not installed (iproute2 / util-linux)"; return; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "network namespaces need root (running as uid $(id -u))"; return; }
  local probe="dtbprobe-$$-$RANDOM" err
  if ! err=$(ip netns add "$probe" 2>&1); then echo "cannot create a network namespace: $err"; return; fi
  if ! err=$( { ip -n "$probe" link add pbr type bridge && ip -n "$probe" link add pa type veth peer name pb; } 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "cannot create a bridge or veth pair: $err"
    return
  fi
  ip netns del "$probe"
  local uts_probe
  uts_probe=$(mktemp -p "${TMPDIR:-/tmp}" dtbprobe.XXXXXX)
  if ! err=$(unshare --uts="$uts_probe" true 2>&1); then
    rm -f "$uts_probe"
    echo "cannot keep a UTS namespace (unshare --uts=FILE): $err"
    return
  fi
  umount "$uts_probe" && rm -f "$uts_probe"
}

# Owner of an ephemeral bed: "pid starttime", so a recycled pid is not mistaken for the owner.
process_identity() { echo "$1 $(cut -d' ' -f22 "/proc/$1/stat" 2>/dev/null || echo gone)"; }

reap_orphans() {
  local dir owner
  for dir in "$STATE_ROOT"/*/; do
    [ -f "$dir/owner" ] || continue
    owner=$(cat "$dir/owner")
    if [ "$(process_identity "${owner%% *}")" != "$owner" ]; then
      say "removing $(basename "$dir"), left behind by process ${owner%% *}"
      teardown "$(basename "$dir")"
    fi
  done
}

# tbf on one interface inside one namespace: a 10 ms bucket (at least 64 KiB, a GSO packet).
shape_link() {
  local ns=$1 dev=$2 rate=$3 burst
  burst=$(rate_bytes_per_s "$rate") || return  # (checked by parse_bed_flags already)
  burst=$(( burst / 100 > 65536 ? burst / 100 : 65536 ))
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
}

# "10gbit" -> bytes per second (tc's units: bit, kbit, mbit, gbit, tbit; bps, kbps, ... bytes).
rate_bytes_per_s() {
  local rate=${1,,} number unit
  number=${rate%%[a-z]*}
  unit=${rate#"$number"}
  [[ "$number" =~ ^[0-9]+$ ]] || die "--rate: '$1' is not a rate like 10gbit or 500mbit"
  case "$unit" in
    bit) echo $(( number / 8 )) ;;  kbit) echo $(( number * 125 )) ;;
    mbit) echo $(( number * 125000 )) ;;  gbit) echo $(( number * 125000000 )) ;;
    tbit) echo $(( number * 125000000000 )) ;;
    bps) echo "$number" ;;  kbps) echo $(( number * 1000 )) ;;  mbps) echo $(( number * 1000000 )) ;;
    gbps) echo $(( number * 1000000000 )) ;;
    *) die "--rate: '$1' has no unit tc knows (bit, kbit, mbit, gbit, tbit, bps, kbps, mbps, gbps)" ;;
  esac
}

make_bed() {
  local name=$1 nodes=$2 rate=$3 owner=$4 dir="$STATE_ROOT/$1" i node ns bridge
  mkdir -p "$dir/uts"
  [ -z "$owner" ] || echo "$owner" >"$dir/owner"
  bridge=$(netns_of "$name" bridge)
  ip netns add "$bridge"
  echo "$bridge" >>"$dir/namespaces"
  ip -n "$bridge" link add br0 type bridge
  ip -n "$bridge" link set br0 up
  for ((i = 0; i < nodes; i++)); do
    node=$(node_name "$i")
    ns=$(netns_of "$name" "$node")
    ip netns add "$ns"
    echo "$ns" >>"$dir/namespaces"
    ip -n "$ns" link set lo up
    # The pair is made in the bridge's namespace and one end moved into the node's: the
    # caller's namespace never holds either end.
    ip -n "$bridge" link add "v$node" type veth peer name eth0 netns "$ns"
    ip -n "$bridge" link set "v$node" master br0 up
    ip -n "$ns" addr add "$SUBNET_PREFIX.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    touch "$dir/uts/$node"
    unshare --uts="$dir/uts/$node" hostname "$node"
    echo "$node" >>"$dir/nodes"
  done
  make_rsh_agent "$dir" "$name"
  if [ -n "$rate" ]; then shape_bed "$name" "$rate"; fi
}

shape_bed() {
  local name=$1 rate=$2 node err="" dir="$STATE_ROOT/$1"
  command -v tc >/dev/null || { say "shaping skipped: 'tc' is not installed (iproute2)"; return; }
  while read -r node; do
    err=$( { shape_link "$(netns_of "$name" "$node")" eth0 "$rate" &&
             shape_link "$(netns_of "$name" bridge)" "v$node" "$rate"; } 2>&1) || break
  done <"$dir/nodes"
  if [ -n "$err" ]; then
    say "shaping skipped: tc tbf is not available here: $err"
    while read -r node; do
      tc -n "$(netns_of "$name" "$node")" qdisc del dev eth0 root 2>/dev/null || true
      tc -n "$(netns_of "$name" bridge)" qdisc del dev "v$node" root 2>/dev/null || true
    done <"$dir/nodes"
    return
  fi
  echo "$rate" >"$dir/rate"
}

# The rsh agent mpirun calls as `AGENT NODE COMMAND...`; one file per bed so that it carries
# the bed's name (Open MPI's plm_rsh_agent is split on spaces: no arguments can be added).
make_rsh_agent() {
  local dir=$1 name=$2
  printf '#!/bin/sh\n# rsh agent for test bed %s (made by %s)\nexec %q rsh %q "$@"\n' \
    "$name" "$(script_path)" "$(script_path)" "$name" >"$dir/rsh"
  chmod +x "$dir/rsh"
}

bed_namespaces() { [ ! -f "$1/namespaces" ] || cat "$1/namespaces"; }

# Kills what runs inside the bed's namespaces, then removes mounts, namespaces and state.
# Safe to run twice and on a half-made bed.
teardown() {
  local name=$1 dir="$STATE_ROOT/$1" ns pids sig node
  [ -d "$dir" ] || return 0
  for sig in TERM KILL; do
    pids=""
    while read -r ns; do pids+=" $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done < <(bed_namespaces "$dir")
    [ -n "${pids// /}" ] || break
    # shellcheck disable=SC2086
    kill -s "$sig" $pids 2>/dev/null || true
    [ "$sig" = KILL ] || sleep 0.5
  done
  for node in "$dir"/uts/*; do
    [ -e "$node" ] || continue
    umount "$node" 2>/dev/null || true
    rm -f "$node"
  done
  while read -r ns; do ip netns del "$ns" 2>/dev/null || true; done < <(bed_namespaces "$dir")
  rm -rf "$dir"
}

bed_env() {
  local name=$1 dir="$STATE_ROOT/$1"
  echo "DTRAIN_TESTBED=$name"
  echo "DTRAIN_TESTBED_HOSTS=$(bed_hosts "$name")"
  echo "DTRAIN_TESTBED_SUBNET=$SUBNET"
  echo "DTRAIN_TESTBED_RSH=$dir/rsh"
  echo "OMPI_MCA_plm_rsh_agent=$dir/rsh"
  echo "OMPI_MCA_pml=ob1"
  echo "OMPI_MCA_btl=tcp,self,vader"
  [ ! -f "$dir/rate" ] || echo "DTRAIN_TESTBED_RATE=$(cat "$dir/rate")"
}

# Sets nsenter_args to the namespaces of NODE in bed NAME, or dies (in this shell: see require_bed).
node_namespaces() {
  require_node "$1" "$2"
  nsenter_args=("--net=/run/netns/$(netns_of "$1" "$2")" "--uts=$STATE_ROOT/$1/uts/$2")
}

parse_bed_flags() {  # sets nodes, rate, name, timeout; leaves the rest in cmd
  nodes=2 rate="" name="" timeout="" cmd=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
      --rate) rate=${2:?--rate needs a rate}; shift 2 ;;
      --name) name=${2:?--name needs a name}; shift 2 ;;
      --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
      --) shift; cmd=("$@"); return ;;
      *) die "unknown argument '$1'" ;;
    esac
  done
  if ! [[ "$nodes" =~ ^[0-9]+$ ]] || [ "$nodes" -lt 1 ] || [ "$nodes" -gt 26 ]; then
    die "--nodes: expected 1 to 26, got '$nodes'"
  fi
  [ -z "$timeout" ] || [[ "$timeout" =~ ^[0-9]+$ ]] || die "--timeout: expected whole seconds, got '$timeout'"
  [ -z "$rate" ] || rate_bytes_per_s "$rate" >/dev/null
  [ -z "$name" ] || valid_bed_name "$name" || die "--name: letters, digits, '.', '_' and '-' only, not starting with '.'"
}

# run: the bed lives exactly as long as this process; CMD runs in the background so that a
# signal reaches the trap at once (bash defers traps while a foreground child runs).
cmd_run() {
  parse_bed_flags "$@"
  [ ${#cmd[@]} -gt 0 ] || die "run: no command (put it after --)"
  local reason
  reason=$(cannot_make_bed)
  if [ -n "$reason" ]; then say "SKIPPED: $reason"; exit $SKIP; fi
  mkdir -p "$STATE_ROOT"
  reap_orphans
  name=${name:-dtb$$r$RANDOM}
  [ ! -e "$STATE_ROOT/$name" ] || die "a test bed named '$name' exists"
  child=""
  trap 'teardown "$name"' EXIT
  trap 'say "interrupted: tearing down $name"; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null; exit 130' INT TERM HUP
  make_bed "$name" "$nodes" "$rate" "$(process_identity $$)"
  local -a env_args timeout_cmd=() nsenter_args
  node_namespaces "$name" nodeA
  mapfile -t env_args < <(bed_env "$name")
  [ -z "$timeout" ] || timeout_cmd=(timeout --kill-after=5 "$timeout")
  env "${env_args[@]}" "${timeout_cmd[@]}" nsenter "${nsenter_args[@]}" -- "${cmd[@]}" <&0 &
  child=$!
  local status=0
  wait "$child" || status=$?
  child=""
  [ "$status" -ne 124 ] || say "the command ran past --timeout $timeout s and was stopped"
  exit "$status"
}

cmd_up() {
  parse_bed_flags "$@"
  [ ${#cmd[@]} -eq 0 ] || die "up: takes no command (use run, or exec once the bed is up)"
  local reason
  reason=$(cannot_make_bed)
  if [ -n "$reason" ]; then say "cannot make a test bed: $reason"; exit $SKIP; fi
  mkdir -p "$STATE_ROOT"
  reap_orphans
  name=${name:-dtb$$r$RANDOM}
  [ ! -e "$STATE_ROOT/$name" ] || die "a test bed named '$name' exists"
  trap 'teardown "$name"' EXIT  # a half-made bed is removed
  trap 'exit 130' INT TERM HUP
  make_bed "$name" "$nodes" "$rate" ""
  trap - EXIT INT TERM HUP
  bed_env "$name" | while IFS= read -r line; do printf 'export %s=%q\n' "${line%%=*}" "${line#*=}"; done
  say "up; run commands in it with: $(script_path) exec $name nodeA -- CMD...; remove it with: $(script_path) down $name"
}

cmd_exec() {
  local name=${1:?exec NAME NODE -- CMD...} node=${2:?exec NAME NODE -- CMD...}
  shift 2
  [ "${1:-}" = "--" ] && shift
  [ $# -gt 0 ] || die "exec: no command"
  local -a env_args nsenter_args
  node_namespaces "$name" "$node"
  mapfile -t env_args < <(bed_env "$name")
  exec env "${env_args[@]}" nsenter "${nsenter_args[@]}" -- "$@"
}

# As sshd would: a fresh environment (PATH and HOME only; mpirun passes what ranks need with
# -x), the words joined and run by a shell, in the home directory.
cmd_rsh() {
  local name=${1:?rsh NAME NODE CMD...} node=${2:?rsh NAME NODE CMD...}
  shift 2
  local -a nsenter_args
  node_namespaces "$name" "$node"
  exec env -i PATH="$PATH" HOME="${HOME:-/}" USER="$(id -un)" LOGNAME="$(id -un)" \
    nsenter "${nsenter_args[@]}" --wd="${HOME:-/}" -- /bin/sh -c "$*"
}

main() {
  local verb=${1:-}
  [ $# -eq 0 ] || shift
  case "$verb" in
    run) cmd_run "$@" ;;
    up) cmd_up "$@" ;;
    exec) cmd_exec "$@" ;;
    rsh) cmd_rsh "$@" ;;
    down) require_bed "${1:?down NAME}"; teardown "$1" ;;
    list) ls -1 "$STATE_ROOT" 2>/dev/null || true ;;
    check)
      local reason
      reason=$(cannot_make_bed)
      if [ -n "$reason" ]; then say "$reason"; exit $SKIP; fi
      say "a test bed can be made here" ;;
    *) sed -n '2,/^set -euo/p' "$(script_path)" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

main "$@"
