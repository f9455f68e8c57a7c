//! The stores under test behind one small trait. Every store gets its writes in batches of the
//! same size (one `Batch` / `WriteBatch` / write transaction each).

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(feature = "rocksdb")]
use std::time::{Duration, Instant};

use amaranth_device::FileDevice;
use amaranth_engine::{Batch, Compression, Engine, Format, Options, Patch};

pub type Res<T> = Result<T, String>;

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// How a reopened store will be read (LMDB turns kernel readahead on only for scans).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    Random,
    Sequential,
}

pub trait Store {
    /// Writes the items as one batch. A store may take them, leaving the vector empty (Amaranth's
    /// batch owns its keys and values); RocksDB and LMDB copy from them. The caller clears the
    /// vector before the next batch either way, in the timed loop.
    fn put_batch(&mut self, items: &mut Vec<(Vec<u8>, Vec<u8>)>) -> Res<()>;
    /// Writes `data` at `offset` into each key's value.
    fn upsert_batch(&mut self, items: &[(Vec<u8>, u32, [u8; 4])]) -> Res<()>;
    /// Length of the value, if present.
    fn get(&mut self, key: &[u8]) -> Res<Option<usize>>;
    /// Visits `[lo, hi)` in order; returns (entries, key+value bytes).
    fn scan(&mut self, lo: &[u8], hi: &[u8]) -> Res<(u64, u64)>;
    /// Removes every key in `[lo, hi)`; returns the keys removed if the store knows (LMDB).
    fn range_delete(&mut self, lo: &[u8], hi: &[u8]) -> Res<Option<u64>>;
    /// Makes everything durable and finishes the background work the phase caused
    /// (Amaranth: checkpoint; RocksDB: flush memtables and wait for compactions; LMDB: fsync).
    fn settle(&mut self) -> Res<()>;
    fn reopen(&mut self, access: Access) -> Res<()>;
    fn close(self: Box<Self>) -> Res<()>;
    /// Store-specific counters (cumulative since the store was opened in this process).
    fn counters(&self) -> Vec<(String, f64)>;
    /// Bytes of storage the data occupies, if the store can tell better than the files' sizes.
    fn used_bytes(&self) -> Option<u64> {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Amaranth

pub struct Amaranth {
    path: PathBuf,
    opts: Options,
    engine: Option<Engine>,
}

impl Amaranth {
    pub fn create(
        dir: &Path,
        image_bytes: u64,
        cache: usize,
        compression: Compression,
        partition_kb: u64,
    ) -> Res<Amaranth> {
        let path = dir.join("amaranth.img");
        let dev = FileDevice::create_image(&path, image_bytes).map_err(err("create image"))?;
        if !dev.is_direct() {
            return Err(format!("{} is not opened with O_DIRECT", path.display()));
        }
        let opts = Options {
            cache_size: cache,
            ..Options::default()
        };
        let mut format = Format {
            compression,
            ..Format::default()
        };
        if partition_kb > 0 {
            // A smaller partition must still hold the largest key and value with room to spare.
            let p = (partition_kb << 10) as usize;
            format.partition_size = p;
            format.max_key_len = format.max_key_len.min(p / 8);
            format.max_value_len = format.max_value_len.min(p / 2);
        }
        let engine =
            Engine::create(Arc::new(dev), format, opts.clone()).map_err(err("Engine::create"))?;
        Ok(Amaranth {
            path,
            opts,
            engine: Some(engine),
        })
    }
    fn e(&self) -> &Engine {
        self.engine.as_ref().expect("engine open")
    }
}

impl Store for Amaranth {
    fn put_batch(&mut self, items: &mut Vec<(Vec<u8>, Vec<u8>)>) -> Res<()> {
        // The items are taken, as an application that builds a batch gives it its keys and
        // values (copying them here cost two allocations per item that the other stores do not
        // make); the batch is given up too, so the engine does not copy them either.
        let mut b = Batch::new();
        for (k, v) in items.drain(..) {
            b.put(k, v);
        }
        self.e().write_owned(b).map(|_| ()).map_err(err("write"))
    }
    fn upsert_batch(&mut self, items: &[(Vec<u8>, u32, [u8; 4])]) -> Res<()> {
        let mut b = Batch::new();
        for (k, off, d) in items {
            b.upsert(
                k.clone(),
                Patch::Write {
                    offset: *off,
                    data: d.to_vec(),
                },
            );
        }
        self.e().write_owned(b).map(|_| ()).map_err(err("write"))
    }
    fn get(&mut self, key: &[u8]) -> Res<Option<usize>> {
        self.e()
            .get(key)
            .map(|v| v.map(|v| v.len()))
            .map_err(err("get"))
    }
    fn scan(&mut self, lo: &[u8], hi: &[u8]) -> Res<(u64, u64)> {
        let (mut n, mut bytes) = (0u64, 0u64);
        self.e()
            .scan(Bound::Included(lo), Bound::Excluded(hi), |k, v| {
                n += 1;
                bytes += (k.len() + v.len()) as u64;
                true
            })
            .map_err(err("scan"))?;
        Ok((n, bytes))
    }
    fn range_delete(&mut self, lo: &[u8], hi: &[u8]) -> Res<Option<u64>> {
        self.e().range_delete(lo, hi).map_err(err("range_delete"))?;
        Ok(None)
    }
    fn settle(&mut self) -> Res<()> {
        self.e().sync().map_err(err("sync"))?;
        self.e().checkpoint().map_err(err("checkpoint"))
    }
    fn reopen(&mut self, _access: Access) -> Res<()> {
        if let Some(e) = self.engine.take() {
            e.close().map_err(err("close"))?;
        }
        let dev = FileDevice::open(&self.path).map_err(err("open image"))?;
        self.engine = Some(Engine::open(Arc::new(dev), self.opts.clone()).map_err(err("open"))?);
        Ok(())
    }
    fn close(mut self: Box<Self>) -> Res<()> {
        match self.engine.take() {
            Some(e) => e.close().map_err(err("close")),
            None => Ok(()),
        }
    }
    fn counters(&self) -> Vec<(String, f64)> {
        let s = self.e().stats();
        let mut v: Vec<(&str, f64)> = vec![
            ("height", s.height as f64),
            ("nodes", s.nodes as f64),
            ("cache_bytes", s.cache_bytes as f64),
            ("cache_peak_bytes", s.cache_peak_bytes as f64),
            ("cache_hits", s.cache_hits as f64),
            ("cache_misses", s.cache_misses as f64),
            ("partition_loads", s.partition_loads as f64),
            ("buffer_loads", s.buffer_loads as f64),
            ("run_reads", s.run_reads as f64),
            ("buffer_run_reads", s.buffer_run_reads as f64),
            ("subblock_buffers_reused", s.subblock_buffers_reused as f64),
            ("image_buffers_reused", s.image_buffers_reused as f64),
            ("prefetch_loads", s.prefetch_loads as f64),
            ("prefetch_hits", s.prefetch_hits as f64),
            ("prefetch_shed", s.prefetch_shed as f64),
            ("evictions", s.evictions as f64),
            ("writebacks", s.writebacks as f64),
            ("user_bytes_written", s.user_bytes_written as f64),
            ("dev_bytes_written", s.device.bytes_written as f64),
            ("dev_bytes_read", s.device.bytes_read as f64),
            ("dev_reads", s.device.reads as f64),
            ("dev_writes", s.device.writes as f64),
            ("dev_flushes", s.device.flushes as f64),
            ("node_writes", s.node_writes as f64),
            ("node_bytes_written", s.node_bytes_written as f64),
            ("node_reads", s.node_reads as f64),
            ("node_bytes_read", s.node_bytes_read as f64),
            ("log_bytes_written", s.log.bytes_written as f64),
            ("flushes", s.flushes as f64),
            ("bytes_flushed", s.bytes_flushed as f64),
            ("leaf_splits", s.leaf_splits as f64),
            ("internal_splits", s.internal_splits as f64),
            ("merges", s.merges as f64),
            ("checkpoints", s.checkpoints as f64),
            ("checkpoint_seconds", s.checkpoint_seconds),
            ("used_bytes", (s.data_bytes - s.free_bytes) as f64),
        ];
        if let Some(f) = &s.failure {
            eprintln!("amaranth: engine failure: {f}");
            v.push(("failed", 1.0));
        }
        v.into_iter().map(|(k, x)| (k.to_string(), x)).collect()
    }
    fn used_bytes(&self) -> Option<u64> {
        let s = self.e().stats();
        Some(s.data_bytes - s.free_bytes)
    }
}

// ---------------------------------------------------------------------------------------------
// RocksDB

#[cfg(feature = "rocksdb")]
pub struct Rocks {
    path: PathBuf,
    cache: usize,
    db: Option<rocksdb::DB>,
    block_cache: rocksdb::Cache,
}

/// Applies patch operands (offset u32 LE + bytes) to a value: the merge operator that makes
/// RocksDB's upsert blind, like Amaranth's.
#[cfg(feature = "rocksdb")]
fn apply_patches<'a>(base: Option<&[u8]>, ops: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut v = base.map(|b| b.to_vec()).unwrap_or_default();
    for op in ops {
        if op.len() < 4 {
            continue;
        }
        let off = u32::from_le_bytes(op[..4].try_into().unwrap()) as usize;
        let d = &op[4..];
        if v.len() < off + d.len() {
            v.resize(off + d.len(), 0);
        }
        v[off..off + d.len()].copy_from_slice(d);
    }
    v
}

#[cfg(feature = "rocksdb")]
impl Rocks {
    pub fn create(dir: &Path, cache: usize) -> Res<Rocks> {
        let block_cache = rocksdb::Cache::new_lru_cache(cache / 2);
        let mut r = Rocks {
            path: dir.join("rocksdb"),
            cache,
            db: None,
            block_cache,
        };
        r.open(true)?;
        Ok(r)
    }

    fn options(&self, create: bool) -> rocksdb::Options {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(create);
        o.set_compression_type(rocksdb::DBCompressionType::None);
        // Memory: half the bound for the block cache (which also holds index and filter blocks),
        // half for two memtables.
        o.set_write_buffer_size(self.cache / 4);
        o.set_max_write_buffer_number(2);
        o.set_max_background_jobs(2);
        o.set_bytes_per_sync(1 << 20);
        o.set_level_compaction_dynamic_level_bytes(true);
        o.set_max_open_files(-1);
        let mut t = rocksdb::BlockBasedOptions::default();
        t.set_block_cache(&self.block_cache);
        t.set_cache_index_and_filter_blocks(true);
        t.set_pin_l0_filter_and_index_blocks_in_cache(true);
        t.set_bloom_filter(10.0, false);
        t.set_block_size(4096);
        o.set_block_based_table_factory(&t);
        o.set_merge_operator(
            "patch",
            |_k: &[u8], base: Option<&[u8]>, ops: &rocksdb::MergeOperands| {
                Some(apply_patches(base, ops.iter()))
            },
            // Partial merges are left to full merges (returning None declines).
            |_k: &[u8], _base: Option<&[u8]>, _ops: &rocksdb::MergeOperands| None,
        );
        o
    }

    fn open(&mut self, create: bool) -> Res<()> {
        let o = self.options(create);
        self.db = Some(rocksdb::DB::open(&o, &self.path).map_err(err("rocksdb open"))?);
        Ok(())
    }

    fn db(&self) -> &rocksdb::DB {
        self.db.as_ref().expect("db open")
    }

    fn prop(&self, name: &str) -> u64 {
        self.db()
            .property_int_value(name)
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

#[cfg(feature = "rocksdb")]
impl Store for Rocks {
    fn put_batch(&mut self, items: &mut Vec<(Vec<u8>, Vec<u8>)>) -> Res<()> {
        let mut b = rocksdb::WriteBatch::default();
        for (k, v) in items {
            b.put(k, v);
        }
        self.db().write(b).map_err(err("write"))
    }
    fn upsert_batch(&mut self, items: &[(Vec<u8>, u32, [u8; 4])]) -> Res<()> {
        let mut b = rocksdb::WriteBatch::default();
        let mut op = [0u8; 8];
        for (k, off, d) in items {
            op[..4].copy_from_slice(&off.to_le_bytes());
            op[4..].copy_from_slice(d);
            b.merge(k, op);
        }
        self.db().write(b).map_err(err("write"))
    }
    fn get(&mut self, key: &[u8]) -> Res<Option<usize>> {
        self.db()
            .get_pinned(key)
            .map(|v| v.map(|v| v.len()))
            .map_err(err("get"))
    }
    fn scan(&mut self, lo: &[u8], hi: &[u8]) -> Res<(u64, u64)> {
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_readahead_size(2 << 20);
        ro.fill_cache(false);
        ro.set_iterate_upper_bound(hi.to_vec());
        let mut it = self.db().raw_iterator_opt(ro);
        it.seek(lo);
        let (mut n, mut bytes) = (0u64, 0u64);
        while it.valid() {
            let (k, v) = (it.key().unwrap(), it.value().unwrap());
            n += 1;
            bytes += (k.len() + v.len()) as u64;
            it.next();
        }
        it.status().map_err(err("scan"))?;
        Ok((n, bytes))
    }
    fn range_delete(&mut self, lo: &[u8], hi: &[u8]) -> Res<Option<u64>> {
        let mut b = rocksdb::WriteBatch::default();
        b.delete_range(lo, hi);
        self.db().write(b).map_err(err("delete_range"))?;
        Ok(None)
    }
    fn settle(&mut self) -> Res<()> {
        self.db().flush_wal(true).map_err(err("flush_wal"))?;
        self.db().flush().map_err(err("flush"))?;
        let t = Instant::now();
        loop {
            let busy = self.prop("rocksdb.compaction-pending")
                + self.prop("rocksdb.num-running-compactions")
                + self.prop("rocksdb.num-running-flushes")
                + self.prop("rocksdb.mem-table-flush-pending");
            if busy == 0 || t.elapsed() > Duration::from_secs(1800) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn reopen(&mut self, _access: Access) -> Res<()> {
        if let Some(db) = self.db.take() {
            db.flush().map_err(err("flush"))?;
            drop(db);
        }
        self.block_cache = rocksdb::Cache::new_lru_cache(self.cache / 2);
        self.open(false)
    }
    fn close(mut self: Box<Self>) -> Res<()> {
        if let Some(db) = self.db.take() {
            db.flush().map_err(err("flush"))?;
        }
        Ok(())
    }
    fn counters(&self) -> Vec<(String, f64)> {
        [
            "rocksdb.estimate-num-keys",
            "rocksdb.total-sst-files-size",
            "rocksdb.live-sst-files-size",
            "rocksdb.num-live-versions",
            "rocksdb.block-cache-usage",
            "rocksdb.cur-size-all-mem-tables",
            "rocksdb.estimate-table-readers-mem",
            "rocksdb.num-files-at-level0",
            "rocksdb.num-files-at-level1",
            "rocksdb.num-files-at-level2",
            "rocksdb.num-files-at-level3",
            "rocksdb.num-files-at-level4",
            "rocksdb.num-files-at-level5",
            "rocksdb.num-files-at-level6",
        ]
        .iter()
        .map(|n| {
            (
                n.trim_start_matches("rocksdb.").to_string(),
                self.prop(n) as f64,
            )
        })
        .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// LMDB (heed)

type HeedDb = heed::Database<heed::types::Bytes, heed::types::Bytes>;

pub struct Lmdb {
    path: PathBuf,
    map_size: usize,
    env: Option<heed::Env>,
    db: Option<HeedDb>,
}

impl Lmdb {
    pub fn create(dir: &Path, map_size: usize) -> Res<Lmdb> {
        let path = dir.join("lmdb");
        std::fs::create_dir_all(&path).map_err(err("mkdir"))?;
        let mut l = Lmdb {
            path,
            map_size,
            env: None,
            db: None,
        };
        l.open(Access::Random)?;
        Ok(l)
    }

    fn open(&mut self, access: Access) -> Res<()> {
        // NO_SYNC: a commit writes its pages but does not fsync (like RocksDB's default WAL and
        // Amaranth's 1 s group commit); settle() fsyncs. NO_READ_AHEAD for everything but scans,
        // as LMDB recommends when the database is larger than memory.
        let mut flags = heed::EnvFlags::NO_SYNC;
        if access == Access::Random {
            flags |= heed::EnvFlags::NO_READ_AHEAD;
        }
        let env = unsafe {
            let mut o = heed::EnvOpenOptions::new();
            o.map_size(self.map_size).max_dbs(1);
            o.flags(flags);
            o.open(&self.path)
        }
        .map_err(err("lmdb open"))?;
        let mut w = env.write_txn().map_err(err("txn"))?;
        let db: HeedDb = env
            .create_database(&mut w, None)
            .map_err(err("create db"))?;
        w.commit().map_err(err("commit"))?;
        self.db = Some(db);
        self.env = Some(env);
        Ok(())
    }

    fn env(&self) -> &heed::Env {
        self.env.as_ref().expect("env open")
    }
    fn db(&self) -> HeedDb {
        self.db.expect("db open")
    }
}

impl Store for Lmdb {
    fn put_batch(&mut self, items: &mut Vec<(Vec<u8>, Vec<u8>)>) -> Res<()> {
        let db = self.db();
        let mut w = self.env().write_txn().map_err(err("txn"))?;
        for (k, v) in items {
            db.put(&mut w, k, v).map_err(err("put"))?;
        }
        w.commit().map_err(err("commit"))
    }
    fn upsert_batch(&mut self, items: &[(Vec<u8>, u32, [u8; 4])]) -> Res<()> {
        // Read-modify-write: LMDB has no blind update.
        let db = self.db();
        let mut w = self.env().write_txn().map_err(err("txn"))?;
        let mut buf = Vec::new();
        for (k, off, d) in items {
            let old = db.get(&w, k).map_err(err("get"))?;
            buf.clear();
            if let Some(o) = old {
                buf.extend_from_slice(o);
            }
            let off = *off as usize;
            if buf.len() < off + 4 {
                buf.resize(off + 4, 0);
            }
            buf[off..off + 4].copy_from_slice(d);
            db.put(&mut w, k, &buf).map_err(err("put"))?;
        }
        w.commit().map_err(err("commit"))
    }
    fn get(&mut self, key: &[u8]) -> Res<Option<usize>> {
        let r = self.env().read_txn().map_err(err("txn"))?;
        let v = self.db().get(&r, key).map_err(err("get"))?;
        Ok(v.map(|v| v.len()))
    }
    fn scan(&mut self, lo: &[u8], hi: &[u8]) -> Res<(u64, u64)> {
        let r = self.env().read_txn().map_err(err("txn"))?;
        let range = (Bound::Included(lo), Bound::Excluded(hi));
        let (mut n, mut bytes) = (0u64, 0u64);
        for e in self.db().range(&r, &range).map_err(err("range"))? {
            let (k, v) = e.map_err(err("iter"))?;
            n += 1;
            bytes += (k.len() + v.len()) as u64;
        }
        Ok((n, bytes))
    }
    fn range_delete(&mut self, lo: &[u8], hi: &[u8]) -> Res<Option<u64>> {
        let db = self.db();
        let mut w = self.env().write_txn().map_err(err("txn"))?;
        let range = (Bound::Included(lo), Bound::Excluded(hi));
        let mut n = 0;
        {
            let mut it = db.range_mut(&mut w, &range).map_err(err("range"))?;
            while let Some(e) = it.next() {
                e.map_err(err("iter"))?;
                // SAFETY: no reference into the database is held across the deletion.
                unsafe { it.del_current() }.map_err(err("del"))?;
                n += 1;
            }
        }
        w.commit().map_err(err("commit"))?;
        Ok(Some(n))
    }
    fn settle(&mut self) -> Res<()> {
        self.env().force_sync().map_err(err("sync"))
    }
    fn reopen(&mut self, access: Access) -> Res<()> {
        if let Some(env) = self.env.take() {
            env.force_sync().map_err(err("sync"))?;
            self.db = None;
            env.prepare_for_closing().wait();
        }
        self.open(access)
    }
    fn close(mut self: Box<Self>) -> Res<()> {
        if let Some(env) = self.env.take() {
            env.force_sync().map_err(err("sync"))?;
            env.prepare_for_closing().wait();
        }
        Ok(())
    }
    fn counters(&self) -> Vec<(String, f64)> {
        let mut v = Vec::new();
        let info = self.env().info();
        v.push(("last_page".to_string(), info.last_page_number as f64));
        v.push(("map_size".to_string(), info.map_size as f64));
        if let Ok(r) = self.env().read_txn() {
            if let Ok(s) = self.db().stat(&r) {
                v.push(("depth".to_string(), s.depth as f64));
                v.push(("branch_pages".to_string(), s.branch_pages as f64));
                v.push(("leaf_pages".to_string(), s.leaf_pages as f64));
                v.push(("overflow_pages".to_string(), s.overflow_pages as f64));
                v.push(("entries".to_string(), s.entries as f64));
            }
        }
        v
    }
}
