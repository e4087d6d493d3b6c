#!/usr/bin/env bash
# A Debian bullseye arm64 chroot: the oldest userland the bundle README promises run.py, build_engine.sh and the C++
# example (Python 3.9, numpy 1.19.5, Pillow 8.1, OpenCV 4.5: the nearest Debian has to JetPack 5's 3.8 / 1.17 / 7.0 /
# 4.2), run under qemu-user-static. Measured here (2 loaded cores): debootstrap with libopencv-dev did not finish in 25 min. tests/test_arm64.py uses it where it is ready and skips, with the reason, where not.
#
#   scripts/arm64_chroot.sh            # make it (root; debootstrap + qemu-user-static; ~10 min the first time)
#   scripts/arm64_chroot.sh --check    # exit 0 when it is ready, else say why
#
# Best effort, bounded: every step has a timeout; a failure leaves no half-made chroot (it is built in ROOT.tmp and
# renamed); a second run finds ROOT/.ready and returns at once. ROOT: $VITDEPLOY_ARM64_ROOT or the default below.
set -uo pipefail
ROOT="${VITDEPLOY_ARM64_ROOT:-/var/cache/vitdeploy-arm64/bullseye}"
MIRROR="${VITDEPLOY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PKGS=python3,python3-numpy,python3-pil,python3-pip,g++,libopencv-core-dev,libopencv-imgcodecs-dev  # no python3-opencv, libopencv-dev: GDAL, Qt, VTK under qemu took > 50 min here
say() { echo "arm64 chroot: $*" >&2; }

ready() {
  [ -f "$ROOT/.ready" ] || { say "not made ($ROOT/.ready missing): run scripts/arm64_chroot.sh as root"; return 1; }
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { say "qemu-aarch64 is not registered with binfmt_misc"; return 1; }
  return 0
}
[ "${1:-}" = --check ] && { ready; exit $?; }
[ -f "$ROOT/.ready" ] && ready && exit 0
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, chroot)"; exit 1; }

if ! command -v debootstrap >/dev/null || ! [ -x /usr/bin/qemu-aarch64-static ]; then
  timeout 300 env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap \
    qemu-user-static binfmt-support >/dev/null 2>&1 \
    || { timeout 120 apt-get update -q >/dev/null 2>&1 && timeout 300 env DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -q --no-install-recommends debootstrap qemu-user-static binfmt-support >/dev/null 2>&1; } \
    || { say "cannot install debootstrap/qemu-user-static"; exit 1; }
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null
  update-binfmts --enable qemu-aarch64 2>/dev/null || true
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { say "cannot register qemu-aarch64 (binfmt_misc)"; exit 1; }
fi

mkdir -p "$(dirname "$ROOT")"
rm -rf "$ROOT.tmp"
t0=$(date +%s)
timeout "${VITDEPLOY_ARM64_TIMEOUT:-1800}" debootstrap --arch=arm64 --variant=minbase --include="$PKGS" bullseye \
  "$ROOT.tmp" "$MIRROR" > "$ROOT.log" 2>&1 || { say "debootstrap failed or timed out (log: $ROOT.log)"; rm -rf "$ROOT.tmp"; exit 1; }
say "debootstrap: $(( $(date +%s) - t0 )) s"
# ONNX Runtime's aarch64 wheel for the ONNX path, against bullseye's own numpy (no pip upgrade of numpy): the newest
# release that imports with numpy 1.19.5, tried from the newest down; none is fine (the tests then check the one line)
for v in 1.16.3 1.14.1 1.12.1 1.10.0; do
  if timeout 600 chroot "$ROOT.tmp" python3 -m pip install -q --no-deps "onnxruntime==$v" flatbuffers protobuf packaging \
       coloredlogs humanfriendly sympy >> "$ROOT.log" 2>&1 \
     && timeout 120 chroot "$ROOT.tmp" python3 -c 'import onnxruntime' >> "$ROOT.log" 2>&1; then
    say "onnxruntime $v installed"; break
  fi
  timeout 120 chroot "$ROOT.tmp" python3 -m pip uninstall -q -y onnxruntime >> "$ROOT.log" 2>&1
done
touch "$ROOT.tmp/.ready"
rm -rf "$ROOT" && mv "$ROOT.tmp" "$ROOT"
say "ready in $(( $(date +%s) - t0 )) s: $ROOT"
