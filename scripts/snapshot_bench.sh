#!/bin/bash
# Snapshot of a mount holding the Linux 6.1 source tree, under a write load; then the space back
# (docs/SURGERY.md §4.7, "Measured"). Run as root from the repository, after
# `cargo build --release -p amaranth-cli`:
#   LINUX_TAR=/var/tmp/amaranth-test-cache/linux-source-6.1.tar scripts/snapshot_bench.sh
set -u
B=${AMARANTH:-$PWD/target/release/amaranth}
D=${SNAP_BENCH_DIR:-/var/tmp/snap-bench}
LINUX_TAR=${LINUX_TAR:-/var/tmp/amaranth-test-cache/linux-source-6.1.tar}
mkdir -p $D
IMG=$D/fs.img; MP=$D/mnt
rm -f $IMG; mkdir -p $MP
$B mkfs $IMG --size 8G >/dev/null
$B mount $IMG $MP
t0=$(date +%s.%N)
tar xf $LINUX_TAR -C $MP
sync
t1=$(date +%s.%N)
echo "untar+sync: $(echo "$t1 - $t0" | bc) s"
$B stat $MP | grep -E "tree|space|shared|snapshots"
# Write load: a writer rewriting 64 KiB files in a loop.
( mkdir -p $MP/load; i=0; while [ -e $D/go ]; do head -c 65536 /dev/urandom > $MP/load/f$((i % 200)); i=$((i+1)); done; echo "load: $i files written" ) &
LOAD=$!
touch $D/go
sleep 2
for i in $(seq 1 10); do
  /usr/bin/time -f "command %e s" $B snapshot create s$i $MP 2>&1
  sleep 0.5
done
rm -f $D/go; wait $LOAD
$B snapshot list $MP | head -3
# The space held by a snapshot comes back when it is deleted.
for i in $(seq 2 10); do $B snapshot delete s$i $MP >/dev/null; done
used() { $B stat $MP --json | python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["space"]["used_bytes"])'; }
echo "used with s1: $(used)"
rm -rf $MP/linux-source-6.1; sync
sleep 5
echo "used after rm -rf of the tree (s1 holds it): $(used)"
t0=$(date +%s.%N)
$B snapshot delete s1 $MP
for k in $(seq 1 60); do
  sleep 1
  u=$(used)
  echo "  +${k}s used $u"
  if [ "$u" -lt 400000000 ]; then break; fi
done
t1=$(date +%s.%N)
echo "space back after $(echo "$t1 - $t0" | bc) s"
$B stat $MP | grep -E "space|shared|snapshots"
$B umount $MP
$B fsck $IMG | tail -2
rm -f $IMG
