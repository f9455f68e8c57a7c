//! Engine keys and key ranges in file-system terms, for fsck's damage reports: "data of /a/b at
//! byte 40960", "metadata of /x", and which files a damaged key range touches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use amaranth_engine::{Engine, Result};

use crate::inode::Meta;
use crate::keys::{self, BLOCK, DATA, END, HOME, INDEX, META, NAMES, SEP, SYSTEM, XATTR};

/// A path key (or a truncated piece of one, as pivots are) as `/a/b`, lossily.
pub fn path_of(file_key: &[u8]) -> String {
    if let Some(ino) = keys::home_ino(file_key) {
        return format!("<inode {ino}>");
    }
    if file_key.first() == Some(&HOME) {
        return "<an inode>".into();
    }
    let mut out = String::new();
    for comp in file_key.split(|&b| b == SEP).filter(|c| !c.is_empty()) {
        out.push('/');
        out.push_str(&component_name(comp));
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// One encoded component as a name; a truncated one (pivots are shortened keys) shows the part of
/// the name it holds followed by `…`.
fn component_name(comp: &[u8]) -> String {
    if let Some(name) = keys::decode_component(comp) {
        return String::from_utf8_lossy(&name).into_owned();
    }
    let rest = match comp.get(keys::HASH_LEN..) {
        Some(r) if keys::hash_of(comp).is_some() => r,
        _ => &[],
    };
    let name = keys::unescape(rest).unwrap_or_else(|| rest.to_vec());
    format!("{}…", String::from_utf8_lossy(&name))
}

/// The file key in a data or xattr key's remainder (after the tag), and what follows its end.
fn split(rest: &[u8]) -> (&[u8], Option<&[u8]>) {
    let end = if rest.first() == Some(&HOME) {
        9.min(rest.len())
    } else {
        rest.iter().position(|&b| b == END).unwrap_or(rest.len())
    };
    let tail = (rest.get(end) == Some(&END)).then(|| &rest[end + 1..]);
    (&rest[..end], tail)
}

/// One key in words.
pub fn describe_key(key: &[u8]) -> String {
    let Some((&tag, rest)) = key.split_first() else {
        return "the first key".into();
    };
    match tag {
        META => format!("metadata of {}", path_of(rest)),
        DATA => {
            let (fk, tail) = split(rest);
            match tail.and_then(|t| <[u8; 8]>::try_from(t).ok()) {
                Some(b) => format!(
                    "data of {} at byte {}",
                    path_of(fk),
                    u64::from_be_bytes(b).saturating_mul(BLOCK)
                ),
                None => format!("data of {}", path_of(fk)),
            }
        }
        XATTR => {
            let (fk, tail) = split(rest);
            match tail {
                Some(name) if !name.is_empty() => format!(
                    "extended attribute {} of {}",
                    String::from_utf8_lossy(name),
                    path_of(fk)
                ),
                _ => format!("extended attributes of {}", path_of(fk)),
            }
        }
        SYSTEM => format!("file-system record {}", String::from_utf8_lossy(rest)),
        INDEX => match <[u8; 8]>::try_from(rest) {
            Ok(b) => format!("inode-index entry of inode {}", u64::from_be_bytes(b)),
            Err(_) => "the inode index".into(),
        },
        NAMES => match keys::name_of_name_key(key) {
            Some((ino, dir, name)) => format!(
                "names-index entry of inode {ino} ({} in directory {dir})",
                String::from_utf8_lossy(&name)
            ),
            None => "the names index".into(),
        },
        _ => format!("key {key:02x?}"),
    }
}

/// A key range `[lo, hi)` in words.
pub fn describe_range(lo: &[u8], hi: Option<&[u8]>) -> String {
    match hi {
        Some(h) => format!("from {} to {}", describe_key(lo), describe_key(h)),
        None => format!("from {} to the end", describe_key(lo)),
    }
}

/// The files whose records lie in, or would lie in, any of `ranges` (`[lo, hi)`, `hi` `None`
/// unbounded), with which records: `"name"` (a name or the inode), `"data"`, `"extended
/// attributes"`. These are the files a damaged node held something of, even what is lost. Paths
/// as the tree holds them now (`<inode N>` for a hard-linked inode whose names are not known);
/// at most `limit` files.
pub fn files_in_ranges(
    engine: &Engine,
    ranges: &[(Vec<u8>, Option<Vec<u8>>)],
    limit: usize,
) -> Result<BTreeMap<String, Vec<&'static str>>> {
    let hits = |lo: &[u8], hi: &[u8]| {
        ranges
            .iter()
            .any(|(a, b)| a.as_slice() < hi && b.as_ref().is_none_or(|b| lo < b.as_slice()))
    };
    let max_key = engine.format().max_key_len;
    let mut out: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut homes: Vec<(u64, Vec<&'static str>)> = Vec::new();
    let mut names: HashMap<u64, Vec<String>> = HashMap::new();
    let mut known: HashSet<Vec<u8>> = HashSet::new();
    engine.scan(
        Bound::Included(&[META][..]),
        Bound::Excluded(&[META + 1][..]),
        |k, v| {
            let fk = &k[1..];
            known.insert(fk.to_vec());
            let redirect = match Meta::decode(v) {
                Ok(Meta::Redirect(ino)) => {
                    names.entry(ino).or_default().push(path_of(fk));
                    true
                }
                _ => false,
            };
            let mut what = Vec::new();
            let mut end = k.to_vec();
            end.push(0);
            if hits(k, &end) {
                what.push("name");
            }
            if !redirect {
                let data = keys::data_prefix(fk);
                if hits(&data, &amaranth_engine::prefix_end(&data, max_key)) {
                    what.push("data");
                }
                let xattr = keys::xattr_prefix(fk);
                if hits(&xattr, &amaranth_engine::prefix_end(&xattr, max_key)) {
                    what.push("extended attributes");
                }
            }
            if !what.is_empty() {
                match keys::home_ino(fk) {
                    Some(ino) => homes.push((ino, what)),
                    None => {
                        out.entry(path_of(fk)).or_default().extend(what);
                    }
                }
            }
            out.len() < limit
        },
    )?;
    // Data or attributes whose inode is gone: the name and inode were in a damaged range.
    for tag in [DATA, XATTR] {
        let mut last: Vec<u8> = Vec::new();
        engine.scan_stored(
            Bound::Included(&[tag][..]),
            Bound::Excluded(&[tag + 1][..]),
            |k, _| {
                let fk = split(&k[1..]).0;
                if fk != last.as_slice() {
                    last = fk.to_vec();
                    if !known.contains(fk) {
                        out.entry(path_of(fk)).or_default().push("name");
                    }
                }
                out.len() < limit
            },
        )?;
    }
    for v in out.values_mut() {
        v.dedup();
    }
    for (ino, what) in homes {
        let shown = names
            .get(&ino)
            .cloned()
            .unwrap_or_else(|| vec![format!("<inode {ino}>")]);
        for n in shown {
            out.entry(n).or_default().extend(what.iter().copied());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_in_words() {
        let ab = keys::path_key(&[b"a", b"b c"]);
        assert_eq!(path_of(&ab), "/a/b c");
        assert_eq!(path_of(&[]), "/");
        assert_eq!(describe_key(&keys::meta_key(&ab)), "metadata of /a/b c");
        assert_eq!(
            describe_key(&keys::data_key(&ab, 10)),
            "data of /a/b c at byte 40960"
        );
        assert_eq!(
            describe_key(&keys::xattr_key(&ab, b"user.x")),
            "extended attribute user.x of /a/b c"
        );
        assert_eq!(
            describe_key(&keys::data_key(&keys::home_key(7), 0)),
            "data of <inode 7> at byte 0"
        );
        // A shortened pivot still reads as something.
        let k = keys::meta_key(&ab);
        assert_eq!(describe_key(&k[..4]), "metadata of /…");
        assert_eq!(describe_key(&k[..k.len() - 2]), "metadata of /a/b…");
        assert_eq!(describe_range(b"", None), "from the first key to the end");
    }
}
