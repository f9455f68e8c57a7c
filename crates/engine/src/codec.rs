//! Little-endian encoding helpers with bounds-checked decoding and crc32c.
//!
//! Every on-disk structure is built with [`Enc`] and parsed with [`Dec`]. A decoder never panics on
//! bad input: running off the end or finding an impossible length is a [`Error::Corrupt`].

use crate::error::{Error, Result};

/// crc32c of `data`.
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// crc32c of `data` with the four bytes at `at` taken as zero (for self-checksummed blocks).
pub fn crc_with_hole(data: &[u8], at: usize) -> u32 {
    let c = crc32c::crc32c(&data[..at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &data[at + 4..])
}

/// An append-only little-endian encoder.
#[derive(Default, Debug)]
pub struct Enc {
    /// The bytes written so far.
    pub buf: Vec<u8>,
}

impl Enc {
    pub fn with_capacity(n: usize) -> Enc {
        Enc {
            buf: Vec::with_capacity(n),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn raw(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// A byte string with a u32 length prefix.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.raw(v);
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Overwrites a u32 previously reserved at `at`.
    pub fn put_u32_at(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// A bounds-checked little-endian decoder over a byte slice.
#[derive(Debug)]
pub struct Dec<'a> {
    data: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Dec<'a> {
    /// Decodes `data`; `what` names the structure in error messages.
    pub fn new(data: &'a [u8], what: &'static str) -> Dec<'a> {
        Dec { data, pos: 0, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        match end {
            Some(end) => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(Error::Corrupt(format!(
                "{}: truncated (wanted {} bytes at offset {}, have {})",
                self.what,
                n,
                self.pos,
                self.data.len()
            ))),
        }
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8]> {
        self.take(n)
    }
    /// A byte string with a u32 length prefix, at most `max` bytes long.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(Error::Corrupt(format!(
                "{}: length {} exceeds the limit {}",
                self.what, n, max
            )));
        }
        self.take(n)
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.pos != self.data.len() {
            return Err(Error::Corrupt(format!(
                "{}: {} unexpected trailing bytes",
                self.what,
                self.data.len() - self.pos
            )));
        }
        Ok(())
    }
    /// An error naming this structure.
    pub fn corrupt(&self, msg: impl std::fmt::Display) -> Error {
        Error::Corrupt(format!("{}: {}", self.what, msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut e = Enc::default();
        e.u8(7);
        e.u16(300);
        e.u32(70000);
        e.u64(1 << 40);
        e.bytes(b"abc");
        let mut d = Dec::new(&e.buf, "test");
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u16().unwrap(), 300);
        assert_eq!(d.u32().unwrap(), 70000);
        assert_eq!(d.u64().unwrap(), 1 << 40);
        assert_eq!(d.bytes(10).unwrap(), b"abc");
        d.finish().unwrap();
        let mut d = Dec::new(&e.buf[..5], "test");
        d.u8().unwrap();
        d.u16().unwrap();
        assert!(d.u32().is_err());
        let mut d = Dec::new(&e.buf[15..], "test");
        assert!(d.bytes(2).is_err());
    }

    #[test]
    fn crc_hole_matches_zeroed() {
        let mut data = vec![1u8; 64];
        data[8..12].copy_from_slice(&[9, 9, 9, 9]);
        let h = crc_with_hole(&data, 8);
        data[8..12].fill(0);
        assert_eq!(h, crc(&data));
    }
}
