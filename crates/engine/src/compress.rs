//! Sub-block compression (none, LZ4, Zstandard).

use std::borrow::Cow;

use crate::config::Compression;
use crate::error::{Error, Result};

/// Compresses `raw` with `codec`. Returns the codec actually used and the bytes to store: data that
/// does not shrink by at least 1/16 is stored raw, so reading it costs nothing; raw data is
/// borrowed, not copied (a node image copies it once, into its own buffer).
pub fn compress(codec: Compression, raw: &[u8]) -> (Compression, Cow<'_, [u8]>) {
    let out = match codec {
        Compression::None => return (Compression::None, Cow::Borrowed(raw)),
        Compression::Lz4 => lz4_flex::block::compress(raw),
        Compression::Zstd => match zstd::bulk::compress(raw, 1) {
            Ok(v) => v,
            Err(_) => return (Compression::None, Cow::Borrowed(raw)),
        },
    };
    if out.len() + raw.len() / 16 >= raw.len() {
        (Compression::None, Cow::Borrowed(raw))
    } else {
        (codec, Cow::Owned(out))
    }
}

/// Decompresses `stored` into exactly `raw_len` bytes.
pub fn decompress(codec: Compression, stored: &[u8], raw_len: usize) -> Result<Vec<u8>> {
    let out = match codec {
        // Into recycled memory (`bufpool.rs`): a decoded partition's buffer goes back when freed.
        Compression::None => {
            let mut out = crate::bufpool::POOL.take(stored.len());
            out.extend_from_slice(stored);
            out
        }
        Compression::Lz4 => lz4_flex::block::decompress(stored, raw_len)
            .map_err(|e| Error::Corrupt(format!("lz4 sub-block does not decompress: {e}")))?,
        Compression::Zstd => zstd::bulk::decompress(stored, raw_len)
            .map_err(|e| Error::Corrupt(format!("zstd sub-block does not decompress: {e}")))?,
    };
    if out.len() != raw_len {
        return Err(Error::Corrupt(format!(
            "sub-block decompressed to {} bytes, expected {}",
            out.len(),
            raw_len
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let raw: Vec<u8> = (0..10000u32).flat_map(|i| (i % 97).to_le_bytes()).collect();
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let (used, stored) = compress(c, &raw);
            assert_eq!(decompress(used, &stored, raw.len()).unwrap(), raw);
        }
        assert!(decompress(Compression::Lz4, b"garbage", 100).is_err());
    }
}
