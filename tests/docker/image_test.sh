#!/usr/bin/env bash
# The CPU image built and its main job run: docker/Dockerfile.cpu built with podman from a
# Debian 12 base made from Debian's archive (docker/make-base-image.sh; kept as a cache), then the
# image's default command, the README's main job (dtrain-launch -n 2 -- dtrain train --epochs 1).
#   image_test.sh SOURCE_DIR
# Skipped (77) with the reason unless DTRAIN_TEST_DOCKER=1 (measured on a busy 2-core machine:
# the base 5 minutes, the image 19), and where podman cannot run here. DTRAIN_DOCKER_JOBS: parallel
# compiles inside the image (default 1: the test shares the machine with the rest of the suite).
set -uo pipefail
src=$(realpath "$1")
skip() { echo "SKIPPED: $1"; exit 77; }
fail() { echo "not ok - $1"; exit 1; }

[ "${DTRAIN_TEST_DOCKER:-0}" = 1 ] \
  || skip "builds the CPU image in a fresh Debian 12 (about 20 minutes on 2 cores): DTRAIN_TEST_DOCKER=1 runs it"
[ "$(id -u)" = 0 ] || skip "runs podman as root (rootless podman needs subordinate uid ranges): not root"
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null \
    || skip "$tool is not installed (DTRAIN_TEST_DOCKER=1 bash scripts/setup.sh test installs the docker group of scripts/packages.txt)"
done
podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -n 1)"

base=${DTRAIN_DOCKER_BASE:-localhost/debian:12-minbase}
image=localhost/dtrain:cpu-test
# runc: crun refuses a kernel with hybrid cgroups. The host's network: no bridge to set up. Limits
# below the hard ones (podman asks for more open files than a container here may have).
podman=(podman --runtime runc)
options=(--network host --ulimit nofile=1024:1024 --ulimit nproc=4096:4096)

work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-image-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

start=$SECONDS
bash "$src/docker/make-base-image.sh" "$base" || fail "could not make the base image $base"
echo "base image: $((SECONDS - start)) s"

# The build context: the sources as git sees them (tracked and untracked, not ignored), never a
# build folder or .git, whatever .dockerignore support the engine has.
mkdir "$work/context"
if git -C "$src" rev-parse --show-toplevel >/dev/null 2>&1; then
  # --ignore-failed-read: a tracked file deleted in the work tree.
  git -C "$src" ls-files -z --cached --others --exclude-standard \
    | tar -C "$src" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$work/context" -xf -
else
  tar -C "$src" --exclude=./.git --exclude='./build*' -cf - . | tar -C "$work/context" -xf -
fi
[ -f "$work/context/docker/Dockerfile.cpu" ] || fail "no docker/Dockerfile.cpu in the build context"

start=$SECONDS
nice -n 19 "${podman[@]}" build "${options[@]}" -f "$work/context/docker/Dockerfile.cpu" \
  --build-arg BASE_IMAGE="$base" --build-arg JOBS="${DTRAIN_DOCKER_JOBS:-1}" -t "$image" "$work/context" \
  >"$work/build.log" 2>&1
status=$?
tail -n 15 "$work/build.log"
echo "image build: $((SECONDS - start)) s"
[ "$status" = 0 ] || fail "podman build -f docker/Dockerfile.cpu exited $status"

start=$SECONDS
"${podman[@]}" run --rm "${options[@]}" "$image" >"$work/job.log" 2>&1
status=$?
cat "$work/job.log"
echo "main job: $((SECONDS - start)) s"
[ "$status" = 0 ] || fail "the main job (the image's default command) exited $status"
grep -q '^Test set: .*Accuracy' "$work/job.log" || fail "the main job printed no test accuracy"
grep -q 'on 2 rank(s)' "$work/job.log" || fail "the main job did not train on 2 ranks"
echo "ok - the CPU image builds and runs the main job"
