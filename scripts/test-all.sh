#!/usr/bin/env bash
# Everything `make test` runs after the lint and the cargo unit/integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== all tests passed"
