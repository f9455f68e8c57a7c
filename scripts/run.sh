#!/usr/bin/env bash
# `make run`: make the default image if there is none, mount it, say where and how to unmount.
#   scripts/run.sh IMAGE MOUNTPOINT SIZE
# Idempotent: an image that exists is reused, a mount point already mounted is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${1:-$HOME/.local/share/amaranth/default.img}
MOUNTPOINT=${2:-/mnt/amaranth}
SIZE=${3:-8G}
BIN=${AMARANTH_BIN:-$PWD/target/release/amaranth}
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"

if [[ ! -x "$BIN" ]]; then
  echo "run.sh: $BIN is missing; build it with: cargo build --release" >&2
  exit 1
fi

# The patchgroup clients (C library, Python module): docs/PATCHGROUPS.md.
scripts/install-clients.sh >/dev/null || echo "run.sh: installing the patchgroup clients failed (see scripts/install-clients.sh)" >&2

# Already mounted?
mp_abs=$(realpath -m "$MOUNTPOINT")
fstype=$(awk -v mp="$mp_abs" '$5 == mp { split($0, a, " - "); split(a[2], b, " "); t = b[1] } END { print t }' /proc/self/mountinfo)
if [[ -n "$fstype" ]]; then
  if [[ "$fstype" == "fuse.amaranth" ]]; then
    echo "already mounted: $mp_abs (amaranth)"
    echo "unmount with:    $BIN umount $mp_abs"
    exit 0
  fi
  echo "run.sh: $mp_abs is already a mount point of type $fstype" >&2
  exit 1
fi

# The image.
if [[ ! -e "$IMAGE" ]]; then
  mkdir -p "$(dirname "$IMAGE")"
  echo "creating a $SIZE image at $IMAGE"
  "$BIN" mkfs "$IMAGE" --size "$SIZE"
fi

# The mount point.
if [[ ! -d "$MOUNTPOINT" ]]; then
  mkdir -p "$MOUNTPOINT" 2>/dev/null || { $SUDO mkdir -p "$MOUNTPOINT" && $SUDO chown "$(id -u):$(id -g)" "$MOUNTPOINT"; }
fi

"$BIN" mount "$IMAGE" "$MOUNTPOINT"
echo
echo "Amaranth is mounted at $mp_abs (image $IMAGE)."
echo "Try it:        ls -la $mp_abs; cp -a /usr/share/doc $mp_abs/"
echo "Statistics:    $BIN stat $mp_abs"
echo "Patchgroups:   $BIN pg depend \"CMD1\" \"CMD2\"   (docs/PATCHGROUPS.md; C: -lamaranth_pg, Python: import amaranth_pg)"
echo "Unmount with:  $BIN umount $mp_abs"
