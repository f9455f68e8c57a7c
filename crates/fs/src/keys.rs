//! The key schema: full-path keys whose `memcmp` order keeps a directory's children first and
//! contiguous and its whole subtree in one key range.
//!
//! A path `/d1/d2/.../dk/name` is encoded as
//! `SEP comp(d1) SEP comp(d2) ... SEP comp(dk) SEP SEP comp(name)`: every separator is one `SEP`
//! byte (0x01) except the one before the last component, which is doubled (BetrFS's trick). Then:
//! - the children of directory `D` are exactly the keys starting with `children_prefix(D)`
//!   (`... SEP comp(dk) SEP SEP`), contiguous, before any grandchild;
//! - the whole subtree of `D` is exactly the keys starting with `subtree_prefix(D)`
//!   (`... SEP comp(dk) SEP`), one key range.
//!
//! A component is `hash(name) esc(name)`: a fixed-width 56-bit hash of the name (8 bytes, 7 bits
//! each, high bit set, so it is order-preserving and never holds 0x00–0x02) before the escaped
//! name. A directory's children are therefore in hash order, and a listing position is the hash
//! of the last name returned: a stable offset that survives other handles, changes of the
//! directory and remounts (see [`name_hash`] and the readdir code).
//!
//! Unlike BetrFS, every name Linux allows works: names are escaped so that the bytes 0x00, 0x01
//! and 0x02 never appear in an encoded name (`0x02` is the escape byte: 0x00/0x01/0x02 become
//! `0x02 0x10/0x11/0x12`), and ranges end at the successor of their prefix, so names starting with
//! 0xff need nothing special.
//!
//! Key spaces (first byte):
//! - `'m' file_key` → the inode (metadata) of a file, directory, symlink or special file;
//! - `'d' file_key 0x00 block(u64 BE)` → 4 KiB data blocks (shorter for the tail; missing = hole);
//! - `'x' file_key 0x00 name` → extended attributes;
//! - `'s' name` → file-system-wide records (format, inode counter);
//! - `'i' ino(u64 BE)` → where inode `ino` is (the inode index, schema 3);
//! - `'l' ino(u64 BE) parent(u64 BE) name` → one entry per name of a hard-linked inode (the
//!   names index, schema 6): each name that holds a redirect to the home of `ino`.
//!
//! A `file_key` is either a path key (starts with `SEP`; the root's is empty) or an inode-keyed
//! *home* (`HOME ino(u64 BE)`): hard-linked and open-unlinked files live at their home, and each
//! of their names holds a redirect.

/// Separator byte.
pub const SEP: u8 = 0x01;
/// Escape byte.
pub const ESC: u8 = 0x02;
/// First byte of an inode-keyed home.
pub const HOME: u8 = 0x03;
/// First byte of the place an exchange parks one side at inside its batch (never durable).
pub const SWAP: u8 = 0x04;
/// Terminates a file key inside data and xattr keys (never appears in a file key).
pub const END: u8 = 0x00;

/// Key-space tags.
pub const META: u8 = b'm';
/// Data blocks.
pub const DATA: u8 = b'd';
/// Extended attributes.
pub const XATTR: u8 = b'x';
/// File-system records.
pub const SYSTEM: u8 = b's';
/// The inode index: where each inode is, by number (schema 3).
pub const INDEX: u8 = b'i';
/// The names index: every name of a hard-linked inode, by number (schema 6).
pub const NAMES: u8 = b'l';

/// Size of a data block.
pub const BLOCK: u64 = 4096;

/// Appends the escaped form of `name` to `out`.
pub fn escape_into(name: &[u8], out: &mut Vec<u8>) {
    for &b in name {
        if b <= ESC {
            out.push(ESC);
            out.push(0x10 + b);
        } else {
            out.push(b);
        }
    }
}

/// Reverses [`escape_into`]; `None` if the bytes are not a valid encoding.
pub fn unescape(enc: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(enc.len());
    let mut it = enc.iter();
    while let Some(&b) = it.next() {
        match b {
            ESC => match it.next() {
                Some(&e) if (0x10..=0x12).contains(&e) => out.push(e - 0x10),
                _ => return None,
            },
            0x00 | SEP => return None,
            _ => out.push(b),
        }
    }
    Some(out)
}

/// Bytes of the hash at the start of every encoded component.
pub const HASH_LEN: usize = 8;
/// Hashes are below this (56 bits).
pub const HASH_LIMIT: u64 = 1 << 56;

/// The 56-bit hash that orders a name among its siblings: XXH3-64 (a fixed, published function,
/// so keys never change across versions of the program), top 56 bits.
pub fn name_hash(name: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(name) >> 8
}

/// Appends the order-preserving encoding of hash `h` (< [`HASH_LIMIT`]): 8 bytes of 7 bits each,
/// most significant first, each with its high bit set.
pub fn hash_into(h: u64, out: &mut Vec<u8>) {
    assert!(h < HASH_LIMIT, "hash {h:#x} out of range");
    for i in (0..HASH_LEN).rev() {
        out.push(0x80 | ((h >> (7 * i)) & 0x7f) as u8);
    }
}

/// The hash encoded at the start of a component, if well formed.
pub fn hash_of(comp: &[u8]) -> Option<u64> {
    let enc = comp.get(..HASH_LEN)?;
    enc.iter().try_fold(0u64, |h, &b| {
        (b & 0x80 != 0).then_some((h << 7) | u64::from(b & 0x7f))
    })
}

/// Appends the encoded component of `name`: its hash, then its escaped bytes.
pub fn component_into(name: &[u8], out: &mut Vec<u8>) {
    hash_into(name_hash(name), out);
    escape_into(name, out);
}

/// Reverses [`component_into`]; `None` unless the hash is well formed and matches the name.
pub fn decode_component(comp: &[u8]) -> Option<Vec<u8>> {
    let h = hash_of(comp)?;
    let name = unescape(&comp[HASH_LEN..])?;
    (!name.is_empty() && name_hash(&name) == h).then_some(name)
}

/// A path, as the list of its components from the root (the root itself is empty).
pub type Components<'a> = &'a [&'a [u8]];

/// The path key of `/c0/c1/.../cn` (empty for the root).
pub fn path_key(components: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(components.iter().map(|c| c.len() + 2 + HASH_LEN).sum());
    let n = components.len();
    for (i, c) in components.iter().enumerate() {
        k.push(SEP);
        if i + 1 == n {
            k.push(SEP);
        }
        component_into(c, &mut k);
    }
    k
}

/// The key of child `name` of the directory whose path key is `dir`.
pub fn child_key(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut k = children_prefix(dir);
    component_into(name, &mut k);
    k
}

/// Prefix shared by the keys of every direct child of directory `dir`.
pub fn children_prefix(dir: &[u8]) -> Vec<u8> {
    let mut k = subtree_prefix(dir);
    k.push(SEP);
    k
}

/// Prefix shared by the keys of every descendant of directory `dir` (at any depth). For a file
/// key that is not a path (the exchange's [`swap_key`]), the key followed by a separator.
pub fn subtree_prefix(dir: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return vec![SEP];
    }
    if dir[0] != SEP {
        return [dir, &[SEP]].concat();
    }
    // `dir` = ... SEP SEP esc(last): collapse the doubled separator before the last component.
    let last_sep = dir
        .iter()
        .rposition(|&b| b == SEP)
        .expect("a non-root path key holds a separator");
    assert!(
        last_sep >= 1 && dir[last_sep - 1] == SEP,
        "malformed path key"
    );
    let mut k = Vec::with_capacity(dir.len() + 1);
    k.extend_from_slice(&dir[..last_sep]);
    k.extend_from_slice(&dir[last_sep + 1..]);
    k.push(SEP);
    k
}

/// The name of a child key under `children_prefix` (of length `prefix_len`), if well formed.
pub fn name_of_child(key: &[u8], prefix_len: usize) -> Option<Vec<u8>> {
    decode_component(key.get(prefix_len..)?)
}

/// The file key an exchange moves one side to before moving the other into its place (inside
/// one batch, so never durable). One byte: every key it gives (metadata, data, xattrs, subtree)
/// is shorter than the same key of any path, so parking there never lengthens a key.
pub fn swap_key() -> Vec<u8> {
    vec![SWAP]
}

/// The inode-index key of inode `ino`.
pub fn ino_key(ino: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(INDEX);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// The home key of inode `ino`.
pub fn home_key(ino: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(HOME);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// Whether a file key is a home (not a path).
pub fn is_home(file_key: &[u8]) -> bool {
    file_key.first() == Some(&HOME)
}

/// The inode number in a home key.
pub fn home_ino(file_key: &[u8]) -> Option<u64> {
    if file_key.len() == 9 && file_key[0] == HOME {
        Some(u64::from_be_bytes(file_key[1..9].try_into().ok()?))
    } else {
        None
    }
}

/// Metadata key of a file key.
pub fn meta_key(file_key: &[u8]) -> Vec<u8> {
    tagged(META, file_key)
}

fn tagged(tag: u8, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + rest.len() + 9);
    k.push(tag);
    k.extend_from_slice(rest);
    k
}

/// Prefix of every data key of a file.
pub fn data_prefix(file_key: &[u8]) -> Vec<u8> {
    let mut k = tagged(DATA, file_key);
    k.push(END);
    k
}

/// Data key of block `block` of a file.
pub fn data_key(file_key: &[u8], block: u64) -> Vec<u8> {
    let mut k = data_prefix(file_key);
    k.extend_from_slice(&block.to_be_bytes());
    k
}

/// Block number of a data key with the given prefix length.
pub fn block_of(data_key: &[u8], prefix_len: usize) -> Option<u64> {
    let b = data_key.get(prefix_len..)?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// Prefix of every extended attribute of a file.
pub fn xattr_prefix(file_key: &[u8]) -> Vec<u8> {
    let mut k = tagged(XATTR, file_key);
    k.push(END);
    k
}

/// Key of extended attribute `name` of a file.
pub fn xattr_key(file_key: &[u8], name: &[u8]) -> Vec<u8> {
    let mut k = xattr_prefix(file_key);
    k.extend_from_slice(name);
    k
}

/// The three prefixes under which a directory's subtree lives (metadata, data, xattrs).
pub fn subtree_prefixes(dir: &[u8]) -> [Vec<u8>; 3] {
    let s = subtree_prefix(dir);
    [tagged(META, &s), tagged(DATA, &s), tagged(XATTR, &s)]
}

/// Key of a file-system record.
pub fn system_key(name: &str) -> Vec<u8> {
    tagged(SYSTEM, name.as_bytes())
}

/// The meta-key range holding every home.
pub fn homes_range() -> (Vec<u8>, Vec<u8>) {
    (vec![META, HOME], vec![META, HOME + 1])
}

/// The names-index key saying that `name` in directory `parent` redirects to the home of `ino`.
pub fn name_key(ino: u64, parent: u64, name: &[u8]) -> Vec<u8> {
    let mut k = names_prefix(ino);
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name);
    k
}

/// Prefix of the names-index keys of inode `ino`.
pub fn names_prefix(ino: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(NAMES);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// Reverses [`name_key`]: the inode, the parent directory and the name (not empty).
pub fn name_of_name_key(key: &[u8]) -> Option<(u64, u64, Vec<u8>)> {
    if key.len() <= 17 || key[0] != NAMES {
        return None;
    }
    let ino = u64::from_be_bytes(key[1..9].try_into().ok()?);
    let parent = u64::from_be_bytes(key[9..17].try_into().ok()?);
    Some((ino, parent, key[17..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_keys_round_trip_and_group_by_inode() {
        let k = name_key(7, 9, b"x\x00y");
        assert_eq!(name_of_name_key(&k), Some((7, 9, b"x\x00y".to_vec())));
        assert!(k.starts_with(&names_prefix(7)));
        assert!(!name_key(8, 0, b"a").starts_with(&names_prefix(7)));
        assert_eq!(name_of_name_key(&names_prefix(7)), None);
    }

    #[test]
    fn children_first_and_subtree_contiguous() {
        let a = path_key(&[b"a"]);
        let ab = path_key(&[b"a", b"b"]);
        let abc = path_key(&[b"a", b"b", b"c"]);
        let az = path_key(&[b"a", b"z"]);
        let a2 = path_key(&[b"a2"]);
        let c = |n: &[u8]| {
            let mut v = Vec::new();
            component_into(n, &mut v);
            v
        };
        assert_eq!(a, [&[SEP, SEP][..], &c(b"a")].concat());
        assert_eq!(ab, [&[SEP][..], &c(b"a"), &[SEP, SEP], &c(b"b")].concat());
        assert_eq!(
            abc,
            [
                &[SEP][..],
                &c(b"a"),
                &[SEP],
                &c(b"b"),
                &[SEP, SEP],
                &c(b"c")
            ]
            .concat()
        );
        assert_eq!(&c(b"a")[HASH_LEN..], b"a");
        assert_eq!(child_key(&a, b"b"), ab);
        // Children of /a come before grandchildren, and everything under /a shares one prefix.
        assert!(az < abc && ab < abc);
        let sub = subtree_prefix(&a);
        for k in [&ab, &abc, &az] {
            assert!(k.starts_with(&sub));
            assert!(k.starts_with(&children_prefix(&a)) == (k != &abc));
        }
        assert!(!a2.starts_with(&sub));
        assert!(!a.starts_with(&sub));
        assert_eq!(subtree_prefix(&[]), vec![SEP]);
        assert_eq!(child_key(&[], b"x"), path_key(&[b"x"]));
    }

    #[test]
    fn every_linux_name_round_trips_and_stays_in_place() {
        let names: Vec<Vec<u8>> = vec![
            b"plain".to_vec(),
            vec![0x01, 0x02, 0x03],
            vec![0xff, 0xff],
            vec![0xff],
            vec![b'a', 0x01],
            (1u8..=255).filter(|&b| b != b'/').collect(),
        ];
        for n in &names {
            let mut e = Vec::new();
            escape_into(n, &mut e);
            assert!(!e.contains(&SEP) && !e.contains(&0));
            assert_eq!(unescape(&e).as_ref(), Some(n));
            let mut comp = Vec::new();
            component_into(n, &mut comp);
            assert!(!comp.contains(&SEP) && !comp.contains(&0) && comp[0] > ESC);
            assert_eq!(decode_component(&comp).as_ref(), Some(n));
            // A child with such a name stays inside its parent's children range.
            let dir = path_key(&[b"d"]);
            let k = child_key(&dir, n);
            assert!(k.starts_with(&children_prefix(&dir)));
            assert_eq!(
                name_of_child(&k, children_prefix(&dir).len()).as_ref(),
                Some(n)
            );
            let sub = path_key(&[b"d", n, b"x"]);
            assert!(sub.starts_with(&subtree_prefix(&dir)));
            assert!(!sub.starts_with(&children_prefix(&dir)));
        }
    }

    #[test]
    fn the_swap_place_is_shorter_than_any_path_and_apart_from_them() {
        let shortest = path_key(&[b"a"]);
        let swap = swap_key();
        assert!(meta_key(&swap).len() < meta_key(&shortest).len());
        assert!(data_prefix(&swap).len() < data_prefix(&shortest).len());
        assert!(xattr_prefix(&swap).len() < xattr_prefix(&shortest).len());
        for (s, p) in subtree_prefixes(&swap)
            .iter()
            .zip(subtree_prefixes(&shortest).iter())
        {
            assert!(s.len() < p.len());
            // Its subtree holds neither its own keys nor anything of a path or a home.
            assert!(!meta_key(&swap).starts_with(s));
            assert!(!p.starts_with(s) && !s.starts_with(p));
        }
        let [m, d, x] = subtree_prefixes(&swap);
        for k in [&meta_key(&home_key(4)), &meta_key(&[])] {
            assert!(!k.starts_with(&m) && !k.starts_with(&d) && !k.starts_with(&x));
        }
        assert!(!xattr_prefix(&swap).starts_with(&x) && !x.starts_with(&xattr_prefix(&swap)));
        assert!(!data_prefix(&swap).starts_with(&d) && !d.starts_with(&data_prefix(&swap)));
    }

    #[test]
    fn hash_encoding_preserves_order_and_is_checked() {
        let mut hs = vec![
            0,
            1,
            0x7f,
            0x80,
            0x3fff,
            1 << 40,
            HASH_LIMIT - 2,
            HASH_LIMIT - 1,
        ];
        hs.extend((0..200u32).map(|i| name_hash(&i.to_le_bytes())));
        for &h in &hs {
            let mut e = Vec::new();
            hash_into(h, &mut e);
            assert_eq!(e.len(), HASH_LEN);
            assert!(e.iter().all(|&b| b >= 0x80));
            assert_eq!(hash_of(&e), Some(h));
            for &g in &hs {
                let mut f = Vec::new();
                hash_into(g, &mut f);
                assert_eq!(h.cmp(&g), e.cmp(&f), "order of {h:#x} and {g:#x}");
            }
        }
        // The hash is a fixed function: keys written by one build are found by the next.
        assert_eq!(name_hash(b""), 0x2d06800538d394);
        assert_eq!(name_hash(b"a"), name_hash(b"a"));
        assert_ne!(name_hash(b"a"), name_hash(b"b"));
        // A component whose hash does not match its name is not a component.
        let mut bad = Vec::new();
        hash_into(name_hash(b"x"), &mut bad);
        escape_into(b"y", &mut bad);
        assert_eq!(decode_component(&bad), None);
        assert_eq!(decode_component(b"plain"), None);
    }

    #[test]
    fn data_keys_of_a_file_are_contiguous() {
        let f = path_key(&[b"f"]);
        let g = path_key(&[b"f2"]);
        let last_f = data_key(&f, u64::MAX);
        let first_g = data_key(&g, 0);
        assert!(last_f < first_g);
        assert_eq!(block_of(&data_key(&f, 77), data_prefix(&f).len()), Some(77));
        assert!(data_key(&home_key(5), 1).starts_with(&data_prefix(&home_key(5))));
        assert_eq!(
            home_ino(&home_key(0x0102030405060708)),
            Some(0x0102030405060708)
        );
    }
}
