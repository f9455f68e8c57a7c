//! [`Stats`]: a snapshot of the engine's state and activity, for `amaranth stat` and benchmarks.

use std::sync::atomic::Ordering;

use amaranth_device::{IoStats, BLOCK_SIZE};

use super::{Engine, Sharing};
use crate::node::ROOT_ID;
use crate::space::SpaceUse;
use crate::wal::LogStats;

/// A snapshot of the engine's state and activity.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Height of the tree (0: the root is a leaf).
    pub height: u32,
    /// Nodes with an on-disk location plus nodes not yet written.
    pub nodes: u64,
    /// Nodes in memory.
    pub cached_nodes: usize,
    /// Dirty nodes in memory.
    pub dirty_nodes: usize,
    /// Bytes of nodes accounted in memory.
    pub cache_bytes: usize,
    /// Highest cache usage seen.
    pub cache_peak_bytes: usize,
    /// The cache bound.
    pub cache_budget: usize,
    /// Memory held outside the engine that the bound covers (set by
    /// [`Engine::set_external_memory`]); the nodes get the rest, down to half the bound.
    pub cache_external_bytes: usize,
    /// Node loads answered from memory / from disk.
    pub cache_hits: u64,
    /// Node loads from disk.
    pub cache_misses: u64,
    /// Sub-block loads from disk: leaf partitions and internal-node buffers read on their own
    /// or with their node's image.
    pub partition_loads: u64,
    /// Of those, internal-node buffers.
    pub buffer_loads: u64,
    /// Point queries answered by reading one run (about 4 KiB) of a shed partition instead of
    /// the whole partition.
    pub run_reads: u64,
    /// Point queries that read one run (about 4 KiB) of a shed child buffer, whose summary said
    /// it may hold the key, instead of the whole buffer.
    pub buffer_run_reads: u64,
    /// Leaves read ahead for sequential scans.
    pub prefetch_loads: u64,
    /// Leaves read ahead that a scan then used.
    pub prefetch_hits: u64,
    /// Leaves read ahead whose partitions were dropped for room before any scan used them.
    pub prefetch_shed: u64,
    /// Partitions decoded into the memory of partitions freed before (instead of newly mapped
    /// memory), in this process: the pool of such buffers is shared by every engine.
    pub partition_buffers_reused: u64,
    /// Whole node images read into the buffer of an image freed before (given back by the read,
    /// or by the last sub-block read in place from it) instead of newly mapped memory.
    pub image_buffers_reused: u64,
    /// Single sub-blocks (a cold point read's partition, a buffer read for a point query) read
    /// into the buffer of one shed before instead of newly mapped memory.
    pub subblock_buffers_reused: u64,
    /// Buffers of out-of-line data (`put_blocks`) cut from the pool of huge pages, in this
    /// process (the pool is shared by every engine).
    pub data_buffers_pooled: u64,
    /// Buffers of out-of-line data allocated on their own instead, in this process: the pool's
    /// slabs were all in use, or the data was larger than a slot (1 MiB).
    pub data_buffers_unpooled: u64,
    /// Slabs (huge pages) the pool of out-of-line data buffers mapped, in this process.
    pub data_buffer_slabs_mapped: u64,
    /// Nodes evicted.
    pub evictions: u64,
    /// Dirty nodes written by eviction.
    pub writebacks: u64,
    /// Nodes the running checkpoint had still to write, written for it by eviction (the cache
    /// was full of them).
    pub checkpoint_writes_for_eviction: u64,
    /// Operations written.
    pub writes: u64,
    /// Bytes of keys and values the user wrote.
    pub user_bytes_written: u64,
    /// Device I/O.
    pub device: IoStats,
    /// Node images written / bytes.
    pub node_writes: u64,
    /// Bytes of node images written.
    pub node_bytes_written: u64,
    /// Node reads / bytes.
    pub node_reads: u64,
    /// Bytes read for nodes.
    pub node_bytes_read: u64,
    /// Node images checkpoints placed in their key-ordered runs (docs/DESIGN.md, Placement).
    pub run_extents: u64,
    /// Of those, images that started where the previous one of their run ended.
    pub run_contiguous: u64,
    /// Clean leaves rewritten by checkpoints to restore key order on the device.
    pub relocated: u64,
    /// Out-of-line data extents written (one per [`crate::Op::PutBlocks`]), and their bytes.
    pub data_writes: u64,
    /// Bytes of out-of-line data written.
    pub data_bytes_written: u64,
    /// Device reads of out-of-line data (one per run of consecutive blocks), and their bytes.
    pub data_reads: u64,
    /// Bytes of out-of-line data read.
    pub data_bytes_read: u64,
    /// Reads of out-of-line blocks that raced an overwrite (the block let go of, perhaps reused,
    /// between the scan that found it and its read) and were done again.
    pub data_reads_raced: u64,
    /// Discard passes ended by a refused discard (docs/DESIGN.md, "Discard"; what was discarded
    /// is in `device`).
    pub discard_failures: u64,
    /// Device bytes written per byte of user data.
    pub write_amplification: f64,
    /// Log activity.
    pub log: LogStats,
    /// Buffer flushes.
    pub flushes: u64,
    /// Bytes moved by flushes.
    pub bytes_flushed: u64,
    /// Leaf pieces created by splits.
    pub leaf_splits: u64,
    /// Internal pieces created by splits.
    pub internal_splits: u64,
    /// Merges.
    pub merges: u64,
    /// Range moves done by surgery (the others copied their range).
    pub range_moves: u64,
    /// Nodes of dead destination subtrees that range moves released.
    pub range_move_released: u64,
    /// Range clones done by surgery (the others copied their range).
    pub range_clones: u64,
    /// Shared nodes copied for one owner before a change (copy-on-write).
    pub cow_copies: u64,
    /// Dead nodes freed by the collector.
    pub nodes_collected: u64,
    /// Dead nodes waiting for the collector.
    pub garbage_nodes: u64,
    /// Snapshots the image keeps.
    pub snapshots: u64,
    /// Snapshots taken since the engine opened (log replay included).
    pub snapshots_taken: u64,
    /// Images of nodes that the running checkpoint still had to write, written by the threads
    /// about to change them because the cache had no room to hold the images until the
    /// checkpoint got to them.
    pub checkpoint_images_written_early: u64,
    /// Subtrees range deletes covered whole and let go instead of flushing into them.
    pub subtrees_dropped: u64,
    /// What range clones share now, and what waits for the collector.
    pub sharing: Sharing,
    /// Run slots a range move queued to be flushed into their subtrees after it (their buffers
    /// held more than a sixteenth of a node).
    pub range_move_drains: u64,
    /// Leaf entry bytes rewritten into another prefix (re-lifted, docs/SURGERY.md §2.1) by the
    /// cuts, splits and merges of leaves: what keeping keys lifted costs.
    pub leaf_bytes_relifted: u64,
    /// Moved run slots whose messages' key rewrite was left pending until they are needed.
    pub rekeys_deferred: u64,
    /// Moved run slots whose pending key rewrite a later move undid (a move and its reverse).
    pub rekeys_cancelled: u64,
    /// Completed checkpoints (this session).
    pub checkpoints: u64,
    /// Requests for a checkpoint (log past its checkpoint fraction, deleted data over its bound)
    /// dropped because a checkpoint that ran after them had already satisfied them (this session).
    pub checkpoint_requests_dropped: u64,
    /// Time spent in checkpoints (this session).
    pub checkpoint_seconds: f64,
    /// `sync` calls.
    pub syncs: u64,
    /// Checkpoint generation on disk.
    pub generation: u64,
    /// Free bytes in the data area.
    pub free_bytes: u64,
    /// Size of the data area.
    pub data_bytes: u64,
    /// Free extents (fragmentation).
    pub free_extents: usize,
    /// The data area's use, dirty nodes included.
    pub space: SpaceUse,
    /// Size of the device.
    pub device_bytes: u64,
    /// The image was not closed cleanly before this open.
    pub opened_after_crash: bool,
    /// Log records replayed at open.
    pub recovered_records: u64,
    /// Why log replay stopped where it did at open.
    pub recovery_stop: String,
    /// Log records skipped at open because they could not be applied (only a writer with a bug
    /// logs such a record; see [`Engine::open`]).
    pub skipped_records: u64,
    /// The image is flagged for a check: records were skipped at some open since the flag was
    /// last cleared ([`Engine::clear_needs_check`]).
    pub needs_check: bool,
    /// The error that made the engine read-only, if any.
    pub failure: Option<String>,
    /// Damage is known (found by a read, or recorded in the superblock): what was found, if this
    /// session found it.
    pub known_damage: Option<String>,
    /// What was wrong with the superblock copies at open (damaged or overwritten copies, a
    /// fallback to a backup copy); empty when nothing was.
    pub superblock_notes: Vec<String>,
}

impl Engine {
    /// A snapshot of counters and sizes.
    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        let t = &i.tree;
        let height = t.pin(ROOT_ID).map(|r| r.read().height).unwrap_or(0);
        let (nodes_on_disk, free, total, frag) = {
            let b = t.store.btt.lock();
            (
                b.current.len() as u64,
                b.alloc.free_blocks(),
                b.alloc.total_blocks(),
                b.alloc.free_extents(),
            )
        };
        let all = t.cache.all();
        let dirty = all.iter().filter(|c| c.is_dirty()).count();
        let unwritten = all
            .iter()
            .filter(|c| t.store.location(c.id).is_none())
            .count() as u64;
        let (generation, needs_check) = i.ckpt.generation_and_check();
        let device = i.dev.io_stats();
        let user = i.counters.user_bytes.load(Ordering::Relaxed);
        let sc = &t.store.counters;
        let cc = &t.cache.counters;
        let tc = &t.counters;
        Stats {
            height,
            nodes: nodes_on_disk + unwritten,
            cached_nodes: all.len(),
            dirty_nodes: dirty,
            cache_bytes: t.cache.used(),
            cache_peak_bytes: cc.peak.load(Ordering::Relaxed),
            cache_budget: t.cache.budget(),
            cache_external_bytes: t.cache.external(),
            cache_hits: cc.hits.load(Ordering::Relaxed),
            cache_misses: cc.misses.load(Ordering::Relaxed),
            partition_loads: cc.partition_loads.load(Ordering::Relaxed),
            buffer_loads: cc.buffer_loads.load(Ordering::Relaxed),
            run_reads: cc.run_reads.load(Ordering::Relaxed),
            buffer_run_reads: cc.buffer_run_reads.load(Ordering::Relaxed),
            prefetch_loads: cc.prefetch_loads.load(Ordering::Relaxed),
            prefetch_hits: cc.prefetch_hits.load(Ordering::Relaxed),
            prefetch_shed: cc.prefetch_shed.load(Ordering::Relaxed),
            partition_buffers_reused: crate::bufpool::POOL.reused(),
            image_buffers_reused: t.store.image_buffers_reused(),
            subblock_buffers_reused: t.store.subblock_buffers_reused(),
            data_buffers_pooled: crate::writebuf::POOL.pooled(),
            data_buffers_unpooled: crate::writebuf::POOL.unpooled(),
            data_buffer_slabs_mapped: crate::writebuf::POOL.slabs_mapped(),
            evictions: cc.evictions.load(Ordering::Relaxed),
            writebacks: cc.writebacks.load(Ordering::Relaxed),
            checkpoint_writes_for_eviction: cc
                .checkpoint_writes_for_eviction
                .load(Ordering::Relaxed),
            writes: i.counters.writes.load(Ordering::Relaxed),
            user_bytes_written: user,
            device,
            node_writes: sc.nodes_written.load(Ordering::Relaxed),
            node_bytes_written: sc.node_bytes_written.load(Ordering::Relaxed),
            node_reads: sc.node_reads.load(Ordering::Relaxed),
            node_bytes_read: sc.node_bytes_read.load(Ordering::Relaxed),
            run_extents: sc.run_extents.load(Ordering::Relaxed),
            run_contiguous: sc.run_contiguous.load(Ordering::Relaxed),
            relocated: sc.relocated.load(Ordering::Relaxed),
            data_writes: sc.data_writes.load(Ordering::Relaxed),
            data_bytes_written: sc.data_bytes_written.load(Ordering::Relaxed),
            data_reads: sc.data_reads.load(Ordering::Relaxed),
            data_bytes_read: sc.data_bytes_read.load(Ordering::Relaxed),
            data_reads_raced: sc.data_reads_raced.load(Ordering::Relaxed),
            discard_failures: sc.discard_failures.load(Ordering::Relaxed),
            write_amplification: if user > 0 {
                device.bytes_written as f64 / user as f64
            } else {
                0.0
            },
            log: i.log.stats(),
            flushes: tc.flushes.load(Ordering::Relaxed),
            bytes_flushed: tc.bytes_flushed.load(Ordering::Relaxed),
            leaf_splits: tc.leaf_splits.load(Ordering::Relaxed),
            internal_splits: tc.internal_splits.load(Ordering::Relaxed),
            merges: tc.merges.load(Ordering::Relaxed),
            range_moves: tc.range_moves.load(Ordering::Relaxed),
            range_move_released: tc.range_move_released.load(Ordering::Relaxed),
            range_clones: tc.range_clones.load(Ordering::Relaxed),
            cow_copies: tc.cow_copies.load(Ordering::Relaxed),
            nodes_collected: tc.collected.load(Ordering::Relaxed),
            garbage_nodes: i.tree.garbage_nodes() as u64,
            snapshots: i.tree.snapshots.lock().entries.len() as u64,
            snapshots_taken: tc.snapshots_taken.load(Ordering::Relaxed),
            checkpoint_images_written_early: tc
                .checkpoint_images_written_early
                .load(Ordering::Relaxed),
            subtrees_dropped: tc.subtrees_dropped.load(Ordering::Relaxed),
            sharing: self.sharing(),
            range_move_drains: tc.range_move_drains.load(Ordering::Relaxed),
            leaf_bytes_relifted: tc.leaf_bytes_relifted.load(Ordering::Relaxed),
            rekeys_deferred: tc.rekeys_deferred.load(Ordering::Relaxed),
            rekeys_cancelled: tc.rekeys_cancelled.load(Ordering::Relaxed),
            checkpoints: i.ckpt.count.load(Ordering::Relaxed),
            checkpoint_requests_dropped: i
                .counters
                .checkpoint_requests_dropped
                .load(Ordering::Relaxed),
            checkpoint_seconds: i.ckpt.nanos.load(Ordering::Relaxed) as f64 / 1e9,
            syncs: i.counters.syncs.load(Ordering::Relaxed),
            generation,
            free_bytes: free * BLOCK_SIZE as u64,
            data_bytes: total * BLOCK_SIZE as u64,
            free_extents: frag,
            space: self.space_use(),
            device_bytes: i.dev.len(),
            opened_after_crash: i.opened_after_crash,
            recovered_records: i.recovered_records,
            recovery_stop: i.recovery_stop.clone(),
            skipped_records: i.skipped_records,
            needs_check,
            failure: i.failure().map(|e| e.to_string()),
            known_damage: if i.damage.load(Ordering::Acquire) {
                Some(
                    i.damage_detail.lock().clone().unwrap_or_else(|| {
                        "recorded in the superblock by an earlier session".into()
                    }),
                )
            } else {
                None
            },
            superblock_notes: i.superblock_notes.clone(),
        }
    }
}
