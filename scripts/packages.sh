#!/bin/sh
# sh scripts/packages.sh GROUP...: the names in scripts/packages.txt (beside this script) of the
# given groups, one a line. Plain sh and awk, so that a bare Debian or Ubuntu image can run it
# before anything is installed. Fails on an unknown group: a typo must not install nothing.
set -eu
[ $# -gt 0 ] || { echo "usage: sh scripts/packages.sh GROUP..." >&2; exit 2; }
list=$(dirname "$0")/packages.txt
for group in "$@"; do
  awk -v g="$group" '!/^#/ && $2 == g { found = 1 } END { exit !found }' "$list" \
    || { echo "packages.sh: error: no group '$group' in $list" >&2; exit 2; }
done
awk -v groups=" $* " '!/^#/ && NF >= 2 && index(groups, " " $2 " ") { print $1 }' "$list"
