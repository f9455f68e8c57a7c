#!/usr/bin/env bash
# Everything `make test` runs after the lint and the cargo unit/integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bench/smoke.sh  # benchmark harness: unit tests + `python3 -m bench --quick --check`, 4 file systems (~3 min, root)
echo "== all tests passed"
