//! A reply being built: the `fuse_out_header` followed by the payload, in one reusable buffer.
//! The /dev/fuse transport writes it whole; the io_uring transport copies the header into the
//! ring entry's header area and the payload into its payload buffer, except a payload written
//! straight into that buffer (a READ's data: [`Reply::external_payload`]).

use crate::abi::{self, OutHeader, Pod};

const HEADER: usize = std::mem::size_of::<OutHeader>();

/// The reply to one request.
pub(crate) struct Reply {
    buf: Vec<u8>,
    /// Payload bytes written outside `buf`, in the transport's own buffer (then `buf` holds none).
    external: usize,
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
            external: 0,
            unique: 0,
            error: 0,
            send: true,
        }
    }

    /// Starts the reply to request `unique` (success, no payload yet).
    pub(crate) fn start(&mut self, unique: u64) {
        self.buf.truncate(HEADER);
        self.external = 0;
        self.unique = unique;
        self.error = 0;
        self.send = true;
    }

    /// Fails the request with `errno` (positive), dropping any payload.
    pub(crate) fn error(&mut self, errno: i32) {
        debug_assert!(errno > 0, "errno {errno}");
        self.buf.truncate(HEADER);
        self.external = 0;
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
        self.buf.len() - HEADER + self.external
    }

    /// The payload is `n` bytes the handler wrote into the transport's buffer itself.
    pub(crate) fn external_payload(&mut self, n: usize) {
        assert_eq!(
            self.buf.len(),
            HEADER,
            "a reply with a payload in two places"
        );
        self.external = n;
    }

    /// Payload bytes written into the transport's buffer (see [`Reply::external_payload`]).
    pub(crate) fn external(&self) -> usize {
        self.external
    }

    /// Whether a reply is to be sent.
    pub(crate) fn wanted(&self) -> bool {
        self.send
    }

    /// Fills in the header and returns the whole reply (header and payload).
    pub(crate) fn finish(&mut self) -> &[u8] {
        let h = OutHeader {
            len: (self.buf.len() + self.external) as u32,
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

    #[test]
    fn a_payload_written_in_the_transport_buffer_counts_in_the_length_only() {
        let mut r = Reply::with_capacity(64);
        r.start(11);
        r.external_payload(4096);
        let out = r.finish().to_vec();
        let h: OutHeader = abi::read(&out).unwrap();
        assert_eq!((h.len, h.error, h.unique), (16 + 4096, 0, 11));
        assert!(r.payload().is_empty());
        assert_eq!((r.external(), r.payload_len()), (4096, 4096));
        // An error or the next request forgets it.
        r.error(libc::EIO);
        let h: OutHeader = abi::read(r.finish()).unwrap();
        assert_eq!(h.len, 16);
        r.external_payload(5);
        r.start(12);
        assert_eq!(r.external(), 0);
    }
}
