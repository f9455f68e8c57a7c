//! A reply being built: the `fuse_out_header` followed by the payload, in one reusable buffer.
//! The /dev/fuse transport writes it whole; the io_uring transport copies the header into the
//! ring entry's header area and the payload into its payload buffer.

use crate::abi::{self, OutHeader, Pod};

const HEADER: usize = std::mem::size_of::<OutHeader>();

/// The reply to one request.
pub(crate) struct Reply {
    buf: Vec<u8>,
    unique: u64,
    error: i32,
    send: bool,
}

impl Reply {
    /// An empty reply with room for `capacity` payload bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Reply {
        let mut buf = Vec::with_capacity(HEADER + capacity);
        buf.resize(HEADER, 0);
        Reply {
            buf,
            unique: 0,
            error: 0,
            send: true,
        }
    }

    /// Starts the reply to request `unique` (success, no payload yet).
    pub(crate) fn start(&mut self, unique: u64) {
        self.buf.truncate(HEADER);
        self.unique = unique;
        self.error = 0;
        self.send = true;
    }

    /// Fails the request with `errno` (positive), dropping any payload.
    pub(crate) fn error(&mut self, errno: i32) {
        debug_assert!(errno > 0, "errno {errno}");
        self.buf.truncate(HEADER);
        self.error = -errno;
    }

    /// The request gets no reply (FORGET, INTERRUPT).
    pub(crate) fn none(&mut self) {
        self.send = false;
    }

    /// Appends a structure to the payload.
    pub(crate) fn push<T: Pod>(&mut self, t: &T) {
        self.buf.extend_from_slice(abi::bytes(t));
    }

    /// Appends bytes to the payload.
    pub(crate) fn extend(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// The buffer to append payload bytes to directly (it holds the header first: append only).
    pub(crate) fn payload_buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Payload bytes so far.
    pub(crate) fn payload_len(&self) -> usize {
        self.buf.len() - HEADER
    }

    /// Whether a reply is to be sent.
    pub(crate) fn wanted(&self) -> bool {
        self.send
    }

    /// Fills in the header and returns the whole reply (header and payload).
    pub(crate) fn finish(&mut self) -> &[u8] {
        let h = OutHeader {
            len: self.buf.len() as u32,
            error: self.error,
            unique: self.unique,
        };
        self.buf[..HEADER].copy_from_slice(abi::bytes(&h));
        &self.buf
    }

    /// The payload alone (after [`Reply::finish`]).
    pub(crate) fn payload(&self) -> &[u8] {
        &self.buf[HEADER..]
    }

    /// The header alone (after [`Reply::finish`]).
    pub(crate) fn header(&self) -> &[u8] {
        &self.buf[..HEADER]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_carries_length_error_and_unique() {
        let mut r = Reply::with_capacity(64);
        r.start(9);
        r.extend(b"abc");
        let out = r.finish().to_vec();
        let h: OutHeader = abi::read(&out).unwrap();
        assert_eq!((h.len, h.error, h.unique), (19, 0, 9));
        assert_eq!(r.payload(), b"abc");
        r.start(10);
        r.extend(b"xyz");
        r.error(libc::ENOENT);
        let out = r.finish().to_vec();
        let h: OutHeader = abi::read(&out).unwrap();
        assert_eq!((h.len, h.error, h.unique), (16, -libc::ENOENT, 10));
    }
}
