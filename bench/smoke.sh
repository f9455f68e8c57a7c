#!/usr/bin/env bash
# Smoke test of the benchmark harness, run by `make test` (scripts/test-all.sh):
#   1. installs the harness's dependencies (scripts/install-deps.sh --bench),
#   2. runs its unit tests,
#   3. runs `python3 -m bench --quick --check` on Amaranth, ext4, XFS and Btrfs (every benchmark, tiny sizes,
#      a few minutes), which exits 1 unless every benchmark x file system has numbers or an explicit failure
#      and the CSV, report and figures are well formed. It checks the harness, not the numbers.
#   4. the same for the aging experiments: `python3 -m bench --quick --check --bench aging --no-fio`.
#   5. the per-point resume of an aging run, end to end (bench/tests/test_resume.py with BENCH_E2E=1).
# The Amaranth binary is built and copied to a private path first (others may rebuild target/release while this
# runs). Results go to a temporary directory that is removed at the end. Whatever happens (failure, Ctrl-C,
# timeout), the harness is stopped by its pid and `python3 -m bench --cleanup` removes what a killed run left
# (mounts, loop devices, cgroups, tracing instances; never those of another harness run still in progress).
# BENCH_SMOKE_TIMEOUT (seconds, default 900) bounds the quick run, BENCH_SMOKE_AGING_TIMEOUT (default 600) the
# aging one, BENCH_SMOKE_RESUME_TIMEOUT (default 900) the resume test; BENCH_SMOKE_KEEP=1 keeps the results;
# BENCH_SMOKE_AMARANTH_BIN=PATH uses that binary instead of building one; BENCH_SMOKE_WORKDIR=DIR uses that work dir
# (images, input cache) instead of the harness's default.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
  echo "bench smoke test: needs root (loop devices, mounts, cgroups, drop_caches, tracefs)" >&2
  exit 1
fi

scripts/install-deps.sh --bench
bin=${BENCH_SMOKE_AMARANTH_BIN:-}
if [[ -z "$bin" ]]; then
  cargo build --release -p amaranth-cli
  bin=target/release/amaranth
fi

workdir=()
[[ -n "${BENCH_SMOKE_WORKDIR:-}" ]] && workdir=(--workdir "$BENCH_SMOKE_WORKDIR")
tmp=$(mktemp -d /var/tmp/amaranth-bench-smoke.XXXXXX)
harness_pid=""
finish() {
  local rc=$?
  if [[ -n "$harness_pid" ]] && kill -0 "$harness_pid" 2>/dev/null; then
    kill -TERM "$harness_pid" 2>/dev/null || true   # the harness undoes its mounts etc. on SIGTERM
    for _ in $(seq 60); do kill -0 "$harness_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$harness_pid" 2>/dev/null || true
  fi
  python3 -m bench --cleanup "${workdir[@]}" >/dev/null 2>&1 || true
  if [[ "${BENCH_SMOKE_KEEP:-0}" == 1 ]]; then
    echo "bench smoke test: results kept in $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM HUP

cp "$bin" "$tmp/amaranth"
python3 -m unittest discover -s bench/tests -t . 2>&1 | tail -n 3

# run_harness NAME TIMEOUT ARGS...: the harness in the background (so `finish` can stop it by its pid)
run_harness() {
  local name=$1 limit=$2
  shift 2
  timeout --signal=TERM --kill-after=60 "$limit" \
    python3 -m bench --quick --check --amaranth-bin "$tmp/amaranth" --out "$tmp/$name" "${workdir[@]}" "$@" \
    >"$tmp/$name.log" 2>&1 &
  harness_pid=$!
  local rc=0
  wait "$harness_pid" || rc=$?
  harness_pid=""
  grep -E "FAILED in|^check" "$tmp/$name.log" || true
  if (( rc != 0 )); then
    echo "bench smoke test ($name) failed (exit $rc); last lines of the run:" >&2
    tail -n 40 "$tmp/$name.log" >&2
    exit "$rc"
  fi
  echo "bench smoke test ($name) passed ($(grep -c '=== run' "$tmp/$name.log") runs)"
}

run_harness results "${BENCH_SMOKE_TIMEOUT:-900}"
run_harness aging "${BENCH_SMOKE_AGING_TIMEOUT:-600}" --bench aging --no-fio

# per-point resume of an aging run (bench/tests/test_resume.py): the quick aging-mail on ext4 killed with SIGKILL
# in the middle of a point, resumed, stopped with SIGTERM, resumed again = the uninterrupted run (~2 minutes)
rc=0
BENCH_E2E=1 timeout --signal=TERM --kill-after=60 "${BENCH_SMOKE_RESUME_TIMEOUT:-900}" \
  python3 -m unittest bench.tests.test_resume.ResumeEndToEnd >"$tmp/resume.log" 2>&1 || rc=$?
if (( rc != 0 )); then
  echo "bench smoke test (resume) failed (exit $rc):" >&2
  tail -n 40 "$tmp/resume.log" >&2
  exit "$rc"
fi
echo "bench smoke test (resume) passed"
