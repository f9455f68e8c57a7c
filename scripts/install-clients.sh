#!/usr/bin/env bash
# Builds and installs the patchgroup clients (docs/PATCHGROUPS.md): libamaranth_pg (C header and
# shared library) and the Python module amaranth_pg. Idempotent; `make run` calls it.
#   scripts/install-clients.sh [PREFIX]   default PREFIX: /usr/local as root, else ~/.local
# The shell command is part of the binary: `amaranth pg ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -eq 0 ]]; then
  prefix=${1:-/usr/local}
else
  prefix=${1:-$HOME/.local}
fi
make -s -C clients/libamaranth_pg OUT="$PWD/target/clients"
make -s -C clients/libamaranth_pg OUT="$PWD/target/clients" PREFIX="$prefix" install
if [[ $(id -u) -eq 0 ]] && command -v ldconfig >/dev/null; then
  ldconfig
fi
# The Python module, for each Python 3 there is (the one on PATH and the system's).
declare -A done_dirs=()
for py in python3 /usr/bin/python3; do
  command -v "$py" >/dev/null || continue
  if [[ $(id -u) -eq 0 ]]; then
    dir=$("$py" -c 'import site; print(site.getsitepackages()[0])')
  else
    dir=$("$py" -c 'import site; print(site.getusersitepackages())')
  fi
  [[ -n "${done_dirs[$dir]:-}" ]] && continue
  done_dirs[$dir]=1
  install -D -m 0644 clients/python/amaranth_pg.py "$dir/amaranth_pg.py"
done
echo "patchgroup clients: $prefix/include/amaranth_pg.h, $prefix/lib/libamaranth_pg.so, python: import amaranth_pg (${!done_dirs[*]})"
