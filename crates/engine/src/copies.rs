//! Finding the superblock to use among its copies, and saying what is wrong with the others.
//!
//! An image has two primary copies (blocks 0 and 1, written alternately) and, from format version
//! 2, three backups (see [`crate::superblock::backup_blocks`]). A checkpoint writes its primary copy,
//! flushes, then writes the backups and flushes again before it frees anything the previous
//! checkpoint used; so a backup always describes either the newest checkpoint or the one before it,
//! and in both cases every block it references is intact. That makes any valid copy whose
//! generation a backup also holds safe to use.
//!
//! The rule: read every copy, take the valid one with the highest generation. It is used without
//! asking when nothing looks wrong, or when a backup holds the same generation (it *vouches* for
//! it). A newest copy no backup vouches for while a primary copy is damaged may be older than the
//! damaged one, and its blocks may have been reused since: that needs `allow_fallback` (the repair
//! path) and is otherwise an error.

use amaranth_device::{AlignedBuf, BlockDevice, BLOCK_SIZE};

use crate::error::{Error, Result};
use crate::superblock::{backup_blocks, Superblock};

/// What one superblock location holds.
#[derive(Clone, Debug)]
enum Copy {
    /// A valid superblock.
    Valid(Box<Superblock>),
    /// No superblock magic: never written, or overwritten by something else.
    Missing,
    /// The magic but a bad checksum, an impossible field, or another image's superblock.
    Damaged(Error),
}

/// The superblock copies of an image, read and judged.
#[derive(Clone, Debug)]
pub struct Located {
    /// The copy to use.
    pub sb: Superblock,
    /// The block it was read from.
    pub block: u64,
    /// Copies that are damaged or overwritten, as (block, what is wrong), in block order.
    pub problems: Vec<(u64, String)>,
    /// Copies to rewrite with `sb` before anything else is written: the damaged and missing ones,
    /// and backups that lag behind `sb` (normal after a crash between the primary and the backup
    /// writes of a checkpoint).
    pub heal: Vec<u64>,
    /// The copy used is not the newest primary copy one would expect: say so.
    pub fell_back: bool,
}

impl Located {
    /// One line per problem plus the copy used, for logs and terminals.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .problems
            .iter()
            .map(|(b, m)| format!("superblock copy at block {b}: {m}"))
            .collect();
        if self.fell_back || !self.problems.is_empty() {
            out.push(format!(
                "using the superblock copy at block {} (checkpoint generation {})",
                self.block, self.sb.generation
            ));
        }
        out
    }
}

fn read_block(dev: &dyn BlockDevice, block: u64) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
    dev.read_at(block * BLOCK_SIZE as u64, &mut buf)
        .map_err(|e| Error::io(format!("reading the superblock copy at block {block}"), e))?;
    Ok(buf)
}

fn judge(buf: &[u8], block: u64) -> Copy {
    match Superblock::decode(buf, block * BLOCK_SIZE as u64) {
        Ok(sb) => Copy::Valid(Box::new(sb)),
        Err(Error::BadMagic(_)) => Copy::Missing,
        Err(e) => Copy::Damaged(e),
    }
}

/// Reads every copy and picks the one to use (see the module documentation).
pub fn locate(dev: &dyn BlockDevice, allow_fallback: bool) -> Result<Located> {
    if dev.len() < 2 * BLOCK_SIZE as u64 {
        return Err(Error::TooSmall(format!(
            "{} holds only {} bytes: not an Amaranth image, or a truncated one",
            dev.describe(),
            dev.len()
        )));
    }
    let primaries = [
        judge(&read_block(dev, 0)?, 0),
        judge(&read_block(dev, 1)?, 1),
    ];
    // Where the backups are: as the newest valid primary says, else as the device size says.
    let newest_primary = primaries
        .iter()
        .filter_map(|c| match c {
            Copy::Valid(sb) => Some(sb),
            _ => None,
        })
        .max_by_key(|sb| sb.generation);
    let backup_at: Vec<u64> = match newest_primary {
        Some(sb) => sb.backups.clone(),
        None => backup_blocks(dev.len() / BLOCK_SIZE as u64)
            .into_iter()
            .filter(|&b| b >= 2)
            .collect(),
    };
    let uuid = newest_primary.map(|sb| sb.uuid);
    let mut copies: Vec<(u64, Copy)> = vec![(0, primaries[0].clone()), (1, primaries[1].clone())];
    for &b in &backup_at {
        if (b + 1) * BLOCK_SIZE as u64 > dev.len() {
            copies.push((b, Copy::Missing));
            continue;
        }
        let c = match judge(&read_block(dev, b)?, b) {
            Copy::Valid(sb) if !sb.backups.contains(&b) => Copy::Damaged(Error::Corrupt(
                "a superblock that does not list this block as a backup".into(),
            )),
            Copy::Valid(sb) if uuid.is_some_and(|u| u != sb.uuid) => Copy::Damaged(Error::Corrupt(
                "the superblock of another image (different uuid)".into(),
            )),
            c => c,
        };
        copies.push((b, c));
    }
    choose(dev, copies, allow_fallback)
}

fn choose(
    dev: &dyn BlockDevice,
    copies: Vec<(u64, Copy)>,
    allow_fallback: bool,
) -> Result<Located> {
    let valid = |(b, c): &(u64, Copy)| match c {
        Copy::Valid(sb) => Some((*b, (**sb).clone())),
        _ => None,
    };
    // The newest valid copy; a primary wins a tie (it is where the checkpoint went first), then
    // the copy nearest the start.
    let Some((block, sb)) = copies
        .iter()
        .filter_map(valid)
        .max_by_key(|(b, sb)| (sb.generation, *b < 2, std::cmp::Reverse(*b)))
    else {
        return Err(no_valid_copy(dev, &copies));
    };
    let is_backup = |b: u64| b >= 2;
    let mut problems = Vec::new();
    let mut heal = Vec::new();
    let mut suspicious = false;
    for (b, c) in &copies {
        match c {
            Copy::Valid(other) => {
                let lags = is_backup(*b) && other.generation < sb.generation;
                let wrong_slot = *b == sb.generation % 2 && other.generation != sb.generation;
                if lags || wrong_slot {
                    heal.push(*b);
                }
            }
            Copy::Missing => {
                // A primary slot is legitimately blank until the checkpoint of its parity is
                // written (generations 0 and 1); backups from the first checkpoint on.
                let blank_ok = if is_backup(*b) {
                    sb.generation == 0
                } else {
                    sb.generation < 2 && *b != sb.generation % 2
                };
                if !blank_ok {
                    problems.push((*b, "overwritten (no Amaranth superblock there)".to_string()));
                    suspicious |= !is_backup(*b) && sb.version >= 2;
                }
                heal.push(*b);
            }
            Copy::Damaged(e) => {
                problems.push((*b, format!("damaged: {e}")));
                suspicious |= !is_backup(*b);
                heal.push(*b);
            }
        }
    }
    let vouched = copies
        .iter()
        .filter_map(valid)
        .any(|(b, other)| is_backup(b) && other.generation == sb.generation);
    if suspicious && !vouched && !allow_fallback {
        let detail: Vec<String> = problems
            .iter()
            .map(|(b, m)| format!("block {b}: {m}"))
            .collect();
        return Err(Error::Checksum {
            what: format!(
                "superblock ({}; the copy at block {block}, generation {}, is intact but may be \
                 older than the damaged one and no backup confirms it; \
                 `amaranth fsck --repair --fallback-superblock` can fall back to it knowingly)",
                detail.join("; "),
                sb.generation
            ),
            offset: problems.first().map_or(0, |(b, _)| b * BLOCK_SIZE as u64),
        });
    }
    let newest_primary_gen = copies
        .iter()
        .filter(|(b, _)| !is_backup(*b))
        .filter_map(valid)
        .map(|(_, s)| s.generation)
        .max();
    let fell_back = is_backup(block) && newest_primary_gen != Some(sb.generation);
    if dev.len() < sb.device_blocks * BLOCK_SIZE as u64 {
        return Err(Error::TooSmall(format!(
            "{} has {} bytes but the image was created with {}: it is truncated (damaged)",
            dev.describe(),
            dev.len(),
            sb.device_blocks * BLOCK_SIZE as u64
        )));
    }
    heal.sort_unstable();
    heal.dedup();
    Ok(Located {
        sb,
        block,
        problems,
        heal,
        fell_back,
    })
}

/// The error when no copy is valid: a version this build does not read, damage, or nothing at all.
fn no_valid_copy(dev: &dyn BlockDevice, copies: &[(u64, Copy)]) -> Error {
    for (_, c) in copies {
        if let Copy::Damaged(e @ Error::UnsupportedVersion { .. }) = c {
            return e.clone();
        }
    }
    let blocks: Vec<String> = copies.iter().map(|(b, _)| b.to_string()).collect();
    let damaged: Vec<String> = copies
        .iter()
        .filter_map(|(b, c)| match c {
            Copy::Damaged(e) => Some(format!("block {b}: {e}")),
            _ => None,
        })
        .collect();
    if damaged.is_empty() {
        Error::BadMagic(format!(
            "{} holds no valid Amaranth superblock (looked at blocks {})",
            dev.describe(),
            blocks.join(", ")
        ))
    } else {
        Error::Checksum {
            what: format!(
                "every superblock copy ({}) of {}",
                damaged.join("; "),
                dev.describe()
            ),
            offset: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{write_backups, write_copy, write_primary};
    use crate::superblock::tests::sample;
    use amaranth_device::MemDevice;

    /// A device holding checkpoint `g` (primary and backups) and `g - 1` in the other slot.
    fn image(g: u64) -> MemDevice {
        let dev = MemDevice::new(1000 * 4096);
        write_primary(&dev, &sample(g - 1)).unwrap();
        let sb = sample(g);
        write_primary(&dev, &sb).unwrap();
        write_backups(&dev, &sb).unwrap();
        dev
    }

    fn zero_blocks(dev: &MemDevice, from: usize, to: usize) {
        dev.with_bytes_mut(|b| b[from * 4096..to * 4096].fill(0));
    }

    #[test]
    fn an_intact_image_uses_the_newest_primary() {
        let l = locate(&image(5), false).unwrap();
        assert_eq!((l.sb.generation, l.block), (5, 1));
        assert!(l.problems.is_empty() && l.heal.is_empty() && !l.fell_back);
        assert!(l.describe().is_empty());
    }

    #[test]
    fn overwriting_the_start_falls_back_to_a_backup() {
        let dev = image(5);
        zero_blocks(&dev, 0, 16);
        let l = locate(&dev, false).unwrap();
        assert_eq!((l.sb.generation, l.block), (5, 250));
        assert!(l.fell_back);
        assert_eq!(l.problems.len(), 2, "{:?}", l.problems);
        assert_eq!(l.heal, vec![0, 1]);
        assert!(l.describe().last().unwrap().contains("block 250"));
        // Garbage instead of zeros: the same.
        dev.with_bytes_mut(|b| b[..8192].fill(0x5a));
        assert_eq!(locate(&dev, false).unwrap().block, 250);
        // Healing restores the primaries.
        crate::engine::Checkpointer::heal_copies(&dev, &locate(&dev, false).unwrap()).unwrap();
        let l = locate(&dev, false).unwrap();
        assert!(
            l.block < 2 && l.problems.is_empty() && l.heal.is_empty(),
            "{l:?}"
        );
        // Only the last backup left: still found.
        zero_blocks(&dev, 0, 600);
        let l = locate(&dev, false).unwrap();
        assert_eq!((l.sb.generation, l.block), (5, 750));
    }

    #[test]
    fn a_damaged_newest_primary_is_vouched_for_by_the_backups() {
        let dev = image(5);
        dev.with_bytes_mut(|b| b[4096 + 40] ^= 1);
        let l = locate(&dev, false).unwrap();
        assert_eq!((l.sb.generation, l.block), (5, 250));
        assert!(l.problems[0].1.contains("damaged"), "{:?}", l.problems);
        // Backups lost too: the older primary is not vouched for.
        for b in [250, 500, 750] {
            zero_blocks(&dev, b, b + 1);
        }
        let err = locate(&dev, false).unwrap_err();
        assert!(matches!(err, Error::Checksum { .. }), "{err}");
        assert!(err.to_string().contains("--fallback-superblock"), "{err}");
        assert_eq!(locate(&dev, true).unwrap().sb.generation, 4);
    }

    #[test]
    fn lagging_backups_are_healed_without_complaint() {
        // A crash between the primary write and the backup writes of checkpoint 6.
        let dev = image(5);
        write_primary(&dev, &sample(6)).unwrap();
        let l = locate(&dev, false).unwrap();
        assert_eq!((l.sb.generation, l.block), (6, 0));
        assert!(l.problems.is_empty() && !l.fell_back);
        assert_eq!(l.heal, vec![250, 500, 750]);
        // The damaged newest primary: the lagging backups vouch for the older primary.
        dev.with_bytes_mut(|b| b[40] ^= 1);
        let l = locate(&dev, false).unwrap();
        assert_eq!((l.sb.generation, l.block), (5, 1));
    }

    #[test]
    fn version_1_keeps_its_rules() {
        let dev = MemDevice::new(1000 * 4096);
        for g in [4, 5] {
            let mut sb = sample(g);
            sb.version = 1;
            sb.backups.clear();
            sb.data_table = None;
            sb.data_table_crc = 0;
            sb.data_table_runs = 0;
            write_primary(&dev, &sb).unwrap();
        }
        assert_eq!(locate(&dev, false).unwrap().sb.generation, 5);
        dev.with_bytes_mut(|b| b[4096 + 40] ^= 1);
        assert!(matches!(locate(&dev, false), Err(Error::Checksum { .. })));
        assert_eq!(locate(&dev, true).unwrap().sb.generation, 4);
    }

    #[test]
    fn nothing_valid_is_named_precisely() {
        let blank = MemDevice::new(1000 * 4096);
        let err = locate(&blank, false).unwrap_err();
        assert!(matches!(err, Error::BadMagic(_)), "{err}");
        assert!(err.to_string().contains("0, 1, 250, 500, 750"), "{err}");
        assert!(matches!(
            locate(&MemDevice::new(4096), false),
            Err(Error::TooSmall(_))
        ));
        let dev = image(5);
        for b in [0usize, 1, 250, 500, 750] {
            dev.with_bytes_mut(|d| d[b * 4096 + 40] ^= 1);
        }
        assert!(matches!(locate(&dev, true), Err(Error::Checksum { .. })));
        // A truncated image is damaged, not foreign.
        let dev = image(5);
        let short = MemDevice::from_bytes(dev.to_bytes()[..900 * 4096].to_vec());
        let err = locate(&short, false).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn another_images_backups_are_not_used() {
        let dev = image(5);
        let mut other = sample(9);
        other.uuid = [8; 16];
        write_copy(&dev, &other, 500).unwrap();
        let l = locate(&dev, false).unwrap();
        assert_eq!(l.sb.generation, 5);
        assert!(l
            .problems
            .iter()
            .any(|(b, m)| *b == 500 && m.contains("another image")));
    }
}
