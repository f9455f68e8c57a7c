//! What a leaf keeps of a partition it has shed for room, so that a later point query reads only
//! the few KiB of it that may hold its key instead of the whole partition (128 KiB by default).
//!
//! When a clean, uncompressed partition is shed (`Tree::shed`), its slot keeps [`ShedRuns`]: the
//! partition's entries cut into runs of about [`RUN_BYTES`], and for each run its offset, length,
//! first key and the CRC-32C of its bytes. A point query that finds the partition shed picks the
//! run that may hold its key, reads the blocks under it, checks the run's checksum (so what it
//! reads is exactly what was shed) and searches it (`Partition::find_in_run`). The runs live only
//! in memory, charged to the leaf, and only while the partition is shed from the image they
//! describe: a load of the partition drops them, and nothing changes a leaf that is not wholly in
//! memory. Once a partition has been read this way as many times as it has runs (about as many
//! bytes as the whole partition), a query loads it whole instead, as renting past the price of
//! buying: a partition in use costs at most about twice its load, one read once costs a run.
//! Compressed partitions keep no runs (their stored bytes cannot be read in part).
//!
//! An internal node does the same for a child buffer it sheds while holding it in its encoding
//! (`BufSlot::drop_if_written`): runs of its point entries (one entry holds all the messages of
//! one key), beside the buffer's summary (`node/summary.rs`), which answers first. A query whose
//! key the summary says the buffer may hold reads the one run that would hold its messages
//! (`EncodedBuffer::find_in_run`) instead of the whole buffer (hundreds of KiB).

use std::sync::atomic::{AtomicU32, Ordering};

use super::SubLoc;
use crate::buffer::EncodedBuffer;
use crate::partition::Partition;

/// A run ends at the first entry boundary at or past this many bytes from its start.
pub(crate) const RUN_BYTES: usize = 4096;

/// One run of a shed partition's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    /// Offset of the run in the partition's bytes (an entry boundary).
    off: u32,
    /// Length of the run (whole entries).
    len: u32,
    /// CRC-32C of the run's bytes.
    crc: u32,
    /// Where the run's first key lies in `ShedRuns::keys`.
    key_start: u32,
    key_end: u32,
}

/// The runs of a shed partition: see the module documentation.
#[derive(Debug)]
pub(crate) struct ShedRuns {
    /// The partition's place in its node's image when it was shed.
    loc: SubLoc,
    runs: Vec<Run>,
    /// The runs' first keys, one after another.
    keys: Vec<u8>,
    /// Queries answered from runs so far.
    reads: AtomicU32,
}

/// Where to read a run: its offset and length in the partition's bytes, and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunAt {
    pub off: u32,
    pub len: u32,
    pub crc: u32,
}

impl ShedRuns {
    /// The runs of partition `p`, stored uncompressed at `loc`; `None` when it is stored
    /// compressed or is empty.
    pub(crate) fn build(p: &Partition, loc: SubLoc) -> Option<ShedRuns> {
        if !loc.stored_raw() || p.is_empty() {
            return None;
        }
        let runs = ShedRuns::cut(
            p.raw(),
            loc,
            (0..p.len()).map(|i| (p.entry_offset(i), p.key(i))),
        );
        assert_eq!(runs.runs[0].off, 0, "the first run starts the partition");
        Some(runs)
    }

    /// The runs of a child buffer's point entries (its range deletes are kept apart, in its
    /// summary: `node/summary.rs`), stored uncompressed at `loc`; `None` when it is stored
    /// compressed or holds no point message. The points come last in the encoding, so the runs
    /// end where it does.
    pub(crate) fn of_buffer(enc: &EncodedBuffer, loc: SubLoc) -> Option<ShedRuns> {
        if !loc.stored_raw() || enc.counts().0 == 0 {
            return None;
        }
        Some(ShedRuns::cut(enc.raw(), loc, enc.point_entries()))
    }

    /// Cuts `raw`, the bytes stored at `loc`, into runs at the boundaries of `entries` (offset,
    /// key), which are in key order and reach to the end of `raw`.
    fn cut<'a>(
        raw: &[u8],
        loc: SubLoc,
        entries: impl Iterator<Item = (usize, &'a [u8])>,
    ) -> ShedRuns {
        assert_eq!(
            raw.len(),
            loc.raw_len as usize,
            "a shed sub-block's bytes are its image's"
        );
        let mut runs = Vec::new();
        let mut keys = Vec::new();
        let mut start = 0usize;
        let mut prev: Option<&[u8]> = None;
        for (o, k) in entries {
            assert!(
                prev.is_none_or(|p| p < k) && o < raw.len(),
                "runs are cut at entries in key order"
            );
            prev = Some(k);
            if runs.is_empty() || o - start >= RUN_BYTES {
                if let Some(last) = runs.last_mut() {
                    close(last, raw, o);
                }
                start = o;
                let key_start = keys.len() as u32;
                keys.extend_from_slice(k);
                runs.push(Run {
                    off: o as u32,
                    len: 0,
                    crc: 0,
                    key_start,
                    key_end: keys.len() as u32,
                });
            }
        }
        close(runs.last_mut().expect("a run"), raw, raw.len());
        ShedRuns {
            loc,
            runs,
            keys,
            reads: AtomicU32::new(0),
        }
    }

    /// Whether these are the runs of `raw` cut at `entries` (as [`ShedRuns::cut`] takes them):
    /// what a load of the sub-block they were kept for checks before dropping them.
    pub(crate) fn describes<'a>(
        &self,
        raw: &[u8],
        entries: impl Iterator<Item = (usize, &'a [u8])>,
    ) -> bool {
        if raw.len() != self.loc.raw_len as usize {
            return false;
        }
        let again = ShedRuns::cut(raw, self.loc, entries);
        again.keys == self.keys && again.runs == self.runs
    }

    /// The place in the image these runs describe.
    pub(crate) fn loc(&self) -> SubLoc {
        self.loc
    }

    /// The run that holds `key` if the partition does: `Ok(None)` when `key` sorts before every
    /// entry (the partition does not hold it), `Err(())` when the partition has been read this
    /// way as many times as it has runs (at least two), and is to be loaded whole instead.
    pub(crate) fn run_for(&self, key: &[u8]) -> Result<Option<RunAt>, ()> {
        if self.reads.fetch_add(1, Ordering::Relaxed) as usize >= self.max_reads() {
            return Err(());
        }
        let i = self.runs.partition_point(|r| self.first_key(r) <= key);
        let Some(r) = i.checked_sub(1).map(|i| self.runs[i]) else {
            return Ok(None);
        };
        Ok(Some(RunAt {
            off: r.off,
            len: r.len,
            crc: r.crc,
        }))
    }

    /// Run reads before the partition is loaded whole instead.
    pub(crate) fn max_reads(&self) -> usize {
        self.runs.len().max(2)
    }

    fn first_key(&self, r: &Run) -> &[u8] {
        &self.keys[r.key_start as usize..r.key_end as usize]
    }

    /// Memory held.
    pub(crate) fn mem(&self) -> usize {
        self.runs.len() * std::mem::size_of::<Run>() + self.keys.len() + 96
    }
}

/// Ends `run` at `end` (an entry boundary) and records its checksum.
fn close(run: &mut Run, raw: &[u8], end: usize) {
    let off = run.off as usize;
    assert!(end > off, "a run holds at least one entry");
    run.len = (end - off) as u32;
    run.crc = crc32c::crc32c(&raw[off..end]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataref::Stored;

    fn partition(n: usize, value_len: impl Fn(usize) -> usize) -> Partition {
        let mut p = Partition::empty();
        for i in 0..n {
            let k = format!("key/{:06}", i * 2);
            let v = vec![(i % 251) as u8; value_len(i)];
            p.set(k.as_bytes(), Some(Stored::Bytes(&v)));
        }
        p
    }

    fn loc_of(p: &Partition, codec: u8) -> SubLoc {
        SubLoc {
            offset: 0,
            stored_len: p.raw().len() as u32,
            raw_len: p.raw().len() as u32,
            crc: 0,
            codec,
            count: p.len() as u32,
        }
    }

    /// Every key, present or not, is answered from its run as the partition answers it, and
    /// runs are about 4 KiB (one entry may pass it).
    #[test]
    fn a_key_is_found_in_its_run_as_in_the_partition() {
        for (n, vlen) in [(1usize, 10usize), (300, 100), (2000, 37), (40, 9000)] {
            let p = partition(n, |i| vlen + i % 13);
            let runs = ShedRuns::build(&p, loc_of(&p, 0)).unwrap();
            let raw = p.raw();
            // Every run but the last reaches RUN_BYTES, and passes it by less than one entry.
            let entry_max = 6 + 10 + vlen + 12;
            for (i, r) in runs.runs.iter().enumerate() {
                assert!(r.len as usize > 0 && (r.len as usize) < RUN_BYTES + entry_max);
                assert!(i + 1 == runs.runs.len() || r.len as usize >= RUN_BYTES);
            }
            let total: u32 = runs.runs.iter().map(|r| r.len).sum();
            assert_eq!(total as usize, raw.len(), "the runs cover the partition");
            for i in 0..(2 * n + 2) {
                runs.reads.store(0, Ordering::Relaxed);
                let k = format!("key/{i:06}");
                let want = p.get(k.as_bytes()).map(|s| s.raw().to_vec());
                let got = match runs.run_for(k.as_bytes()).unwrap() {
                    None => None,
                    Some(at) => {
                        let bytes = &raw[at.off as usize..(at.off + at.len) as usize];
                        assert_eq!(crc32c::crc32c(bytes), at.crc);
                        Partition::find_in_run(bytes, k.as_bytes(), 100, 1 << 20)
                            .unwrap()
                            .map(|s| s.raw().to_vec())
                    }
                };
                assert_eq!(got, want, "n {n}, key {k}");
            }
        }
    }

    #[test]
    fn a_partition_read_often_is_loaded_whole_and_compressed_ones_keep_no_runs() {
        let p = partition(500, |_| 50);
        let runs = ShedRuns::build(&p, loc_of(&p, 0)).unwrap();
        assert!(runs.max_reads() >= 500 * 62 / RUN_BYTES);
        for _ in 0..runs.max_reads() {
            assert!(runs.run_for(b"key/000100").is_ok());
        }
        assert!(runs.run_for(b"key/000100").is_err());
        assert!(
            runs.mem() < p.raw().len() / 10,
            "{} for {}",
            runs.mem(),
            p.raw().len()
        );
        let lz4 = crate::config::Compression::Lz4.code();
        assert!(ShedRuns::build(&p, loc_of(&p, lz4)).is_none());
    }

    #[test]
    fn a_damaged_run_is_refused_by_the_search() {
        let p = partition(100, |_| 20);
        let mut raw = p.raw().to_vec();
        raw[0] = 0xff; // the first key's length
        raw[1] = 0xff;
        assert!(Partition::find_in_run(&raw, b"key/000000", 100, 1000).is_err());
    }
}
