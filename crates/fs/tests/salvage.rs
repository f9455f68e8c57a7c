//! Salvage through the file system: an aged image with random 4 KiB blocks zeroed is surveyed
//! (every damaged node named), repaired (engine rebuild, then the schema: `/lost+found`, counts,
//! sizes), and then mounts, checks clean, and every file whose keys lived outside the damaged
//! nodes reads back intact, and every inode is found by number through the inode index (which the
//! repair rebuilt from the names). Plus the schema repairs one by one on deliberately broken
//! records.
//!
//! Each seed prints its numbers; replay one with `AMARANTH_SEED=<n>`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Batch, DamagedPart, Engine, Options, SalvageReport};
use amaranth_fs::check::{self, Class};
use amaranth_fs::{keys, Ctx, Fs, Kind, ROOT_INO};
use common::{engine_options, format, fs_options};

/// What one inode looks like through the file system.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileState {
    kind: Kind,
    size: u64,
    data: Vec<u8>,
    target: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Every inode: its names (paths) and what it holds.
type Tree = BTreeMap<u64, (Vec<Vec<Vec<u8>>>, bool, FileState)>;

fn walk(fs: &Fs) -> Tree {
    let mut out: Tree = BTreeMap::new();
    let mut stack: Vec<(u64, Vec<Vec<u8>>)> = vec![(ROOT_INO, vec![])];
    let mut looked_up = Vec::new();
    while let Some((dir, path)) = stack.pop() {
        let fh = fs.opendir(dir).expect("opendir");
        let mut names = Vec::new();
        fs.readdir(dir, fh, 0, false, |e| {
            if e.name != b"." && e.name != b".." {
                names.push(e.name.clone());
            }
            true
        })
        .expect("readdir");
        fs.releasedir(fh);
        for name in names {
            let a = fs.lookup(dir, &name).expect("lookup of a listed name");
            looked_up.push(a.ino);
            let mut p = path.clone();
            p.push(name);
            if let Some(e) = out.get_mut(&a.ino) {
                e.0.push(p);
                continue;
            }
            let data = if a.kind == Kind::File {
                fs.read(a.ino, 0, a.size as u32 + 1).expect("read")
            } else {
                vec![]
            };
            let target = if a.kind == Kind::Symlink {
                fs.readlink(a.ino).expect("readlink")
            } else {
                vec![]
            };
            let mut xattrs = BTreeMap::new();
            let list = fs.listxattr(a.ino).expect("listxattr");
            for n in list.split(|&b| b == 0).filter(|s| !s.is_empty()) {
                xattrs.insert(n.to_vec(), fs.getxattr(a.ino, n).expect("getxattr"));
            }
            let st = FileState {
                kind: a.kind,
                size: a.size,
                data,
                target,
                xattrs,
            };
            if a.kind == Kind::Dir {
                stack.push((a.ino, p.clone()));
            }
            out.insert(a.ino, (vec![p], a.homed, st));
        }
    }
    for ino in looked_up.into_iter().rev() {
        fs.forget(ino, 1);
    }
    out
}

/// Every inode of `t` is found by its number alone in a session that never saw it (through the
/// inode index, as a file handle is): the index agrees with the names after a repair.
fn found_by_number(engine: &Arc<Engine>, t: &Tree, what: &str) {
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    for (ino, (names, _, st)) in t {
        let got = fs
            .lookup(*ino, b".")
            .unwrap_or_else(|e| panic!("{what}: inode {ino} ({names:?}) by number: {e:?}"));
        assert_eq!((got.ino, got.kind), (*ino, st.kind), "{what}: {names:?}");
        fs.forget(*ino, 1);
    }
}

/// A tiny deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self, m: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % m.max(1)
    }
}

/// An aged file system: directories, a few hundred files, then overwrites, appends, truncates,
/// renames, hard links, xattrs, unlinks and checkpoints. Closed cleanly.
fn aged(seed: u64) -> (Arc<MemDevice>, Tree) {
    let dev = Arc::new(MemDevice::new(48 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Fs::new(Arc::new(engine), fs_options()).unwrap();
    let ctx = Ctx::default();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut dirs = vec![ROOT_INO];
    for i in 0..40 {
        let parent = dirs[rng.next(dirs.len() as u64) as usize];
        if let Ok(a) = fs.mkdir(parent, format!("d{i}").as_bytes(), 0o755, ctx) {
            dirs.push(a.ino);
        }
    }
    let mut files: Vec<(u64, Vec<u8>, u64)> = Vec::new(); // (dir, name, ino)
    let write = |fs: &Fs, ino: u64, off: u64, len: usize, fill: u8| {
        let fh = fs.open(ino, libc::O_RDWR, ctx).unwrap();
        let data: Vec<u8> = (0..len).map(|k| fill.wrapping_add((k / 7) as u8)).collect();
        fs.write(ino, fh, off, &data, false).unwrap();
        fs.release(ino, fh).unwrap();
    };
    for i in 0..260 {
        let dir = dirs[rng.next(dirs.len() as u64) as usize];
        let name = format!("f{i:03}").into_bytes();
        let (a, fh) = fs.create(dir, &name, 0o644, libc::O_RDWR, ctx).unwrap();
        fs.release(a.ino, fh).unwrap();
        let len = rng.next(14_000) as usize;
        write(&fs, a.ino, 0, len, rng.next(256) as u8);
        files.push((dir, name, a.ino));
    }
    for step in 0..1500u64 {
        if files.is_empty() {
            break;
        }
        let k = rng.next(files.len() as u64) as usize;
        let (dir, name, ino) = files[k].clone();
        match rng.next(12) {
            0..=3 => write(
                &fs,
                ino,
                rng.next(20_000),
                1 + rng.next(6000) as usize,
                rng.next(256) as u8,
            ),
            4 => {
                let size = rng.next(12_000);
                let set = amaranth_fs::SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                let _ = fs.setattr(ino, &set, ctx);
            }
            5 => {
                let to = dirs[rng.next(dirs.len() as u64) as usize];
                let new = format!("r{step}").into_bytes();
                if fs.rename(dir, &name, to, &new, 0).is_ok() {
                    files[k] = (to, new, ino);
                }
            }
            6 => {
                let to = dirs[rng.next(dirs.len() as u64) as usize];
                let new = format!("l{step}").into_bytes();
                if let Ok(a) = fs.link(ino, to, &new) {
                    fs.forget(a.ino, 1);
                    files.push((to, new, ino));
                }
            }
            7 => {
                let v: Vec<u8> = (0..rng.next(300)).map(|x| x as u8).collect();
                let _ = fs.setxattr(ino, format!("user.a{}", rng.next(3)).as_bytes(), &v, 0);
            }
            8 => {
                if fs.unlink(dir, &name).is_ok() {
                    files.swap_remove(k);
                }
            }
            9 if step % 200 == 0 => fs.engine().checkpoint().unwrap(),
            _ => {
                let (a, fh) =
                    match fs.create(dir, format!("n{step}").as_bytes(), 0o644, libc::O_RDWR, ctx) {
                        Ok(x) => x,
                        Err(_) => continue,
                    };
                fs.release(a.ino, fh).unwrap();
                write(&fs, a.ino, 0, rng.next(9000) as usize, step as u8);
                files.push((dir, format!("n{step}").into_bytes(), a.ino));
            }
        }
    }
    let tree = walk(&fs);
    let engine = fs.engine().clone();
    drop(fs);
    Arc::try_unwrap(engine)
        .ok()
        .expect("the only engine reference")
        .close()
        .unwrap();
    (dev, tree)
}

fn ro() -> Options {
    Options {
        read_only: true,
        ..engine_options()
    }
}

/// The key ranges an inode's records live in (its names, inode, data and xattrs).
fn key_ranges(names: &[Vec<Vec<u8>>], homed: bool, ino: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut file_keys = Vec::new();
    for n in names {
        let comps: Vec<&[u8]> = n.iter().map(|c| c.as_slice()).collect();
        let pk = keys::path_key(&comps);
        let mk = keys::meta_key(&pk);
        let mut end = mk.clone();
        end.push(0);
        out.push((mk, end));
        if !homed {
            file_keys.push(pk);
        }
    }
    // The inode's home (where a hard-linked file's metadata and data live) whether it is homed
    // now or not: a lost message under it (the delete that unhomed it, say) changes the file too,
    // which the checker then resolves (a duplicate of its metadata) at the file's expense.
    let hk = keys::home_key(ino);
    let mk = keys::meta_key(&hk);
    let mut end = mk.clone();
    end.push(0);
    out.push((mk, end));
    file_keys.push(hk);
    for fk in file_keys {
        for p in [keys::data_prefix(&fk), keys::xattr_prefix(&fk)] {
            let end = amaranth_engine::prefix_end(&p, 1 << 16);
            out.push((p, end));
        }
    }
    out
}

fn touches(report: &SalvageReport, ranges: &[(Vec<u8>, Vec<u8>)]) -> bool {
    report.damage.iter().any(|d| match &d.range {
        Some((lo, hi)) => ranges
            .iter()
            .any(|(a, b)| hi.as_ref().is_none_or(|h| a < h) && lo < b),
        None => false,
    })
}

/// Zeroes 1–6 random blocks of node images; returns the nodes whose bytes changed.
fn damage(dev: &MemDevice, seed: u64) -> BTreeSet<u64> {
    let copy = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    // By node id and offset, not by block: where a checkpoint puts a node varies from run to run
    // (hash order), what the node holds does not.
    let mut nodes = Engine::open(copy, ro()).unwrap().node_extents();
    nodes.sort();
    let blocks: Vec<(u64, u64)> = nodes
        .iter()
        .flat_map(|&(id, b, n)| (b..b + n).map(move |x| (id, x)))
        .collect();
    let mut rng = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    let mut truth = BTreeSet::new();
    for _ in 0..1 + rng.next(6) {
        let (id, blk) = blocks[rng.next(blocks.len() as u64) as usize];
        let changed = dev.with_bytes_mut(|b| {
            let blk = &mut b[(blk * 4096) as usize..][..4096];
            let changed = blk.iter().any(|&x| x != 0);
            blk.fill(0);
            changed
        });
        if changed {
            truth.insert(id);
        }
    }
    truth
}

/// One seed: age, damage, survey, repair, remount, compare. Returns (intact files checked,
/// files in damaged ranges, names moved to lost+found).
fn one_seed(seed: u64) -> (usize, usize, usize) {
    let what = format!("seed {seed}");
    let (dev, before) = aged(seed);
    let truth = damage(&dev, seed);
    // fsck without repair: every damaged node is named.
    let survey = Engine::survey(dev.clone(), engine_options()).unwrap();
    let named: BTreeSet<u64> = survey.damage.iter().map(|d| d.node).collect();
    assert_eq!(named, truth, "{what}: damaged nodes named");
    // fsck --repair: the engine rebuilds, the checker fixes the schema in rounds.
    let engine = Engine::open(
        dev.clone(),
        Options {
            salvage: true,
            ..engine_options()
        },
    )
    .unwrap_or_else(|e| panic!("{what}: repair open: {e}"));
    let report = engine.salvage_report().unwrap().clone();
    let rounds = check::repair(&engine, |_| {});
    let last = rounds.last().unwrap();
    assert_eq!(
        last.unrepaired(check::Severity::Benign),
        0,
        "{what}: {:?}",
        last.problems
    );
    let moved = rounds
        .iter()
        .flat_map(|r| &r.problems)
        .filter(|p| matches!(p.class, Class::MissingParent | Class::NamesLost) && p.repaired)
        .count();
    engine.close().unwrap();
    // Clean afterwards, read-only and then mounted read-write.
    let e = Engine::open(dev.clone(), ro()).unwrap();
    let rep = check::check(&e, false, |_| {});
    assert!(
        rep.problems.is_empty(),
        "{what}: after repair: {:?}",
        rep.problems
    );
    drop(e);
    let engine = Arc::new(Engine::open(dev.clone(), engine_options()).unwrap());
    let fs = Fs::new(engine.clone(), fs_options())
        .unwrap_or_else(|e| panic!("{what}: mount after repair: {e:?}"));
    let after = walk(&fs);
    // The repair kept the inode index in step with the names: every inode is found by number.
    found_by_number(&engine, &after, &what);
    let (mut intact, mut hit) = (0, 0);
    for (ino, (names, homed, st)) in &before {
        if st.kind == Kind::Dir {
            continue;
        }
        if touches(&report, &key_ranges(names, *homed, *ino)) {
            hit += 1;
            continue;
        }
        let got = after
            .get(ino)
            .unwrap_or_else(|| panic!("{what}: inode {ino} ({names:?}) lost though intact"));
        assert_eq!(&got.2, st, "{what}: inode {ino} ({names:?}) changed");
        intact += 1;
    }
    // And it takes new files.
    let (a, fh) = fs
        .create(
            ROOT_INO,
            b"after-repair",
            0o644,
            libc::O_RDWR,
            Ctx::default(),
        )
        .unwrap();
    fs.write(a.ino, fh, 0, b"ok", false).unwrap();
    fs.release(a.ino, fh).unwrap();
    eprintln!(
        "{what}: {} damaged nodes ({} leaves kept, {} rebuilt, {} orphans adopted); \
         {intact} files intact, {hit} in damaged ranges, {moved} names moved to lost+found, {} repair rounds",
        truth.len(),
        report.leaves_kept,
        report.leaves_rebuilt,
        report.orphans_adopted,
        rounds.len()
    );
    (intact, hit, moved)
}

#[test]
fn zeroed_blocks_of_an_aged_image_are_named_and_salvaged() {
    let seeds: Vec<u64> = match std::env::var("AMARANTH_SEED") {
        Ok(s) => vec![s.parse().expect("AMARANTH_SEED is a number")],
        Err(_) => (1..=10).collect(),
    };
    let mut total = (0, 0, 0);
    for seed in seeds {
        let (a, b, c) = one_seed(seed);
        total = (total.0 + a, total.1 + b, total.2 + c);
    }
    eprintln!(
        "total: {} files intact, {} in damaged ranges, {} names moved to lost+found",
        total.0, total.1, total.2
    );
    assert!(total.0 > 0);
}

#[test]
fn a_salvaged_image_whose_inode_index_lost_a_node_is_clean_after_repair() {
    // Enough long names that the index spans several leaves.
    let dev = Arc::new(MemDevice::new(32 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let engine = Arc::new(engine);
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    let ctx = Ctx::default();
    let mut dirs = vec![ROOT_INO];
    for d in 0..6 {
        dirs.push(
            fs.mkdir(ROOT_INO, format!("dir-{d}").as_bytes(), 0o755, ctx)
                .unwrap()
                .ino,
        );
    }
    for i in 0..1500 {
        let name = format!("a-file-with-a-rather-long-name-{i:05}");
        let (a, fh) = fs
            .create(
                dirs[i % dirs.len()],
                name.as_bytes(),
                0o644,
                libc::O_RDWR,
                ctx,
            )
            .unwrap();
        fs.release(a.ino, fh).unwrap();
    }
    drop(fs);
    Arc::try_unwrap(engine).ok().unwrap().close().unwrap();
    // Zero the first leaf that holds index entries (by the range the survey gives it; a lost
    // internal node would only give up its children, which salvage adopts whole).
    let nodes = Engine::open(Arc::new(MemDevice::from_bytes(dev.to_bytes())), ro())
        .unwrap()
        .node_extents();
    let (lo, hi) = (vec![keys::INDEX], vec![keys::INDEX + 1]);
    let hit = nodes.iter().find_map(|&(id, block, blocks)| {
        if id == 1 {
            return None;
        }
        let copy = MemDevice::from_bytes(dev.to_bytes());
        copy.with_bytes_mut(|b| {
            b[(block * 4096) as usize..((block + blocks) * 4096) as usize].fill(0)
        });
        let survey = Engine::survey(Arc::new(copy), engine_options()).unwrap();
        let holds_index = survey.damage.iter().any(|d| {
            d.part == DamagedPart::Node { height: Some(0) }
                && d.range
                    .as_ref()
                    .is_some_and(|(a, b)| *a < hi && b.as_ref().is_none_or(|b| *b > lo))
        });
        holds_index.then_some((block, blocks))
    });
    let (block, blocks) = hit.expect("a node holding index entries");
    dev.with_bytes_mut(|b| b[(block * 4096) as usize..((block + blocks) * 4096) as usize].fill(0));
    let repair_opts = Options {
        salvage: true,
        ..engine_options()
    };
    let engine = Arc::new(Engine::open(dev.clone(), repair_opts).unwrap());
    assert!(engine.salvage_report().unwrap().leaves_rebuilt > 0);
    let rounds = check::repair(&engine, |_| {});
    let index_fixed = rounds
        .iter()
        .flat_map(|r| &r.problems)
        .any(|p| p.class == Class::InodeIndex && p.repaired);
    assert!(index_fixed, "{rounds:?}");
    assert_eq!(
        rounds.last().unwrap().unrepaired(check::Severity::Benign),
        0
    );
    Arc::try_unwrap(engine).ok().unwrap().close().unwrap();
    // fsck -n afterwards: clean; and every file is found by number again.
    let e = Engine::open(dev.clone(), ro()).unwrap();
    let rep = check::check(&e, false, |_| {});
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    drop(e);
    let engine = Arc::new(Engine::open(dev, engine_options()).unwrap());
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    let after = walk(&fs);
    drop(fs);
    assert!(after.len() > 1000, "{} inodes left", after.len());
    found_by_number(&engine, &after, "index rebuilt");
}

/// A fresh file system with /a/b/c (data, xattr) and a hard-linked /x, /y.
fn small_fs() -> (Arc<Engine>, Fs) {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let engine = Engine::create(dev, format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let engine = Arc::new(engine);
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    let ctx = Ctx::default();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, ctx).unwrap();
    let b = fs.mkdir(a.ino, b"b", 0o755, ctx).unwrap();
    let (c, fh) = fs.create(b.ino, b"c", 0o644, libc::O_RDWR, ctx).unwrap();
    fs.write(c.ino, fh, 0, &[7u8; 9000], false).unwrap();
    fs.release(c.ino, fh).unwrap();
    fs.setxattr(c.ino, b"user.k", b"v", 0).unwrap();
    let (x, fh) = fs.create(ROOT_INO, b"x", 0o644, libc::O_RDWR, ctx).unwrap();
    fs.write(x.ino, fh, 0, b"linked", false).unwrap();
    fs.release(x.ino, fh).unwrap();
    fs.link(x.ino, ROOT_INO, b"y").unwrap();
    fs.fsync().unwrap();
    (engine, fs)
}

fn write(engine: &Engine, f: impl FnOnce(&mut Batch)) {
    let mut b = Batch::new();
    f(&mut b);
    engine.write(&b).unwrap();
}

/// Repairs, requires a clean check afterwards, returns the classes found and the tree.
fn repair_clean(engine: &Arc<Engine>) -> (BTreeSet<String>, Tree) {
    let rounds = check::repair(engine, |_| {});
    let classes = rounds
        .iter()
        .flat_map(|r| &r.problems)
        .map(|p| format!("{:?}", p.class))
        .collect();
    let again = check::check(engine, false, |_| {});
    assert!(
        again.problems.is_empty(),
        "{:?} then {:?}",
        rounds,
        again.problems
    );
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    let tree = walk(&fs);
    drop(fs);
    found_by_number(engine, &tree, "after repair");
    (classes, tree)
}

fn path(t: &Tree, ino: u64) -> Vec<String> {
    t[&ino]
        .0
        .iter()
        .map(|p| {
            p.iter()
                .map(|c| format!("/{}", String::from_utf8_lossy(c)))
                .collect()
        })
        .collect()
}

#[test]
fn a_file_whose_directory_is_gone_moves_to_lost_found() {
    let (engine, fs) = small_fs();
    let before = walk(&fs);
    drop(fs);
    let c = before
        .iter()
        .find(|(_, v)| v.0[0].last().unwrap() == b"c")
        .map(|(k, _)| *k)
        .unwrap();
    let b = before
        .iter()
        .find(|(_, v)| v.0[0].last().unwrap() == b"b")
        .map(|(k, _)| *k)
        .unwrap();
    // The inode of /a/b is lost: /a/b/c has no parent.
    write(&engine, |bt| {
        bt.delete(keys::meta_key(&keys::path_key(&[b"a", b"b"])));
    });
    let (classes, after) = repair_clean(&engine);
    assert!(classes.contains("MissingParent"), "{classes:?}");
    assert_eq!(path(&after, c), vec![format!("/lost+found/#{c}")]);
    assert_eq!(after[&c].2, before[&c].2, "data and xattrs moved along");
    assert!(!after.contains_key(&b));
}

#[test]
fn a_directory_whose_parent_is_gone_moves_with_its_subtree() {
    let (engine, fs) = small_fs();
    let before = walk(&fs);
    drop(fs);
    let find = |n: &[u8]| {
        before
            .iter()
            .find(|(_, v)| v.0[0].last().unwrap() == n)
            .map(|(k, _)| *k)
            .unwrap()
    };
    let (b, c) = (find(b"b"), find(b"c"));
    write(&engine, |bt| {
        bt.delete(keys::meta_key(&keys::path_key(&[b"a"])));
    });
    let (classes, after) = repair_clean(&engine);
    assert!(
        classes.contains("MissingParent") && classes.contains("LinkCount"),
        "{classes:?}"
    );
    assert_eq!(path(&after, b), vec![format!("/lost+found/#{b}")]);
    assert_eq!(path(&after, c), vec![format!("/lost+found/#{b}/c")]);
    assert_eq!(after[&c].2, before[&c].2);
}

#[test]
fn names_and_inodes_lost_separately_are_repaired() {
    let (engine, fs) = small_fs();
    let before = walk(&fs);
    drop(fs);
    let x = before
        .iter()
        .find(|(_, v)| v.0.len() == 2)
        .map(|(k, _)| *k)
        .unwrap();
    // Both names of the hard-linked file are lost: it gets one in lost+found.
    write(&engine, |bt| {
        bt.delete(keys::meta_key(&keys::path_key(&[b"x"])));
        bt.delete(keys::meta_key(&keys::path_key(&[b"y"])));
    });
    let (classes, after) = repair_clean(&engine);
    assert!(classes.contains("NamesLost"), "{classes:?}");
    assert_eq!(path(&after, x), vec![format!("/lost+found/#{x}")]);
    assert_eq!(after[&x].2, before[&x].2);
    // Now the home is lost: its name goes, and so does its data.
    write(&engine, |bt| {
        bt.delete(keys::meta_key(&keys::home_key(x)));
    });
    let (classes, after) = repair_clean(&engine);
    assert!(
        classes.contains("DanglingRedirect") && classes.contains("DataWithoutInode"),
        "{classes:?}"
    );
    assert!(!after.contains_key(&x));
}

#[test]
fn a_stale_name_back_from_a_lost_delete_leaves_the_live_file_its_number() {
    // A rename whose delete of the old name was lost (it sat in a damaged buffer, as in seed 5 of
    // the aged-image test) brings the old name back with the file's number. The live file's
    // records are all intact: it keeps its number, whichever name comes first in key order, and
    // the stale copy (changed before the rename) gets a new one.
    let key_of = |n: &[u8]| keys::meta_key(&keys::path_key(&[n]));
    let live: &[u8] = b"live";
    for stale_first in [true, false] {
        let (engine, fs) = small_fs();
        let old = (0..)
            .map(|i| format!("old{i}").into_bytes())
            .find(|n| (key_of(n) < key_of(live)) == stale_first)
            .unwrap();
        let ctx = Ctx::default();
        let (a, fh) = fs.create(ROOT_INO, &old, 0o644, libc::O_RDWR, ctx).unwrap();
        fs.write(a.ino, fh, 0, &[5u8; 5000], false).unwrap();
        fs.release(a.ino, fh).unwrap();
        let stale = engine.get(&key_of(&old)).unwrap().unwrap();
        // The rename's ctime is later than the stale copy's even on a coarse clock.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs.rename(ROOT_INO, &old, ROOT_INO, live, 0).unwrap();
        let before = walk(&fs);
        drop(fs);
        write(&engine, |b| {
            b.put(key_of(&old), stale);
        });
        let (classes, after) = repair_clean(&engine);
        assert!(classes.contains("DuplicateInode"), "{classes:?}");
        assert_eq!(
            path(&after, a.ino),
            vec!["/live".to_string()],
            "{stale_first}"
        );
        assert_eq!(after[&a.ino].2, before[&a.ino].2, "{stale_first}");
        let copy = after
            .iter()
            .find(|(_, v)| v.0 == vec![vec![old.clone()]])
            .map(|(k, _)| *k)
            .expect("the stale name is kept");
        assert_ne!(copy, a.ino);
    }
}

#[test]
fn root_records_and_sizes_are_rebuilt() {
    let (engine, fs) = small_fs();
    let before = walk(&fs);
    drop(fs);
    let c = before
        .iter()
        .find(|(_, v)| v.0[0].last().unwrap() == b"c")
        .map(|(k, _)| *k)
        .unwrap();
    let ck = keys::path_key(&[b"a", b"b", b"c"]);
    // No root, no schema record, a garbage inode, and /a/b/c shorter than its data.
    let v = engine.get(&keys::meta_key(&ck)).unwrap().unwrap();
    let amaranth_fs::Meta::Inode(mut inode) = amaranth_fs::Meta::decode(&v).unwrap() else {
        panic!("an inode")
    };
    inode.size = 10;
    write(&engine, |bt| {
        bt.delete(keys::meta_key(&[]));
        bt.delete(keys::system_key("format"));
        bt.put(
            keys::meta_key(&keys::path_key(&[b"junk"])),
            b"\x09garbage".to_vec(),
        );
        bt.put(keys::meta_key(&ck), inode.encode());
    });
    let (classes, after) = repair_clean(&engine);
    for c in ["RootMissing", "BadSchema", "BadMetadata", "DataBeyondEof"] {
        assert!(classes.contains(c), "{c} in {classes:?}");
    }
    assert_eq!(after[&c].2.size, 9000, "the size covers the data again");
    assert_eq!(after[&c].2.data, before[&c].2.data);
}

/// Out-of-line blocks (docs/WRITEONCE.md) whose count in the engine's data table is wrong: one
/// referenced by two files but counted once (the second file's references made by a prefix copy,
/// the table's count then lowered, as a lost count would leave it: the first delete would free a
/// block the other file still names), and one counted once more than it is referenced (a leak).
/// The check names both and stops at the first; the repair fixes the counts, and both files read
/// back whole.
#[test]
fn a_leaked_and_a_doubly_referenced_data_block_are_reported_and_repaired() {
    let (engine, fs) = small_fs();
    let ctx = Ctx::default();
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    for name in [&b"big"[..], b"copy"] {
        let (f, fh) = fs.create(ROOT_INO, name, 0o644, libc::O_RDWR, ctx).unwrap();
        fs.write(f.ino, fh, 0, &data, false).unwrap();
        fs.release(f.ino, fh).unwrap();
    }
    fs.fsync().unwrap();
    drop(fs);
    let prefix = |name: &[u8]| keys::data_prefix(&keys::path_key(&[name]));
    // "copy" now names big's blocks (its own released), as a clone would.
    write(&engine, |b| {
        b.copy_prefix(prefix(b"big"), prefix(b"copy"));
    });
    let blocks = engine.blocks_under_for_tests(&prefix(b"big"));
    assert_eq!(blocks.len(), 64, "the write went out of line");
    engine.adjust_data_refs_for_tests(blocks[0], -1);
    engine.adjust_data_refs_for_tests(blocks[1], 1);
    let rep = check::check(&engine, false, |_| {});
    let found: BTreeSet<String> = rep
        .problems
        .iter()
        .map(|p| format!("{:?}", p.class))
        .collect();
    assert!(
        found.contains("DataReferences") && found.contains("LeakedData"),
        "{:?}",
        rep.problems
    );
    assert_eq!(rep.exit_code(), 4);
    let (classes, _) = repair_clean(&engine);
    assert!(
        classes.contains("DataReferences") && classes.contains("LeakedData"),
        "{classes:?}"
    );
    engine.check_data_table().unwrap();
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    for name in [&b"big"[..], b"copy"] {
        let a = fs.lookup(ROOT_INO, name).unwrap();
        assert_eq!(fs.read(a.ino, 0, 300_000).unwrap(), data);
    }
}
