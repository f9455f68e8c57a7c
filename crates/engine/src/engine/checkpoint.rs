//! The checkpoint protocol, owned by one type: [`Checkpointer`].
//!
//! A checkpoint writes every dirty node copy-on-write (never over a block the previous checkpoint
//! references), then the block translation table, then a superblock that points at the table:
//! the primary copy (slot `generation % 2`) first, made durable, then the backup copies, made
//! durable, and only then are the previous checkpoint's extents freed. The superblock switch is
//! what makes a checkpoint current; the log's tail then moves past what it covers.
//!
//! The checkpointer keeps the current superblock (with the changes the next checkpoint will
//! write: identity, the check flag) and is the only code that writes superblock copies: a
//! checkpoint, a damage flag recorded at once, the healing of copies at a read-write open and the
//! clearing of old copies by `create` all go through it. Before a copy is written it asserts the
//! superblock's invariants ([`Checkpointer::assert_successor`], `Superblock::validate`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use amaranth_device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use parking_lot::{Mutex, MutexGuard};

use super::Inner;
use crate::cache::CachedNode;
use crate::copies::Located;
use crate::datatable::RunMap;
use crate::error::{Error, Result};
use crate::node::{NodeId, ROOT_ID};
use crate::store::{self, Placement};
use crate::superblock::{Extent, Superblock, FORMAT_VERSION, LIFTED_VERSION};

/// Owner of the checkpoint protocol and of the current superblock.
pub(crate) struct Checkpointer {
    /// The superblock of the current checkpoint, with the changes the next one writes.
    sb: Mutex<Superblock>,
    /// Held by a running checkpoint, and by whoever changes the superblock meanwhile (a change
    /// made while a checkpoint runs would be lost when it installs the copy it started from).
    lock: Mutex<()>,
    /// Checkpoints completed, and the time they took.
    pub(super) count: AtomicU64,
    pub(super) nanos: AtomicU64,
}

/// What a checkpoint captured when it began (under the tree's writers lock).
struct Begun {
    tail_voff: u64,
    tail_lsn: u64,
    ckpt_lsn: u64,
    next_msn: u64,
    next_node_id: u64,
    pending: Vec<Arc<CachedNode>>,
    /// The data table of the references the checkpoint's tree holds, and its runs.
    data_table: AlignedBuf,
    data_runs: u64,
    /// The snapshot catalog of the checkpoint's tree, encoded (`None`: no snapshot).
    catalog: Option<Vec<u8>>,
}

/// Extents a checkpoint wrote for its tables, freed again if it fails.
#[derive(Default)]
struct Tables {
    btt: Option<Extent>,
    data: Option<Extent>,
}

/// Node images written by the checkpoint: `(node, new extent, extent it replaces)`.
type Saved = Vec<(NodeId, Extent, Option<Extent>)>;

/// Which copies of a superblock to write, in which order.
#[derive(Clone, Copy)]
enum Copies {
    /// A new checkpoint: the primary copy, durable, then the backups.
    PrimaryThenBackups,
    /// The current checkpoint rewritten (damage flag): the backups first, so that a torn write
    /// of the primary copy still leaves this checkpoint in them.
    BackupsThenPrimary,
}

impl Checkpointer {
    pub(super) fn new(sb: Superblock) -> Checkpointer {
        Checkpointer {
            sb: Mutex::new(sb),
            lock: Mutex::new(()),
            count: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }

    /// Holds checkpoints off while the guard lives.
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// The current superblock, to read or (holding the guard; only before the next checkpoint
    /// could run, as a switch to writable does) to change.
    pub(super) fn superblock(&self) -> MutexGuard<'_, Superblock> {
        self.sb.lock()
    }

    /// The generation of the current checkpoint and whether the image asks for a check.
    pub(super) fn generation_and_check(&self) -> (u64, bool) {
        let sb = self.sb.lock();
        (sb.generation, sb.needs_check)
    }

    /// The image's uuid and label.
    pub(super) fn identity(&self) -> ([u8; 16], String) {
        let sb = self.sb.lock();
        (sb.uuid, sb.label.clone())
    }

    /// Sets the uuid and label the next checkpoint writes.
    pub(super) fn set_identity(&self, uuid: [u8; 16], label: &str) {
        let mut sb = self.sb.lock();
        sb.uuid = uuid;
        sb.label = label.to_string();
    }

    /// Clears the check flag (the next checkpoint writes it). Not while a checkpoint runs: it
    /// would put back the copy it started from.
    pub(super) fn clear_needs_check(&self) {
        let _c = self.lock.lock();
        self.sb.lock().needs_check = false;
    }

    /// Writes a checkpoint (see the module documentation). `clean` marks the image cleanly closed.
    pub(super) fn run(&self, inner: &Inner, clean: bool) -> Result<()> {
        if let Some(e) = inner.failure() {
            return Err(Error::ReadOnly(e.to_string()));
        }
        let _c = self.lock.lock();
        let started = Instant::now();
        // Records buffered now are covered by this checkpoint; writing them first lets the log's
        // tail move past them.
        inner.log.flush(false)?;
        let mut begun = self.begin(inner)?;
        let mut tables = Tables::default();
        let mut saved = Vec::new();
        let result = self.write(inner, clean, &mut begun, &mut tables, &mut saved);
        match result {
            Ok(sb) => {
                let tree = &inner.tree;
                tree.store.btt.lock().complete_checkpoint(sb.btt);
                {
                    // Blocks released before the checkpoint began: neither its tree nor a
                    // record after its tail names them.
                    let mut data = tree.store.data.lock();
                    let table = sb
                        .data_table
                        .expect("a format-4 checkpoint has a data table");
                    let freed = data.complete_checkpoint(table);
                    let mut btt = tree.store.btt.lock();
                    for e in freed {
                        btt.alloc.free(e);
                    }
                }
                tree.adopt_checkpoint_images(&saved);
                inner.log.set_tail(begun.tail_voff);
                *self.sb.lock() = sb;
                // Damage found while this checkpoint ran and not in its superblock: record it.
                self.persist_damage(inner);
                // The space this checkpoint let go of (and what was freed since the last one)
                // goes back to the device.
                if inner.options.discard {
                    tree.store.discard_freed();
                }
                self.count.fetch_add(1, Ordering::Relaxed);
                self.nanos
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let tree = &inner.tree;
                tree.store.data.lock().abort_checkpoint();
                if let Some(t) = tables.data {
                    tree.store.btt.lock().alloc.free(t);
                }
                tree.store.btt.lock().abort_checkpoint(tables.btt);
                // Only a checkpoint marks nodes pending, and this one holds `lock`.
                for cn in tree.cache.all() {
                    cn.meta.lock().pending = false;
                }
                tree.clear_checkpoint_queue();
                inner.fail(&e);
                Err(e)
            }
        }
    }

    /// Captures the state the checkpoint describes, at a point where no atomic group has records
    /// (a checkpoint keeps no part of an uncommitted group: engine/atomic.rs), and marks the dirty
    /// nodes it will write.
    fn begin(&self, inner: &Inner) -> Result<Begun> {
        let tree = &inner.tree;
        loop {
            inner.settle_for_checkpoint()?;
            let _w = tree.writers.write();
            if inner.groups.has_records() {
                continue;
            }
            // Clean leaves this checkpoint rewrites next to their dirty neighbours.
            tree.relocate_for_order();
            let (tail_voff, tail_lsn) = inner.log.replay_start();
            let ckpt_lsn = inner.log.next_lsn();
            let mut btt = tree.store.btt.lock();
            btt.in_progress = Some(btt.current.clone());
            btt.refs_in_progress = Some(tree.counts_to_write(&btt.refs));
            drop(btt);
            let mut pending = Vec::new();
            for cn in tree.cache.all() {
                let mut m = cn.meta.lock();
                if m.dirty && !m.deleted {
                    m.pending = true;
                    drop(m);
                    pending.push(cn);
                }
            }
            let (data_table, data_runs) = {
                let mut d = tree.store.data.lock();
                (d.begin_checkpoint(), d.refs.runs() as u64)
            };
            let catalog = {
                let c = tree.snapshots.lock();
                (!c.entries.is_empty()).then(|| c.encode())
            };
            return Ok(Begun {
                catalog,
                data_table,
                data_runs,
                tail_voff,
                tail_lsn,
                ckpt_lsn,
                next_msn: tree.next_msn.load(Ordering::Relaxed),
                next_node_id: tree.next_node_id.load(Ordering::Relaxed),
                pending,
            });
        }
    }

    /// Writes the nodes, the table and the superblock copies; returns the superblock written.
    fn write(
        &self,
        inner: &Inner,
        clean: bool,
        begun: &mut Begun,
        tables: &mut Tables,
        saved: &mut Saved,
    ) -> Result<Superblock> {
        let tree = &inner.tree;
        // Each node is let go once written, so eviction can take it (clean now) while the
        // checkpoint goes on: under memory pressure the cache must not hold every node that
        // was dirty when the checkpoint began until it ends.
        // Images that modifiers saved meanwhile are written as they come, not held to the end.
        // The nodes go in key order into one run of contiguous free space (as far as there is
        // any), sized by what the dirty nodes' images are expected to take.
        tree.sort_for_placement(&mut begun.pending);
        let mut run = Placement::new(tree.cache.dirty_space().next_blocks);
        for cn in begun.pending.drain(..) {
            saved.extend(tree.checkpoint_write(&cn, &mut run)?);
            saved.extend(tree.drain_checkpoint_queue(&mut run)?);
        }
        saved.extend(tree.drain_checkpoint_queue(&mut run)?);
        let c = &tree.store.counters;
        c.run_extents.fetch_add(run.extents, Ordering::Relaxed);
        c.run_contiguous
            .fetch_add(run.contiguous, Ordering::Relaxed);
        let (table, count) = {
            let btt = tree.store.btt.lock();
            let ip = btt.in_progress.as_ref().expect("checkpoint in progress");
            if !ip.contains_key(&ROOT_ID) {
                return Err(Error::Corrupt("checkpoint without a root".into()));
            }
            let counts = btt
                .refs_in_progress
                .as_ref()
                .expect("checkpoint in progress");
            (
                store::encode_btt_with_catalog(ip, counts, begun.catalog.as_deref()),
                ip.len() as u64,
            )
        };
        let ext = tree.store.write_new(&table, "block translation table")?;
        tables.btt = Some(ext);
        let data_ext = tree.store.write_new(&begun.data_table, "data table")?;
        tables.data = Some(data_ext);
        tree.store.flush("checkpoint nodes")?;
        let mut sb = self.sb.lock().clone();
        // A format-3 image becomes format 4 here (its data table is the first one).
        sb.version = FORMAT_VERSION;
        sb.data_table = Some(data_ext);
        sb.data_table_runs = begun.data_runs;
        sb.data_table_crc =
            store::table_crc(&begun.data_table[..RunMap::encoded_len(begun.data_runs)]);
        sb.generation += 1;
        sb.clean = clean;
        sb.log_epoch = inner.log.epoch();
        sb.log_tail_voff = begun.tail_voff;
        sb.log_tail_lsn = begun.tail_lsn;
        sb.ckpt_lsn = begun.ckpt_lsn;
        sb.next_msn = begun.next_msn;
        sb.next_node_id = begun.next_node_id;
        sb.btt = ext;
        sb.btt_crc = store::table_crc(&table[..32 + count as usize * 24]);
        sb.btt_count = count;
        sb.checkpoint_unix = super::open::now_unix();
        sb.damaged = inner.damage.load(Ordering::Acquire);
        self.assert_successor(&sb);
        write_copies(inner, &sb, Copies::PrimaryThenBackups)?;
        Ok(sb)
    }

    /// Asserts what holds between the current superblock and the next checkpoint's: the
    /// generation goes up by one; the image's geometry and format never change (older formats
    /// become current only through `amaranth upgrade`); the counters and the log's checkpoint LSN
    /// never go back; and the new one is valid as `Superblock::decode` checks it.
    fn assert_successor(&self, next: &Superblock) {
        let prev = self.sb.lock();
        assert_eq!(
            next.generation,
            prev.generation + 1,
            "checkpoint generation"
        );
        assert!(
            next.version == prev.version
                || (prev.version == LIFTED_VERSION && next.version == FORMAT_VERSION),
            "superblock version {} after {}",
            next.version,
            prev.version
        );
        assert_eq!(
            (next.device_blocks, next.node_size, next.partition_size),
            (prev.device_blocks, prev.node_size, prev.partition_size),
            "image geometry changed"
        );
        assert_eq!(
            (next.max_fanout, next.max_key_len, next.max_value_len),
            (prev.max_fanout, prev.max_key_len, prev.max_value_len),
            "format changed"
        );
        assert_eq!(
            (next.log_start_block, next.log_blocks, next.root_id),
            (prev.log_start_block, prev.log_blocks, prev.root_id),
            "log region or root changed"
        );
        assert!(next.next_msn >= prev.next_msn, "message numbers went back");
        assert!(next.next_node_id >= prev.next_node_id, "node ids went back");
        assert!(next.ckpt_lsn >= prev.ckpt_lsn, "checkpoint LSN went back");
        assert!(next.btt_count > 0, "a checkpoint without a table");
    }

    /// Records damage a read found in the current checkpoint's superblock copies at once, unless
    /// a checkpoint runs: it records it itself (it looks at the flag once its superblock is
    /// written). Never waits for it: the checkpoint may be the reader that found the damage.
    pub(super) fn record_damage(&self, inner: &Inner) {
        if let Some(_c) = self.lock.try_lock() {
            self.persist_damage(inner);
        }
    }

    /// Rewrites the current checkpoint's superblock copies with the damage flag set. Call with
    /// `lock` held.
    fn persist_damage(&self, inner: &Inner) {
        let mut sb = self.sb.lock().clone();
        // Read-only writes nothing (a switch to read-only sets the mode before it takes
        // `lock` for its last checkpoint, which records the flag itself).
        if sb.damaged || !inner.damage.load(Ordering::Acquire) || inner.tree.is_read_only() {
            return;
        }
        sb.damaged = true;
        match write_copies(inner, &sb, Copies::BackupsThenPrimary) {
            Ok(()) => *self.sb.lock() = sb,
            Err(e) => {
                log::error!("amaranth engine: cannot record the damage in the superblock: {e}")
            }
        }
    }

    /// Rewrites the copies `located.heal` names with `located.sb`, then flushes. Called by a
    /// read-write open (and a switch to writable) before anything else is written, so that every
    /// backup describes a checkpoint whose blocks are intact before the allocator may reuse
    /// older ones.
    pub(crate) fn heal_copies(dev: &dyn BlockDevice, located: &Located) -> Result<()> {
        if located.heal.is_empty() {
            return Ok(());
        }
        assert_valid(&located.sb);
        for &b in &located.heal {
            write_copy(dev, &located.sb, b)?;
        }
        dev.flush()
            .map_err(|e| Error::io("flushing repaired superblock copies", e))
    }

    /// Zeroes every superblock location of a device about to get a new image (`create`), so that
    /// no copy of the image that was there before can be taken for one of the new image.
    pub(crate) fn clear_copies(dev: &dyn BlockDevice, backups: &[u64]) -> Result<()> {
        let zero = AlignedBuf::zeroed(BLOCK_SIZE);
        for b in [0, 1].iter().chain(backups) {
            dev.write_at(b * BLOCK_SIZE as u64, &zero)
                .map_err(|e| Error::io("clearing the superblocks", e))?;
        }
        dev.flush()
            .map_err(|e| Error::io("clearing the superblocks", e))
    }
}

/// Writes `sb`'s copies in the given order, each group made durable before the next.
fn write_copies(inner: &Inner, sb: &Superblock, order: Copies) -> Result<()> {
    assert_valid(sb);
    let dev = &*inner.dev;
    let store = &inner.tree.store;
    match order {
        // The backups follow once the primary copy is durable, and are durable themselves
        // before the previous checkpoint's extents are freed: a backup always describes a
        // checkpoint whose blocks are intact.
        Copies::PrimaryThenBackups => {
            write_primary(dev, sb)?;
            store.flush("superblock")?;
            if !sb.backups.is_empty() {
                write_backups(dev, sb)?;
                store.flush("superblock backups")?;
            }
            Ok(())
        }
        Copies::BackupsThenPrimary => {
            write_backups(dev, sb)?;
            store.flush("superblock backups (damage flag)")?;
            write_primary(dev, sb)?;
            store.flush("superblock (damage flag)")
        }
    }
}

fn assert_valid(sb: &Superblock) {
    if let Err(e) = sb.validate() {
        panic!(
            "writing an invalid superblock (generation {}): {e}",
            sb.generation
        );
    }
}

/// Writes `sb` into its primary slot (`generation % 2`).
pub(crate) fn write_primary(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    write_copy(dev, sb, sb.generation % 2)
}

/// Writes `sb` into its backup copies (none in version 1).
pub(crate) fn write_backups(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    for &b in &sb.backups {
        write_copy(dev, sb, b)?;
    }
    Ok(())
}

/// Writes `sb` at `block` (a primary slot or a backup location): the one place that writes a
/// superblock copy to a device.
pub(crate) fn write_copy(dev: &dyn BlockDevice, sb: &Superblock, block: u64) -> Result<()> {
    assert!(
        block < 2 || sb.backups.contains(&block),
        "block {block} is not a superblock location"
    );
    dev.write_at(block * BLOCK_SIZE as u64, &sb.encode())
        .map_err(|e| Error::io(format!("writing the superblock copy at block {block}"), e))
}

/// Wrappers the rest of the engine calls.
impl Inner {
    /// Writes a checkpoint, unless the engine is read-only.
    pub(super) fn checkpoint(&self, clean: bool) -> Result<()> {
        if self.tree.is_read_only() {
            return Ok(());
        }
        self.ckpt.run(self, clean)
    }

    /// `checkpoint` whatever the mode (a switch to read-only writes its last checkpoint with this).
    pub(super) fn checkpoint_now(&self, clean: bool) -> Result<()> {
        self.ckpt.run(self, clean)
    }
}
