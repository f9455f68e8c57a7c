#!/usr/bin/env bash
# Installs what Amaranth needs to build, run and test, if it is missing. Idempotent.
#   scripts/install-deps.sh            build + run + test dependencies
#   scripts/install-deps.sh --bench    also the benchmark suite's (fio, xfsprogs, btrfs-progs, dovecot, pip, ...)
#   scripts/install-deps.sh --engine-bench
#                                      also bench/engine-bench's (clang/libclang for RocksDB's bindgen, fio)
set -euo pipefail
want_bench=0
want_engine_bench=0
[[ "${1:-}" == "--bench" ]] && want_bench=1
[[ "${1:-}" == "--engine-bench" ]] && want_engine_bench=1

# linux-source-6.1: the Linux tar the mount tests (programs, crash_mount) unpack and compare.
# nfs-ganesha + nfs-ganesha-vfs + libnfs-utils: the NFS export test (crates/cli/tests/nfs.rs) runs a
# user-space NFS server over a mount and reads and writes through a user-space NFS client.
apt_pkgs=(fuse3 pkg-config build-essential sqlite3 rsync git xz-utils linux-source-6.1
  nfs-ganesha nfs-ganesha-vfs libnfs-utils)
if (( want_bench )); then
  apt_pkgs+=(fio xfsprogs btrfs-progs e2fsprogs dovecot-imapd postmark linux-source-6.1 time)
fi
if (( want_engine_bench )); then
  apt_pkgs+=(clang libclang-dev g++ fio e2fsprogs util-linux mount)
fi

missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (stable) with rustup first" >&2
  exit 1
fi

if (( want_bench )); then
  python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q -r bench/requirements.txt
  # the aging experiment downloads its git history (successive releases of a PyPI project) with pip
  if ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
fi
