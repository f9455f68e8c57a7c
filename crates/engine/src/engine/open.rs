//! Creating an image and opening one: loading the last checkpoint, healing the superblock
//! copies, a repair's survey and rebuild, replaying the log, and assembling the engine.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use amaranth_device::{BlockDevice, BLOCK_SIZE};
use parking_lot::{Condvar, Mutex};

use super::checkpoint::Checkpointer;
use super::{atomic, Engine, EngineCounters, Inner, WakeState};
use crate::apply;
use crate::config::{Format, Options};
use crate::copies::Located;
use crate::datatable::DataTable;
use crate::error::{Error, Result};
use crate::load::{load_checkpoint, Loaded};
use crate::node::{Node, ROOT_ID};
use crate::ops::Op;
use crate::salvage::{self, SalvageReport};
use crate::store::{Allocator, Btt, Store};
use crate::superblock::{backup_blocks, Extent, Superblock, FORMAT_VERSION};
use crate::tree::Tree;
use crate::wal::{self, Log, LogPosition, Lsn, Recovered};

pub(super) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ (std::process::id() as u64) << 32;
    }
    u64::from_le_bytes(b)
}

impl Engine {
    /// Creates a new, empty store on `dev` (everything on the device is lost).
    pub fn create(dev: Arc<dyn BlockDevice>, format: Format, options: Options) -> Result<Engine> {
        format.validate()?;
        options.validate(&format)?;
        let layout = Layout::plan(&*dev, &format)?;
        // Invalidate whatever image was there before, backups included.
        Checkpointer::clear_copies(&*dev, &layout.backups)?;
        // The log's ring is written once now: a log write into a host hole or reserved extent
        // (a sparse image, a loop device over one) changes the host's metadata, and every
        // `fsync` of the log's first pass would wait for the host's journal too (DESIGN.md, the
        // log: "Provisioned at creation").
        dev.provision(2 * BLOCK_SIZE as u64, layout.log_blocks * BLOCK_SIZE as u64)
            .map_err(|e| Error::io("writing the log's blocks", e))?;
        let epoch = random_u64() >> 1;
        let sb = layout.superblock(&format, epoch);
        let mut tree = Tree::new(
            format,
            Arc::new(Store::new(
                dev.clone(),
                layout.empty_btt(),
                DataTable::default(),
            )),
            options.cache_size,
            ROOT_ID + 1,
            1,
        );
        tree.check_invariants |= options.check_invariants;
        tree.cache.insert(ROOT_ID, Node::empty_leaf(), true, 0);
        let log = Log::new(
            dev.clone(),
            2 * BLOCK_SIZE as u64,
            layout.log_blocks * BLOCK_SIZE as u64,
            options.checkpoint_log_fraction,
            LogPosition {
                epoch,
                voff: 0,
                next_lsn: 1,
            },
        );
        let engine = Engine::assemble(dev, tree, log, options, sb, false, 0);
        engine.inner.checkpoint(false)?;
        engine.start_threads();
        Ok(engine)
    }

    /// Opens an existing store, replaying the log after its last checkpoint.
    ///
    /// A log record that cannot be applied (it does not decode, or it would write a key or value
    /// past the format's limits; only a writer with a bug logs one, since every batch is checked
    /// before it is logged) does not make the image unopenable: it is skipped whole, with an error
    /// in the log, counted in [`Stats::skipped_records`], and the image is flagged for a check
    /// ([`Stats::needs_check`], kept in the superblock).
    pub fn open(dev: Arc<dyn BlockDevice>, options: Options) -> Result<Engine> {
        let Loaded {
            located,
            mut sb,
            tree,
            ..
        } = load_checkpoint(&dev, &options)?;
        if sb.damaged && !options.read_only && !options.salvage {
            return Err(Error::Damaged(format!(
                "recorded by checkpoint {} when a read found a damaged node",
                sb.generation
            )));
        }
        if !options.read_only {
            // Before anything is written: the backups must describe this checkpoint before the
            // allocator hands out blocks an older one still uses.
            Checkpointer::heal_copies(&*dev, &located)?;
        }
        let mut salvaged = if options.salvage {
            Some(salvage_tree(&tree, &located)?)
        } else {
            None
        };
        let replay = replay_log(&*dev, &tree, &mut sb, &options)?;
        if let Some(e) = replay.recovered.damage.clone() {
            match &mut salvaged {
                Some(report) => report.log = Some(e.to_string()),
                None => return Err(e),
            }
        }
        if let (Some(report), Some(stop)) = (&mut salvaged, replay.stop) {
            report.log = Some(stop);
        }
        let recovered = replay.recovered;
        let log = reopen_log(dev.clone(), &sb, &options, &recovered);
        let after_crash = !sb.clean;
        let read_only = options.read_only;
        let damaged = sb.damaged;
        let mut engine =
            Engine::assemble(dev, tree, log, options, sb, after_crash, replay.replayed);
        if let Some(inner) = Arc::get_mut(&mut engine.inner) {
            inner.recovery_stop = recovered.stop_reason;
            inner.skipped_records = replay.skipped;
            inner.superblock_notes = located.describe();
            inner.damage = AtomicBool::new(damaged && !inner.options.salvage);
            inner.salvaged = salvaged;
        }
        if !read_only {
            // A checkpoint starts a new log epoch: chunks left from before can never be replayed.
            engine.inner.checkpoint(false)?;
            engine.inner.note_space_baseline();
            engine.start_threads();
        }
        Ok(engine)
    }

    pub(super) fn assemble(
        dev: Arc<dyn BlockDevice>,
        tree: Tree,
        log: Log,
        options: Options,
        sb: Superblock,
        opened_after_crash: bool,
        recovered_records: u64,
    ) -> Engine {
        let store = tree.store.clone();
        log.set_flush_barrier(Box::new(move || store.writer.barrier()));
        Engine {
            snap: None,
            inner: Arc::new(Inner {
                dev,
                tree,
                log,
                options,
                ckpt: Checkpointer::new(sb),
                failed: Mutex::new(None),
                closed: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                wake: Condvar::new(),
                wake_state: Mutex::new(WakeState::default()),
                counters: EngineCounters::default(),
                // After a crash the tree may hold range deletes nobody pushed down yet.
                deletes_seen: AtomicU64::new(opened_after_crash as u64),
                deletes_pushed: AtomicU64::new(0),
                space_baseline: AtomicU64::new(0),
                opened_after_crash,
                recovered_records,
                recovery_stop: String::new(),
                skipped_records: 0,
                mode: parking_lot::RwLock::new(()),
                damage: AtomicBool::new(false),
                damage_detail: Mutex::new(None),
                superblock_notes: Vec::new(),
                salvaged: None,
                groups: atomic::Groups::default(),
            }),
            threads: Mutex::new(Vec::new()),
        }
    }
}

/// Where a new image puts its log, its data and its backup superblocks on a device.
struct Layout {
    dev_blocks: u64,
    backups: Vec<u64>,
    log_blocks: u64,
    /// The first block of the data area (after the two superblocks and the log).
    data_start: u64,
}

impl Layout {
    /// The layout of a new image with `format` on `dev`, or [`Error::TooSmall`] when the device
    /// cannot hold the log and a few nodes.
    fn plan(dev: &dyn BlockDevice, format: &Format) -> Result<Layout> {
        let dev_len = dev.len();
        let dev_blocks = dev_len / BLOCK_SIZE as u64;
        let backups = backup_blocks(dev_blocks);
        // The log lies before the first backup copy (a quarter of the device).
        let max_log = backups[0].saturating_sub(2) * BLOCK_SIZE as u64;
        let log_size = format
            .log_size
            .unwrap_or_else(|| (dev_len / 16).clamp(4 << 20, 256 << 20).min(max_log))
            .max(16 * BLOCK_SIZE as u64)
            / BLOCK_SIZE as u64
            * BLOCK_SIZE as u64;
        let log_blocks = log_size / BLOCK_SIZE as u64;
        let data_start = 2 + log_blocks;
        let min_data = (8 * format.node_size / BLOCK_SIZE) as u64;
        if dev_blocks < data_start + min_data {
            return Err(Error::TooSmall(format!(
                "{} has {} bytes; an image with a {} MiB log and {} KiB nodes needs at least {} bytes",
                dev.describe(),
                dev_len,
                log_size >> 20,
                format.node_size >> 10,
                (data_start + min_data) * BLOCK_SIZE as u64
            )));
        }
        if log_size > max_log {
            return Err(Error::TooSmall(format!(
                "{} has {} bytes; a {} KiB log must fit in the first quarter of the device (the \
                 first backup superblock follows it), so the device needs at least {} bytes",
                dev.describe(),
                dev_len,
                log_size >> 10,
                4 * (log_size + 2 * BLOCK_SIZE as u64)
            )));
        }
        Ok(Layout {
            dev_blocks,
            backups,
            log_blocks,
            data_start,
        })
    }

    /// The superblock of a new, empty image (a new uuid; its log starts at `epoch`).
    fn superblock(&self, format: &Format, epoch: u64) -> Superblock {
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&random_u64().to_le_bytes());
        uuid[8..].copy_from_slice(&random_u64().to_le_bytes());
        Superblock {
            version: FORMAT_VERSION,
            generation: 0,
            uuid,
            device_blocks: self.dev_blocks,
            node_size: format.node_size as u32,
            partition_size: format.partition_size as u32,
            max_fanout: format.max_fanout as u32,
            max_key_len: format.max_key_len as u32,
            max_value_len: format.max_value_len as u32,
            compression: format.compression.code(),
            clean: false,
            needs_check: false,
            log_start_block: 2,
            log_blocks: self.log_blocks,
            log_epoch: epoch,
            log_tail_voff: 0,
            log_tail_lsn: 1,
            ckpt_lsn: 1,
            next_msn: 1,
            next_node_id: ROOT_ID + 1,
            root_id: ROOT_ID,
            btt: Extent {
                block: self.data_start,
                blocks: 1,
            },
            btt_crc: 0,
            btt_count: 0,
            // The first checkpoint writes the table.
            data_table: Some(Extent {
                block: self.data_start,
                blocks: 1,
            }),
            data_table_crc: 0,
            data_table_runs: 0,
            created_unix: now_unix(),
            checkpoint_unix: 0,
            label: String::new(),
            damaged: false,
            backups: self.backups.clone(),
        }
    }

    /// An empty block translation table whose allocator owns the data area less the backup
    /// superblocks.
    fn empty_btt(&self) -> Btt {
        let mut alloc = Allocator::new(self.data_start, self.dev_blocks);
        for &b in &self.backups {
            assert!(
                alloc.claim(Extent {
                    block: b,
                    blocks: 1
                }),
                "backup block {b} outside the free data area"
            );
        }
        Btt::empty(alloc)
    }
}

/// A repair's survey of the loaded tree, rebuilding it from what is intact when it finds damage.
fn salvage_tree(tree: &Tree, located: &Located) -> Result<SalvageReport> {
    let mut report = salvage::survey(tree)?;
    if !report.damage.is_empty() {
        log::warn!(
            "amaranth engine: {} damaged nodes, partitions or buffers; rebuilding the tree from \
             what is intact",
            report.damage.len()
        );
        report = salvage::rebuild(tree)?;
        // The references that sat in damaged nodes are gone: their blocks are released.
        let recount = tree.recount_refs()?;
        tree.store.data.lock().settle_recount(&recount)?;
    }
    report.superblock = located.describe();
    Ok(report)
}

/// What replaying the log after the checkpoint did.
struct Replayed {
    recovered: Recovered,
    /// Records that could not be applied and were skipped.
    skipped: u64,
    /// Why a repair stopped replaying early (a record whose application hit damage).
    stop: Option<String>,
    /// Records applied.
    replayed: u64,
}

/// Replays the log records after `sb`'s checkpoint into `tree`, dropping an atomic group that
/// never committed (with what was logged after its first record) and flagging `sb` for a check
/// when a record had to be skipped.
///
/// Out-of-line data (docs/WRITEONCE.md §3): a first pass over the log claims every data extent
/// its records after the checkpoint name, so that nothing replay writes is placed over them. The
/// replay then checks the blocks of each such record past the last LSN a chunk declares durable
/// against their checksums: a record whose data did not reach the device (a power cut between
/// the data write and a flush, a torn data write) was never acknowledged as durable, and the
/// replayed prefix ends before it. Extents of records not replayed are freed again.
fn replay_log(
    dev: &dyn BlockDevice,
    tree: &Tree,
    sb: &mut Superblock,
    options: &Options,
) -> Result<Replayed> {
    let ckpt_lsn = sb.ckpt_lsn;
    let (named, max_durable) = claim_logged_data(dev, tree, sb)?;
    tree.store.data.lock().replayed = Some(Vec::new());
    let mut skipped = 0u64;
    // A repair replays what it can: a record whose application hits damage ends the replay.
    let mut replay_stop: Option<String> = None;
    let mut replay = atomic::Replay::default();
    let recovered = recover_log(dev, sb, !sb.clean, |lsn, payload| {
        if lsn >= ckpt_lsn && lsn >= max_durable {
            if let Some(exts) = named.get(&lsn) {
                if let Some(why) = check_logged_data(tree, lsn, exts)? {
                    return Ok(Some(why));
                }
            }
        }
        replay.record(lsn, payload, &mut |lsn, payload| {
            if lsn < ckpt_lsn || replay_stop.is_some() {
                return Ok(());
            }
            match apply::replay_record(tree, lsn, payload, &mut skipped) {
                Err(e) if options.salvage && e.is_damage() => {
                    replay_stop = Some(format!("log record {lsn} could not be replayed: {e}"));
                    Ok(())
                }
                r => r,
            }
        })?;
        Ok(None)
    })?;
    release_unreplayed(tree, &named);
    let dropped = match replay.finish() {
        Some((group, records)) => {
            log::warn!(
                "amaranth engine: atomic group {group} never committed: its records and \
                 everything logged after its first one ({records} records) were dropped"
            );
            records as u64
        }
        None => 0,
    };
    if skipped > 0 {
        // Kept in the superblock (the next checkpoint writes it) until a check clears it.
        sb.needs_check = true;
        log::error!(
            "amaranth engine: {skipped} log records could not be applied; run `amaranth fsck`"
        );
    }
    let replayed = (recovered.records - dropped).min(
        recovered
            .next_lsn
            .saturating_sub(ckpt_lsn)
            .saturating_sub(dropped),
    );
    Ok(Replayed {
        recovered,
        skipped,
        stop: replay_stop,
        replayed,
    })
}

/// [`wal::recover`] of `sb`'s log from its checkpoint's tail.
fn recover_log(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    check_damage: bool,
    apply: impl FnMut(Lsn, &[u8]) -> Result<Option<String>>,
) -> Result<Recovered> {
    wal::recover(
        dev,
        sb.log_start_block * BLOCK_SIZE as u64,
        sb.log_blocks * BLOCK_SIZE as u64,
        sb.log_epoch,
        sb.log_tail_voff,
        sb.log_tail_lsn,
        check_damage,
        apply,
    )
}

/// The data extents (and their blocks' checksums) each log record after `sb`'s checkpoint names,
/// by LSN.
type Named = HashMap<Lsn, Vec<(Extent, Vec<u32>)>>;

/// The first pass of a replay: claims in the allocator every data extent a record after the
/// checkpoint names (a record that does not decode names none: replay skips it). Returns them by
/// record, and the highest LSN a chunk declares durable.
fn claim_logged_data(dev: &dyn BlockDevice, tree: &Tree, sb: &Superblock) -> Result<(Named, Lsn)> {
    let mut named = Named::new();
    let format = &tree.format;
    let scan = recover_log(dev, sb, false, |lsn, payload| {
        if lsn < sb.ckpt_lsn {
            return Ok(None);
        }
        let Ok((_, ops)) = crate::ops::decode_record(payload, format) else {
            return Ok(None);
        };
        for op in ops {
            if let Op::PutBlocks { data, .. } = &op {
                let (block, crcs) = data.placed().expect("a logged record is placed");
                let e = Extent {
                    block,
                    blocks: crcs.len() as u64,
                };
                named.entry(lsn).or_default().push((e, crcs.to_vec()));
            }
        }
        Ok(None)
    })?;
    let mut btt = tree.store.btt.lock();
    for (lsn, exts) in &named {
        for (e, _) in exts {
            if !btt.alloc.claim(*e) {
                return Err(Error::Corrupt(format!(
                    "log record {lsn} names data blocks {}..{} that are in use",
                    e.block,
                    e.block + e.blocks
                )));
            }
        }
    }
    Ok((named, scan.max_durable))
}

/// Checks the data blocks record `lsn` names against their checksums: `Some(why)` when one does
/// not match (the record is not part of the log's valid prefix).
fn check_logged_data(tree: &Tree, lsn: Lsn, exts: &[(Extent, Vec<u32>)]) -> Result<Option<String>> {
    for (e, crcs) in exts {
        let data = tree.store.read(e.offset(), e.len(), "data blocks")?;
        for (i, (block, crc)) in data.chunks_exact(BLOCK_SIZE).zip(crcs).enumerate() {
            if crate::codec::crc(block) != *crc {
                return Ok(Some(format!(
                    "log record {lsn}: data block {} did not reach the device",
                    e.block + i as u64
                )));
            }
        }
    }
    Ok(None)
}

/// Frees the extents the log names whose records were not replayed (after the replayed prefix,
/// skipped, or in a dropped atomic group); replayed ones hold references now.
fn release_unreplayed(tree: &Tree, named: &Named) {
    let replayed: HashSet<Extent> = tree
        .store
        .data
        .lock()
        .replayed
        .take()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut btt = tree.store.btt.lock();
    for (e, _) in named.values().flatten() {
        if !replayed.contains(e) {
            btt.alloc.free(*e);
        }
    }
}

/// The log of an opened image, resuming after what recovery found (in a new epoch unless
/// read-only).
fn reopen_log(
    dev: Arc<dyn BlockDevice>,
    sb: &Superblock,
    options: &Options,
    recovered: &Recovered,
) -> Log {
    let epoch = if options.read_only {
        sb.log_epoch
    } else {
        sb.log_epoch.wrapping_add(1)
    };
    Log::new(
        dev,
        sb.log_start_block * BLOCK_SIZE as u64,
        sb.log_blocks * BLOCK_SIZE as u64,
        options.checkpoint_log_fraction,
        LogPosition {
            epoch,
            voff: recovered.resume_voff,
            next_lsn: recovered.next_lsn.max(sb.ckpt_lsn),
        },
    )
}
