#!/bin/bash
# Cold directory renames on a fresh daemon, for A/B runs of two builds (BENCHMARKS.md, "Range rename:
# buffers left encoded").
#
#   bench/tools/cold_rename.sh prepare BIN BASE_IMAGE
#       makes BASE_IMAGE: an 8 GiB image holding linux-source-6.1 without drivers/ (from
#       /usr/src/linux-source-6.1.tar.xz, installed by scripts/install-deps.sh --bench)
#   bench/tools/cold_rename.sh run BIN BASE_IMAGE [COUNT]
#       copies BASE_IMAGE, mounts the copy with BIN, drops the caches and renames the tree's top
#       directory COUNT times (default 100) and back, each with an fsync of the parent
#       (bench/helpers/renamebench.c); prints renames/s, the first renames' latencies, the median,
#       and the daemon's CPU time and page faults over the renames (perf stat)
#
# Alternate the builds (A B A B ...) in one session: the machine's noise is larger than most effects.
set -euo pipefail
cmd=$1 bin=$2 base=$3 count=${4:-100}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /var/tmp/cold-rename.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    mountpoint -q "$mnt" && "$bin" umount "$mnt" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
case $cmd in
prepare)
    "$bin" mkfs --size 8G "$base" >/dev/null
    "$bin" mount "$base" "$mnt" >/dev/null
    tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$mnt" --exclude='linux-source-6.1/drivers'
    ;;
run)
    gcc -O2 -o "$work/renamebench" "$here/bench/helpers/renamebench.c" -I"$here/bench/helpers"
    cp --sparse=always "$base" "$work/img"
    "$bin" mount --pid-file "$work/pid" "$work/img" "$mnt" >/dev/null
    pid=$(cat "$work/pid")
    sync
    echo 3 >/proc/sys/vm/drop_caches
    perf stat -e page-faults,task-clock -p "$pid" -o "$work/stat" &
    perf_pid=$!
    sleep 0.5
    "$work/renamebench" "$mnt/linux-source-6.1" "$mnt/lr" "$count" >"$work/out.json"
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    python3 - "$work/out.json" "$work/stat" <<'PY'
import json, re, statistics, sys
d = json.load(open(sys.argv[1]))
lat = d["latency_us"]
stat = open(sys.argv[2]).read()
def counter(name):
    m = re.search(r"([\d,.]+)\s+(?:msec\s+)?" + re.escape(name), stat)
    return float(m.group(1).replace(",", "")) if m else float("nan")
print(f"renames/s {d['renames_per_s']:.0f}, total {d['total_s'] * 1e3:.1f} ms, "
      f"first {[round(x / 1e3, 1) for x in lat[:4]]} ms, median {statistics.median(lat):.0f} us, "
      f"daemon task-clock {counter('task-clock'):.1f} ms, page faults {counter('page-faults'):.0f}")
PY
    ;;
*)
    echo "usage: $0 prepare|run BIN BASE_IMAGE [COUNT]" >&2
    exit 2
    ;;
esac
