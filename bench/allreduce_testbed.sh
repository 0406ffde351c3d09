#!/usr/bin/env bash
# `dtrain bench allreduce` on the multi-node test bed (scripts/testbed.sh): NODES x RANKS ranks,
# links optionally shaped with tc tbf, table to stdout and JSON to a file.
#   bench/allreduce_testbed.sh BUILD_DIR NODESxRANKS RATE|none JSON [bench allreduce flags...]
# e.g. bench/allreduce_testbed.sh build-cpu 2x2 300mbit docs/bench/x.json --max-bytes 64M
set -euo pipefail
build=$(cd "${1:?build dir}" && pwd) layout=${2:?NODESxRANKS} rate=${3:?RATE or none} json=${4:?json file}
shift 4
[[ "$layout" =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "layout '$layout' is not like 2x2" >&2; exit 2; }
nodes=${BASH_REMATCH[1]} ranks=${BASH_REMATCH[2]}
hosts="" letters=ABCDEFGHIJKLMNOPQRSTUVWXYZ
for ((i = 0; i < nodes; i++)); do hosts+="${hosts:+,}node${letters:i:1}:$ranks"; done
shape=()
[ "$rate" = none ] || shape=(--rate "$rate")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
json=$(realpath -m "$json")
exec "$here/scripts/testbed.sh" run --nodes "$nodes" "${shape[@]}" -- \
  bash -c 'exec "$0" --hosts "$1" --iface "$DTRAIN_TESTBED_SUBNET" -- "$2" bench allreduce --json "$3" "${@:4}"' \
  "$build/launcher/dtrain-launch" "$hosts" "$build/app/dtrain" "$json" "$@"
