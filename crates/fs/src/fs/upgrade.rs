//! Bringing an image of an older schema up to [`SCHEMA_VERSION`] when the file system becomes
//! writable (its first writable mount, or a remount read-write after a read-only mount): schema 2
//! gets the inode index (`handles.rs`), and schemas 2 and 3 get the record of schema 4, whose
//! inodes count their blocks and reservations (schema 5, parked files, `orphans.rs`, needs nothing
//! but the record: older images have none); schemas 2 to 5 get the names index of hard-linked
//! files (schema 6, `links.rs`), built by the same walk of the directories, after which the files
//! they left at their homes with one name move back to it. Their inodes in encoding 1 stay as they are and read
//! as dense files (see `Meta::decode`) until rewritten, or recounted by `amaranth fsck --repair`;
//! the record comes before the first inode in encoding 2, which older versions cannot read.

use std::sync::atomic::Ordering;

use amaranth_engine::Batch;

use super::handles::INDEX_SCHEMA;
use super::links::NAMES_SCHEMA;
use super::{Fs, SCHEMA_VERSION};
use crate::error::Result;
use crate::keys;

impl Fs {
    /// The image's schema.
    pub(super) fn schema(&self) -> u32 {
        self.schema.load(Ordering::Acquire)
    }

    /// What the file system does when it becomes writable, before any change: upgrade an older
    /// schema, then remove the files unlinked while open before the last shutdown. Call with the
    /// namespace lock held exclusively: the index is built from the names, which must not change
    /// meanwhile, and no operation writes an inode before the new schema is recorded.
    pub(super) fn prepare_writes(&self) -> Result<()> {
        assert!(!self.engine.is_read_only());
        self.upgrade_schema()?;
        self.remove_orphans(true)
    }

    fn upgrade_schema(&self) -> Result<()> {
        let from = self.schema();
        assert!((2..=SCHEMA_VERSION).contains(&from), "schema {from}");
        if from == SCHEMA_VERSION {
            return Ok(());
        }
        if from < NAMES_SCHEMA {
            // The index's last batch records the new schema: a crash before it leaves the old
            // one, and the next writable mount builds the index again.
            let n = self.build_index(from < INDEX_SCHEMA)?;
            log::info!("amaranth: built the inode and names indexes ({n} names)");
        } else {
            let mut b = Batch::new();
            b.put(
                keys::system_key("format"),
                SCHEMA_VERSION.to_le_bytes().to_vec(),
            );
            self.engine.write(&b)?;
        }
        self.schema.store(SCHEMA_VERSION, Ordering::Release);
        log::info!("amaranth: upgraded the schema from version {from} to {SCHEMA_VERSION}");
        if from < NAMES_SCHEMA {
            let n = self.unhome_single_names()?;
            log::info!("amaranth: moved {n} files with one name back from their homes");
        }
        Ok(())
    }
}
