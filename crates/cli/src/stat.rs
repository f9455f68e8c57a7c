//! `amaranth stat`: an image's parameters and tree (offline), or a running daemon's live counters
//! (asked over its control socket).

use std::io;
use std::path::Path;
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Engine, ImageInfo, Options, Stats};
use amaranth_fs::Fs;
use amaranth_fuse::{RequestCounts, Transport};
use serde_json::{json, Value};

use crate::rundir;
use crate::util::{self, human, CliResult, Failure};

/// The engine's counters as JSON (shared by the live and the offline report).
pub fn engine_json(s: &Stats) -> Value {
    json!({
        "height": s.height,
        "nodes": s.nodes,
        "cached_nodes": s.cached_nodes,
        "dirty_nodes": s.dirty_nodes,
        "cache_bytes": s.cache_bytes,
        "cache_budget": s.cache_budget,
        "cache_peak_bytes": s.cache_peak_bytes,
        "cache_hits": s.cache_hits,
        "cache_misses": s.cache_misses,
        "partition_loads": s.partition_loads,
        "buffer_loads": s.buffer_loads,
        "run_reads": s.run_reads,
        "buffer_run_reads": s.buffer_run_reads,
        "subblock_buffers_reused": s.subblock_buffers_reused,
        "prefetch_loads": s.prefetch_loads,
        "prefetch_hits": s.prefetch_hits,
        "prefetch_shed": s.prefetch_shed,
        "evictions": s.evictions,
        "writebacks": s.writebacks,
        "writes": s.writes,
        "user_bytes_written": s.user_bytes_written,
        "bytes_written": s.device.bytes_written,
        "device_bytes_written": s.device.bytes_written,
        "device_bytes_read": s.device.bytes_read,
        "device": {
            "reads": s.device.reads,
            "bytes_read": s.device.bytes_read,
            "writes": s.device.writes,
            "bytes_written": s.device.bytes_written,
            "flushes": s.device.flushes,
            "discards": s.device.discards,
            "bytes_discarded": s.device.bytes_discarded,
        },
        "discard_failures": s.discard_failures,
        "node_writes": s.node_writes,
        "node_bytes_written": s.node_bytes_written,
        "node_reads": s.node_reads,
        "node_bytes_read": s.node_bytes_read,
        "write_amplification": s.write_amplification,
        "data_writes": s.data_writes,
        "data_bytes_written": s.data_bytes_written,
        "data_reads": s.data_reads,
        "data_bytes_read": s.data_bytes_read,
        "data_reads_raced": s.data_reads_raced,
        "data_buffers_pooled": s.data_buffers_pooled,
        "data_buffers_unpooled": s.data_buffers_unpooled,
        "data_buffer_slabs_mapped": s.data_buffer_slabs_mapped,
        "log": {
            "bytes_written": s.log.bytes_written,
            "chunks_written": s.log.chunks_written,
            "device_flushes": s.log.device_flushes,
            "used": s.log.used,
            "capacity": s.log.capacity,
            "next_lsn": s.log.next_lsn,
            "durable_lsn": s.log.durable_lsn,
        },
        "flushes": s.flushes,
        "bytes_flushed": s.bytes_flushed,
        "leaf_splits": s.leaf_splits,
        "internal_splits": s.internal_splits,
        "merges": s.merges,
        "leaf_bytes_relifted": s.leaf_bytes_relifted,
        "range_move_drains": s.range_move_drains,
        "rekeys_deferred": s.rekeys_deferred,
        "rekeys_cancelled": s.rekeys_cancelled,
        "checkpoints": s.checkpoints,
        "checkpoint_images_written_early": s.checkpoint_images_written_early,
        "checkpoint_writes_for_eviction": s.checkpoint_writes_for_eviction,
        "checkpoint_seconds": s.checkpoint_seconds,
        "syncs": s.syncs,
        "generation": s.generation,
        "free_bytes": s.free_bytes,
        "data_bytes": s.data_bytes,
        "space": {
            "used_bytes": s.space.used(),
            "dirty_next_bytes": s.space.dirty_next,
            "dirty_current_bytes": s.space.dirty_current,
            "out_of_line_bytes": s.space.data,
        },
        "sharing": {
            "shared_nodes": s.sharing.shared_nodes,
            "shared_node_bytes": s.sharing.shared_node_bytes,
            "shared_data_bytes": s.sharing.shared_data_bytes,
            "dead_nodes": s.sharing.dead_nodes,
            "dead_node_bytes": s.sharing.dead_node_bytes,
            "range_clones": s.range_clones,
            "range_moves": s.range_moves,
            "cow_copies": s.cow_copies,
            "nodes_collected": s.nodes_collected,
            "snapshots": s.snapshots,
        },
        "free_extents": s.free_extents,
        "device_size": s.device_bytes,
        "opened_after_crash": s.opened_after_crash,
        "recovered_records": s.recovered_records,
        "failure": s.failure,
    })
}

/// The live report a daemon serves on its control socket.
pub fn live_json(
    fs: &Fs,
    counts: &RequestCounts,
    transport: Transport,
    image: &str,
    mountpoint: &Path,
    started: std::time::Instant,
) -> Value {
    let s = fs.engine().stats();
    let mut v = engine_json(&s);
    let st = fs.statfs();
    let c = &fs.counters;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let o = v.as_object_mut().expect("an object");
    o.insert("pid".into(), json!(std::process::id()));
    o.insert("image".into(), json!(image));
    o.insert("mountpoint".into(), json!(mountpoint.display().to_string()));
    o.insert(
        "uptime_seconds".into(),
        json!(started.elapsed().as_secs_f64()),
    );
    o.insert("rss_bytes".into(), json!(rss_bytes()));
    // Device buffers (node images, log chunks, data blocks in flight) live now and at most: the
    // part of the daemon's memory beyond the cache that passes through the device.
    let (io_live, io_peak) = amaranth_device::aligned_bytes();
    o.insert("io_buffer_bytes".into(), json!(io_live));
    o.insert("io_buffer_peak_bytes".into(), json!(io_peak));
    let by_op: serde_json::Map<String, Value> = counts
        .snapshot()
        .into_iter()
        .map(|(name, n)| (name.to_string(), json!(n)))
        .collect();
    let ns_by_op: serde_json::Map<String, Value> = counts
        .time_snapshot()
        .into_iter()
        .map(|(name, n)| (name.to_string(), json!(n)))
        .collect();
    o.insert(
        "fuse".into(),
        json!({
            "transport": transport.name(),
            "requests": counts.total(),
            "ring_spread": counts.ring_spread(),
            "requests_by_opcode": by_op,
            "handler_ns_by_opcode": ns_by_op,
        }),
    );
    o.insert("read_only".into(), json!(fs.is_read_only()));
    let m = fs.modes();
    o.insert(
        "options".into(),
        json!({
            "atime": if !m.relatime { "noatime" } else if m.strictatime { "strictatime" } else { "relatime" },
            "lazytime": m.lazytime,
            "sync": m.sync,
        }),
    );
    o.insert(
        "fs".into(),
        json!({
            "writes": load(&c.writes),
            "bytes_written": load(&c.bytes_written),
            "bytes_read": load(&c.bytes_read),
            "cached_inodes": fs.cached_inodes(),
            "table_bytes": fs.table_bytes(),
            "table_limit": fs.table_limit(),
            "inodes_used": st.files.saturating_sub(st.ffree),
            "blocks": st.blocks,
            "blocks_free": st.bfree,
            "blocks_available": st.bavail,
            "block_size": st.bsize,
        }),
    );
    v
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// Runs `stat`.
pub fn run(target: &Path, as_json: bool) -> CliResult {
    let meta = std::fs::metadata(target);
    let is_dir = meta.as_ref().map(|m| m.is_dir()).unwrap_or(false);
    let dead_mount = matches!(&meta, Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
    if is_dir || dead_mount {
        let mp = util::absolute(target).map_err(|e| Failure::new(e.to_string()))?;
        return live(&mp, as_json);
    }
    if let Err(e) = &meta {
        return Err(Failure::new(format!("{}: {e}", target.display())));
    }
    offline(target, as_json)
}

fn live(mp: &Path, as_json: bool) -> CliResult {
    let ours = amaranth_fuse::find_mount(mp).filter(|m| amaranth_fuse::is_amaranth_type(&m.fstype));
    if ours.is_none() {
        return Err(Failure::new(format!(
            "{} is not an Amaranth mount point (give a mount point or an image)",
            mp.display()
        )));
    }
    let v = query(mp).map_err(|e| {
        Failure::new(format!(
            "cannot reach the daemon of {} at {}: {e}",
            mp.display(),
            rundir::run_dir_path()
                .join(rundir::socket_name(mp))
                .display()
        ))
    })?;
    if as_json {
        say!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
    } else {
        print_live(&v);
    }
    Ok(())
}

/// Asks the daemon of `mp` for its live report (see `control::request`).
pub fn query(mp: &Path) -> io::Result<Value> {
    crate::control::request(mp, &json!({ "op": "stat" }))
}

fn print_live(v: &Value) {
    let g = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    say!(
        "mount point:     {}",
        v["mountpoint"].as_str().unwrap_or("?")
    );
    say!("image:           {}", v["image"].as_str().unwrap_or("?"));
    say!("daemon pid:      {}", g("pid"));
    let opts = &v["options"];
    say!(
        "mode:            {}, {}{}{}",
        if v["read_only"].as_bool() == Some(true) {
            "read-only"
        } else {
            "read-write"
        },
        opts["atime"].as_str().unwrap_or("?"),
        if opts["lazytime"].as_bool() == Some(true) {
            ", lazytime"
        } else {
            ""
        },
        if opts["sync"].as_bool() == Some(true) {
            ", sync"
        } else {
            ""
        }
    );
    say!(
        "uptime:          {:.0} s",
        v["uptime_seconds"].as_f64().unwrap_or(0.0)
    );
    say!(
        "tree:            height {}, {} nodes",
        g("height"),
        g("nodes")
    );
    say!(
        "cache:           {} used of {} (peak {}), {} nodes, {} dirty, {} hits / {} misses",
        human(g("cache_bytes")),
        human(g("cache_budget")),
        human(g("cache_peak_bytes")),
        g("cached_nodes"),
        g("dirty_nodes"),
        g("cache_hits"),
        g("cache_misses")
    );
    say!(
        "point reads:     {} sub-blocks loaded ({} of them buffers), {} runs of shed partitions \
         and {} of shed buffers read instead",
        g("partition_loads"),
        g("buffer_loads"),
        g("run_reads"),
        g("buffer_run_reads")
    );
    say!(
        "memory:          {} resident, device buffers {} (peak {})",
        human(g("rss_bytes")),
        human(g("io_buffer_bytes")),
        human(g("io_buffer_peak_bytes"))
    );
    say!(
        "written:         {} by users, {} to the device (write amplification {:.2})",
        human(g("user_bytes_written")),
        human(g("device_bytes_written")),
        v["write_amplification"].as_f64().unwrap_or(0.0)
    );
    say!(
        "out-of-line:     {} written in {} extents, {} read in {} requests",
        human(g("data_bytes_written")),
        g("data_writes"),
        human(g("data_bytes_read")),
        g("data_reads")
    );
    let device = &v["device"];
    say!(
        "given back:      {} of free space discarded in {} requests{}",
        human(device["bytes_discarded"].as_u64().unwrap_or(0)),
        device["discards"].as_u64().unwrap_or(0),
        match g("discard_failures") {
            0 => String::new(),
            n => format!(", {n} passes ended by a refused discard"),
        }
    );
    say!(
        "checkpoints:     {} ({:.2} s), generation {}, {} syncs{}",
        g("checkpoints"),
        v["checkpoint_seconds"].as_f64().unwrap_or(0.0),
        g("generation"),
        g("syncs"),
        match (
            g("checkpoint_images_written_early"),
            g("checkpoint_writes_for_eviction")
        ) {
            (0, 0) => String::new(),
            (a, b) => format!(
                "; the cache being full, {a} images written early by writers and {b} nodes by \
                 eviction for the checkpoint"
            ),
        }
    );
    let log = &v["log"];
    say!(
        "log:             {} used of {}",
        human(log["used"].as_u64().unwrap_or(0)),
        human(log["capacity"].as_u64().unwrap_or(0))
    );
    say!(
        "space:           {} used of {} ({} unallocated; dirty nodes: {} to write, {} on disk)",
        human(v["space"]["used_bytes"].as_u64().unwrap_or(0)),
        human(g("data_bytes")),
        human(g("free_bytes")),
        human(v["space"]["dirty_next_bytes"].as_u64().unwrap_or(0)),
        human(v["space"]["dirty_current_bytes"].as_u64().unwrap_or(0))
    );
    print_sharing(&v["sharing"]);
    let fs = &v["fs"];
    say!(
        "file system:     {} inodes, {} operations, {} written, {} read, {} inodes cached",
        fs["inodes_used"].as_u64().unwrap_or(0),
        fs["writes"].as_u64().unwrap_or(0),
        human(fs["bytes_written"].as_u64().unwrap_or(0)),
        human(fs["bytes_read"].as_u64().unwrap_or(0)),
        fs["cached_inodes"].as_u64().unwrap_or(0)
    );
    let fuse = &v["fuse"];
    let by_op = fuse["requests_by_opcode"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, n)| format!("{k} {}", n.as_u64().unwrap_or(0)))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    say!(
        "FUSE requests:   {} ({by_op})",
        fuse["requests"].as_u64().unwrap_or(0)
    );
    if let Some(t) = fuse["transport"].as_str() {
        say!("FUSE transport:  {t}");
    }
    if let Some(f) = v["failure"].as_str() {
        say!("FAILURE:         {f}");
    }
}

/// The `shared:` line (docs/SURGERY.md §4.5): the roots of shared subtrees (nodes with a
/// reference count above 1; what lies below them is shared through them and not counted), the
/// out-of-line data named more than once, and the dead nodes the collector has not freed yet.
fn print_sharing(v: &Value) {
    let g = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    say!(
        "shared:          {} subtrees (root nodes {}), {} of out-of-line data referenced twice \
         or more; {} dead nodes ({}) awaiting collection",
        g("shared_nodes"),
        human(g("shared_node_bytes")),
        human(g("shared_data_bytes")),
        g("dead_nodes"),
        human(g("dead_node_bytes"))
    );
    say!(
        "snapshots:       {} (`amaranth snapshot list MOUNTPOINT`)",
        g("snapshots")
    );
}

fn offline(image: &Path, as_json: bool) -> CliResult {
    let dev = match FileDevice::open_read_only(image) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
            // Mounted: ask its daemon instead.
            let abs = util::absolute(image).map_err(|e| Failure::new(e.to_string()))?;
            let src = abs.display().to_string();
            if let Some(m) = amaranth_fuse::mounts()
                .into_iter()
                .find(|m| m.source == src && amaranth_fuse::is_amaranth_type(&m.fstype))
            {
                return live(&m.mountpoint, as_json);
            }
            return Err(Failure::new(format!(
                "{} is in use by another process: {e}",
                image.display()
            )));
        }
        Err(e) => {
            return Err(Failure::new(format!(
                "cannot open {}: {e}",
                image.display()
            )))
        }
    };
    let sb = ImageInfo::read(&dev, false)
        .map_err(|e| Failure::new(format!("{}: {e}", image.display())))?;
    let format = sb
        .format()
        .map_err(|e| Failure::new(format!("{}: {e}", image.display())))?;
    let len = dev.len();
    let opts = Options {
        read_only: true,
        background_threads: false,
        cache_size: (format.node_size * 16).max(128 << 20),
        ..Options::default()
    };
    let engine = Engine::open(Arc::new(dev), opts).map_err(|e| {
        Failure::new(format!(
            "cannot open {}: {}",
            image.display(),
            crate::image::engine_error(image, &e)
        ))
    })?;
    let s = engine.stats();
    let inodes = engine
        .get(&amaranth_fs::keys::system_key("inodes"))
        .ok()
        .flatten()
        .and_then(|v| v.try_into().ok().map(u64::from_le_bytes));
    let _ = engine.close();
    let uuid = sb.uuid_string();
    let mut v = engine_json(&s);
    let o = v.as_object_mut().expect("an object");
    o.insert("image".into(), json!(image.display().to_string()));
    o.insert("uuid".into(), json!(uuid));
    o.insert("label".into(), json!(sb.label()));
    o.insert("clean".into(), json!(sb.clean()));
    o.insert("created_unix".into(), json!(sb.created_unix()));
    o.insert("checkpoint_unix".into(), json!(sb.checkpoint_unix()));
    o.insert("inodes".into(), json!(inodes));
    o.insert(
        "format".into(),
        json!({
            "node_size": format.node_size,
            "partition_size": format.partition_size,
            "max_fanout": format.max_fanout,
            "max_key_len": format.max_key_len,
            "max_value_len": format.max_value_len,
            "log_size": format.log_size,
            "compression": format!("{:?}", format.compression).to_lowercase(),
        }),
    );
    if as_json {
        say!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
        return Ok(());
    }
    say!("image:           {} ({})", image.display(), human(len));
    say!("uuid:            {uuid}");
    say!("label:           {}", sb.label());
    say!(
        "format:          {} nodes, {} partitions, fanout {}, {} log, compression {:?}",
        human(format.node_size as u64),
        human(format.partition_size as u64),
        format.max_fanout,
        human(format.log_size.unwrap_or(0)),
        format.compression
    );
    say!(
        "state:           generation {}, {}",
        sb.generation(),
        if sb.clean() {
            "clean (unmounted properly)"
        } else {
            "not clean (the log will be replayed at the next mount)"
        }
    );
    say!("tree:            height {}, {} nodes", s.height, s.nodes);
    say!(
        "space:           {} free of {} ({} free extents)",
        human(s.free_bytes),
        human(s.data_bytes),
        s.free_extents
    );
    print_sharing(&v["sharing"]);
    if let Some(n) = inodes {
        say!("inodes:          {n}");
    }
    Ok(())
}
