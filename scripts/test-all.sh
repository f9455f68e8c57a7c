#!/usr/bin/env bash
# Everything `make test` runs after the lint and the cargo unit/integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# The mount tests ran in `cargo test` on the default transport (FUSE-over-io_uring where the kernel
# has it); the POSIX suite runs again on /dev/fuse (with the fuse module's wake_here where the
# kernel has it).
AMARANTH_TEST_TRANSPORT=dev cargo test --release -p amaranth-cli --test posix
bench/smoke.sh  # benchmark harness: unit tests + `python3 -m bench --quick --check`, 4 file systems (~3 min, root)
# The mount tests (crates/cli/tests: integrity, posix, programs, concurrency, crash_mount) ran in
# `cargo test`; none may leave a mount or a daemon behind in their scratch directory.
test_dir="${AMARANTH_TEST_DIR:-/var/tmp/amaranth-tests}"
left=$(awk -v d="$test_dir" 'index($2, d) == 1 { print $2 }' /proc/self/mounts)
if [[ -n "$left" ]]; then
  echo "mount tests left mounts behind:" >&2
  echo "$left" >&2
  exit 1
fi
if pgrep -f "amaranth mount .*${test_dir}" >/dev/null; then
  echo "mount tests left daemons behind:" >&2
  pgrep -af "amaranth mount .*${test_dir}" >&2
  exit 1
fi
echo "== all tests passed"
