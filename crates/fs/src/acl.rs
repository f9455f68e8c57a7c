//! POSIX access ACLs as the kernel passes them through (`system.posix_acl_access`, without
//! `FUSE_POSIX_ACL`): the mode's permission bits and the ACL's owner, group (or mask) and other
//! entries are one and the same, as on ext4. Setting an access ACL sets those mode bits; an ACL
//! that says no more than the mode is not stored; `chmod` rewrites the entries of a stored ACL.
//! Default ACLs (`system.posix_acl_default`) are stored as given.
//!
//! Encoding (little endian): a 4-byte version (2), then 8-byte entries `tag: u16, perm: u16,
//! id: u32`.

use crate::error::{Errno, Result};

/// Name of the access ACL attribute.
pub const ACCESS: &[u8] = b"system.posix_acl_access";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// Entries of an encoded ACL, checked for a valid version, tags and permissions.
fn entries(value: &[u8]) -> Result<Vec<(u16, u16, u32)>> {
    if value.len() < 4 || !(value.len() - 4).is_multiple_of(8) {
        return Err(Errno::EINVAL);
    }
    if u32::from_le_bytes(value[..4].try_into().expect("4 bytes")) != VERSION {
        return Err(Errno::EINVAL);
    }
    let out: Vec<(u16, u16, u32)> = value[4..]
        .chunks_exact(8)
        .map(|e| {
            (
                u16::from_le_bytes([e[0], e[1]]),
                u16::from_le_bytes([e[2], e[3]]),
                u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            )
        })
        .collect();
    let count = |t: u16| out.iter().filter(|e| e.0 == t).count();
    let named = count(USER) + count(GROUP);
    let valid_tags = out
        .iter()
        .all(|e| matches!(e.0, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER) && e.1 <= 7);
    if !valid_tags
        || count(USER_OBJ) != 1
        || count(GROUP_OBJ) != 1
        || count(OTHER) != 1
        || count(MASK) > 1
        || (named > 0 && count(MASK) != 1)
    {
        return Err(Errno::EINVAL);
    }
    Ok(out)
}

/// What setting the access ACL `value` does: the new permission bits (`perm` with its rwx bits
/// replaced) and whether the ACL must be stored (false: the mode says it all).
pub fn apply_access(value: &[u8], perm: u16) -> Result<(u16, bool)> {
    let e = entries(value)?;
    let bits = |tag: u16| e.iter().find(|x| x.0 == tag).map(|x| x.1);
    let group = bits(MASK).or(bits(GROUP_OBJ)).expect("validated");
    let owner = bits(USER_OBJ).expect("validated");
    let other = bits(OTHER).expect("validated");
    let perm = (perm & !0o777) | (owner << 6) | (group << 3) | other;
    Ok((perm, e.len() > 3))
}

/// A stored access ACL rewritten for the permission bits `perm` (after `chmod`).
pub fn chmod(value: &[u8], perm: u16) -> Result<Vec<u8>> {
    let mut e = entries(value)?;
    let has_mask = e.iter().any(|x| x.0 == MASK);
    for x in &mut e {
        match x.0 {
            USER_OBJ => x.1 = (perm >> 6) & 7,
            MASK => x.1 = (perm >> 3) & 7,
            GROUP_OBJ if !has_mask => x.1 = (perm >> 3) & 7,
            OTHER => x.1 = perm & 7,
            _ => {}
        }
    }
    Ok(encode(&e))
}

fn encode(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(e: &[(u16, u16, u32)]) -> Vec<u8> {
        encode(e)
    }

    const ANY: u32 = u32::MAX;

    #[test]
    fn a_minimal_acl_is_the_mode() {
        let v = acl(&[(USER_OBJ, 6, ANY), (GROUP_OBJ, 4, ANY), (OTHER, 4, ANY)]);
        assert_eq!(apply_access(&v, 0o4600), Ok((0o4644, false)));
    }

    #[test]
    fn an_extended_acl_is_stored_and_its_mask_is_the_group() {
        let v = acl(&[
            (USER_OBJ, 7, ANY),
            (USER, 5, 1000),
            (GROUP_OBJ, 4, ANY),
            (MASK, 5, ANY),
            (OTHER, 0, ANY),
        ]);
        assert_eq!(apply_access(&v, 0o1000), Ok((0o1750, true)));
        let c = chmod(&v, 0o640).unwrap();
        let e = entries(&c).unwrap();
        assert_eq!(
            e,
            vec![
                (USER_OBJ, 6, ANY),
                (USER, 5, 1000),
                (GROUP_OBJ, 4, ANY),
                (MASK, 4, ANY),
                (OTHER, 0, ANY)
            ]
        );
    }

    #[test]
    fn malformed_acls_are_rejected() {
        assert_eq!(apply_access(b"", 0), Err(Errno::EINVAL));
        assert_eq!(apply_access(&[1, 0, 0, 0], 0), Err(Errno::EINVAL));
        let no_mask = acl(&[
            (USER_OBJ, 7, ANY),
            (USER, 5, 1000),
            (GROUP_OBJ, 4, ANY),
            (OTHER, 0, ANY),
        ]);
        assert_eq!(apply_access(&no_mask, 0), Err(Errno::EINVAL));
        let two_owners = acl(&[
            (USER_OBJ, 7, ANY),
            (USER_OBJ, 7, ANY),
            (GROUP_OBJ, 4, ANY),
            (OTHER, 0, ANY),
        ]);
        assert_eq!(apply_access(&two_owners, 0), Err(Errno::EINVAL));
    }
}
