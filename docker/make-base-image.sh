#!/usr/bin/env bash
# Makes a Debian 12 base image from Debian's package archive, for hosts that reach no container
# registry (docker/Dockerfile.cpu then starts FROM it: --build-arg BASE_IMAGE=IMAGE):
#   debootstrap --variant=minbase bookworm, then `podman import` (3 to 5 minutes).
#   bash docker/make-base-image.sh [IMAGE]      default IMAGE: localhost/debian:12-minbase
# Needs root, debootstrap and podman (DTRAIN_CONTAINER_ENGINE=docker for Docker). An image already
# there is kept: delete it (podman rmi IMAGE) to make a fresh one. DTRAIN_DEBIAN_MIRROR picks the
# archive (default: debootstrap's own).
set -euo pipefail
image=${1:-localhost/debian:12-minbase}
engine=${DTRAIN_CONTAINER_ENGINE:-podman}

if "$engine" image inspect "$image" >/dev/null 2>&1; then
  echo "make-base-image: $image is already there"
  exit 0
fi
for tool in debootstrap "$engine"; do
  command -v "$tool" >/dev/null || { echo "make-base-image: error: $tool is not installed" >&2; exit 1; }
done

root=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-debootstrap.XXXXXX")
# debootstrap mounts /proc (and may bind /dev) inside the new root: unmount whatever an
# interrupted run left there before deleting it, and never delete across a mount.
cleanup() {
  awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
# nice: the build machine is often shared, and nothing waits on this but the image build.
# shellcheck disable=SC2086  # unquoted: an unset mirror is no argument (debootstrap's default)
nice -n 19 debootstrap --variant=minbase bookworm "$root" ${DTRAIN_DEBIAN_MIRROR:-} >"$root.log" 2>&1 || {
  tail -n 20 "$root.log" >&2
  echo "make-base-image: error: debootstrap failed (full log: $root.log)" >&2
  exit 1
}
rm -f "$root.log"
# The downloaded .debs and package lists: the image's own `apt-get update` fetches fresh lists.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner -c . | "$engine" import --change 'CMD ["bash"]' - "$image" >"$root.log" 2>&1 || {
  cat "$root.log" >&2
  echo "make-base-image: error: $engine import failed" >&2
  exit 1
}
rm -f "$root.log"
echo "make-base-image: made $image"
