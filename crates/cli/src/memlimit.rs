//! How much memory the daemon may use: its memory cgroup's limit (cgroup v1 and v2, the lowest
//! on the path up to the hierarchy's root) and physical memory. The cache is shrunk to fit, with a
//! message, rather than letting the kernel kill the daemon once it grows (every program using
//! the mount would then fail with "transport endpoint is not connected").

use std::path::{Path, PathBuf};

use crate::util::{self, human};

/// Memory the daemon uses beyond its cache size: the part of the inode table not charged to the
/// cache (`amaranth_fs::TABLE_UNCHARGED`, about 23,000 inodes the kernel knows), request buffers,
/// the log buffer, node images being written, the engine's pool of freed partition buffers (at
/// most 16 MiB) and its store's pool of sub-block read buffers (at most 16 MiB), thread stacks, the program itself and what the allocator keeps. Measured with `--cache-size 256M`, the io_uring transport and
/// [`bound_allocator`] in effect: 25-30 MiB above the cache at the peak of a 120,000-file create
/// and read-back, 59-62 MiB during four concurrent 768 MiB writes with 64M or 256M caches
/// (2026-11-25; without it glibc kept 92-136 MiB above the cache for the files, freed 128 KiB
/// partitions stranded in its heaps, and the daemon was OOM-killed in a 384 MiB cgroup). With
/// [`ARENAS`] at eight (2026-12-07) the file test peaked 36-49 MiB above the cache size (VmHWM
/// 292-305 MiB; 33-36 with two arenas the same hour); the concurrent writes were not measured
/// again. The bound is twice the largest peak measured. See docs/DESIGN.md (the daemon's
/// memory bound).
pub const DAEMON_OVERHEAD: u64 = 128 << 20;

/// Blocks of this size or more are mapped and unmapped on their own (`M_MMAP_THRESHOLD`).
const MMAP_THRESHOLD: libc::c_int = 64 << 10;

/// glibc arenas (`M_ARENA_MAX`). Eight, not two: glibc's arena lock does not spin, so two threads
/// allocating in one arena (a writer and the cleaner that frees what the writer allocated) put
/// each other to sleep, and on a VM every such sleep halts a vCPU. Which threads share an arena
/// depends on the order of their first allocations once the limit is reached. In the engine
/// benchmark's random inserts (10 M keys, 256 MiB cache; its process has eight threads) runs with
/// two arenas made 277,000-296,000 voluntary context switches in 3 of 4 runs (traced: nearly all
/// in `__lll_lock_wait_private` under malloc and free) and 68-94 s of CPU; with four, 2 runs of 8
/// did; with eight, none of 4 (47,000-51,000 switches, 61-67 s of CPU). The daemon's memory: 120,000
/// files created and read back with a 256 MiB cache peaked at 292-305 MiB VmHWM with eight against
/// 289-292 MiB with two (two runs each). docs/DESIGN.md, the daemon's memory bound.
pub const ARENAS: libc::c_int = 8;

/// Sets glibc's malloc for the daemon's memory bound:
/// - at most [`ARENAS`] arenas: the many FUSE threads otherwise each grow an arena of their own,
///   and freed node images scattered over them keep the resident size far above the cache bound
///   (measured with glibc's default of 8 per CPU: peak RSS -13% at the same throughput with two);
/// - a fixed mmap threshold below the engine's partition size, so partition and node buffers go
///   back to the system when freed (a fixed value also stops glibc from raising the threshold
///   after each freed mapping, which moved those buffers into heaps that freed memory in their
///   middle cannot leave). Measured on 120,000 files with a 256 MiB cache: peak 281-286 MiB
///   instead of 348-392 MiB, for 14-19% more daemon CPU time (page faults on fresh mappings)
///   and the same elapsed time.
///
/// Call before any thread starts (the CLI calls it first thing, for every command).
pub fn bound_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
    // A refusal (return value 0) only costs memory: nothing to do about it here.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// The share of physical memory a cache plus overhead may take (the rest is the kernel's and
/// other programs', the page cache of the mount's own files among them).
fn physical_share(total: u64) -> u64 {
    total / 4 * 3
}

/// The lowest limit on memory this process has, and what sets it.
pub fn memory_limit() -> (u64, String) {
    let total = util::total_memory();
    let mut best = (
        physical_share(total),
        format!("3/4 of physical memory ({})", human(total)),
    );
    for (limit, what) in cgroup_limits() {
        if limit < best.0 {
            best = (limit, what);
        }
    }
    best
}

/// The cache to use when `requested` is asked for and the daemon may use `allowed` bytes in all:
/// `requested` if it fits with the overhead, else what fits (at least `min`). The message says
/// what was changed and why.
pub fn fit_cache(requested: u64, min: u64, allowed: u64, what: &str) -> (u64, Option<String>) {
    if requested.saturating_add(DAEMON_OVERHEAD) <= allowed {
        return (requested, None);
    }
    let fits = allowed.saturating_sub(DAEMON_OVERHEAD);
    let cache = fits.max(min).min(requested);
    let mut msg = format!(
        "cache size {} does not fit in {} ({}) with the daemon's {} overhead; using {}",
        human(requested),
        what,
        human(allowed),
        human(DAEMON_OVERHEAD),
        human(cache)
    );
    if fits < min {
        msg.push_str(" (the smallest cache this image allows; the daemon may run out of memory)");
    }
    (cache, Some(msg))
}

/// Memory limits of this process's cgroups (v1 memory controller, v2), with where each is set.
fn cgroup_limits() -> Vec<(u64, String)> {
    let Ok(cgroups) = std::fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (root, file, unlimited) = if controllers.split(',').any(|c| c == "memory") {
            (
                mount_of(&mounts, "cgroup", Some("memory")),
                "memory.limit_in_bytes",
                None,
            )
        } else if controllers.is_empty() {
            (
                mount_of(&mounts, "cgroup2", None),
                "memory.max",
                Some("max"),
            )
        } else {
            continue;
        };
        if let Some(root) = root {
            out.extend(lowest_on_path(&root, path, file, unlimited));
        }
    }
    out
}

/// The mount point of a cgroup hierarchy (`fstype` with `option` among its super options).
fn mount_of(mountinfo: &str, fstype: &str, option: Option<&str>) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        if r.next()? != fstype {
            return None;
        }
        let opts = r.nth(1).unwrap_or("");
        if option.is_some_and(|o| !opts.split(',').any(|x| x == o)) {
            return None;
        }
        // Field 4 of the left part: where it is mounted.
        left.split(' ').nth(4).map(PathBuf::from)
    })
}

/// The lowest limit in `file` from the cgroup at `path` up to the hierarchy's root.
fn lowest_on_path(
    root: &Path,
    path: &str,
    file: &str,
    unlimited: Option<&str>,
) -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    let mut dir = root.join(path.trim_start_matches('/'));
    loop {
        let f = dir.join(file);
        if let Ok(text) = std::fs::read_to_string(&f) {
            let t = text.trim();
            if Some(t) != unlimited {
                if let Ok(v) = t.parse::<u64>() {
                    // cgroup v1 says "no limit" with a value near 2^63.
                    if v < 1 << 60 && best.as_ref().is_none_or(|b| v < b.0) {
                        best = Some((v, format!("the memory cgroup limit {}", f.display())));
                    }
                }
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return best;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_cache_that_fits_is_kept() {
        assert_eq!(
            fit_cache(256 * MIB, 32 * MIB, 384 * MIB, "x"),
            (256 * MIB, None)
        );
    }

    #[test]
    fn a_cache_too_large_for_the_limit_shrinks_with_a_message() {
        let (c, msg) = fit_cache(1024 * MIB, 32 * MIB, 512 * MIB, "the memory cgroup limit");
        assert_eq!(c, 512 * MIB - DAEMON_OVERHEAD);
        let msg = msg.unwrap();
        assert!(msg.contains("1.0 GiB") || msg.contains("1 GiB"), "{msg}");
        assert!(msg.contains("cgroup"), "{msg}");
        // Never below the image's minimum.
        let (c, msg) = fit_cache(1024 * MIB, 32 * MIB, 40 * MIB, "x");
        assert_eq!(c, 32 * MIB);
        assert!(msg.unwrap().contains("may run out of memory"));
    }

    #[test]
    fn cgroup_mounts_are_found() {
        let mi =
            "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n\
                  32 25 0:28 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu\n";
        assert_eq!(
            mount_of(mi, "cgroup", Some("memory")),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            mount_of(mi, "cgroup2", None),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn the_lowest_limit_up_the_path_counts() {
        let root = std::env::temp_dir().join(format!("amaranth-memlimit-{}", std::process::id()));
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(root.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(root.join("a/memory.limit_in_bytes"), "335544320\n").unwrap();
        std::fs::write(leaf.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        let got = lowest_on_path(&root, "/a/b", "memory.limit_in_bytes", None);
        let _ = std::fs::remove_dir_all(&root);
        let (v, what) = got.unwrap();
        assert_eq!(v, 320 * MIB);
        assert!(what.ends_with("a/memory.limit_in_bytes"), "{what}");
    }
}
