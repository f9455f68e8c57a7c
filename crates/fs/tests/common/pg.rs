//! Power cuts with patchgroups: random workloads of several simulated processes that create,
//! depend, engage, disengage, sync and abandon groups (atomic ones too), fork children that
//! inherit them and exit, and make file-system changes in between, some derived from what other
//! processes wrote. The generator keeps its own model of the rules, so it knows the result of every
//! call (most succeed; some break a rule on purpose and must fail with the rule's error), which
//! records each change joins, when each atomic group opens and commits, and what each sync
//! promises. The checker then requires of every crash state: the tree equals the state after
//! some prefix of the steps that (1) includes everything a completed sync promised, (2) ends where
//! no atomic group is open (between its first change and its commit), and (3) keeps every declared
//! dependency (if it holds a change of `after`, it holds all of `before`'s).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use amaranth_device::{CrashPlan, FaultDevice};
use amaranth_engine::{Engine, Format, Options};
use amaranth_fs::patchgroup::{ProcessModel, PG_ATOMIC};
use amaranth_fs::{Ctx, Errno, Fs, FsOptions, ROOT_INO};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::{
    crash_plans, engine_options, format, normalize, recovered_tree, snapshot, synced_by, Snapshot,
};

/// The processes of a workload (children get ids from 200 up).
pub const PIDS: [u32; 3] = [101, 102, 103];

/// A patchgroup call; groups are named by the generator's slot numbers.
#[derive(Clone, Debug)]
pub enum Call {
    Create { slot: usize, atomic: bool },
    Depend { after: usize, before: usize },
    Release(usize),
    Engage(usize),
    Disengage(usize),
    Sync(Option<usize>),
    Abandon(usize),
}

/// One step of a workload, done by one process.
#[derive(Clone, Debug)]
pub enum Act {
    Creat(String),
    Write {
        path: String,
        offset: u64,
        len: usize,
        fill: u8,
    },
    Rename(String, String),
    Unlink(String),
    SetXattr(String, usize),
    /// Reads `from` (perhaps another process's uncommitted change) and writes it over `to`
    /// (nothing at all if `from` is empty: no change, no record).
    Copy {
        from: String,
        to: String,
    },
    Pg(Call),
    Fsync,
    Checkpoint,
    /// The process forks `child` (which inherits its groups at its first step, the next one).
    Spawn(u32),
    Exit,
}

#[derive(Clone, Debug)]
pub struct Step {
    pub pid: u32,
    pub act: Act,
    pub expect: Result<(), Errno>,
}

/// A workload and what the generator knows about it.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// For each atomic group that logged something: (its first change's step, its commit's step;
    /// `usize::MAX` if it never commits).
    pub windows: Vec<(usize, usize)>,
    /// For each dependency: the steps of `after`'s changes and of `before`'s changes.
    pub deps: Vec<(Vec<usize>, Vec<usize>)>,
    /// For each step that syncs: the number of steps the sync makes durable.
    pub promises: BTreeMap<usize, usize>,
    /// Directories made before the workload.
    pub dirs: Vec<String>,
}

impl Plan {
    /// Whether the state after `k` steps may be what a crash leaves.
    pub fn allows(&self, k: usize) -> bool {
        let open = self
            .windows
            .iter()
            .any(|&(first, close)| first < k && k <= close);
        let broken = self
            .deps
            .iter()
            .any(|(after, before)| after.iter().any(|&s| s < k) && before.iter().any(|&s| s >= k));
        !open && !broken
    }
}

// ----- the generator ------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct G {
    atomic: bool,
    released: bool,
    sealed: bool,
    engaged: BTreeSet<u32>,
    holders: BTreeSet<u32>,
    spent: bool,
    /// Steps of its changes.
    records: Vec<usize>,
    befores: Vec<usize>,
    /// Atomic: index in `windows` once it logged something.
    window: Option<usize>,
    /// It was engaged at some point.
    used: bool,
}

#[derive(Clone, Debug, Default)]
struct P {
    alive: bool,
    has_state: bool,
    handles: BTreeSet<usize>,
    engaged: Vec<usize>,
    atomic: Option<usize>,
    dir: String,
    files: Vec<String>,
    next_name: usize,
}

struct Gen {
    rng: SmallRng,
    plan: Plan,
    groups: Vec<G>,
    procs: BTreeMap<u32, P>,
    next_child: u32,
    /// Declared dependencies (after, before), turned into steps at the end.
    depends: Vec<(usize, usize)>,
    /// Files that hold data: a `Copy` from an empty file writes nothing, so it logs no record
    /// and joins no group (it must not open an atomic group's window, nor count as a change of
    /// a dependency).
    nonempty: BTreeSet<String>,
}

impl Gen {
    fn step(&mut self, pid: u32, act: Act, expect: Result<(), Errno>) -> usize {
        self.plan.steps.push(Step { pid, act, expect });
        self.plan.steps.len() - 1
    }

    /// The atomic group that has logged something and not committed, if any.
    fn open_window(&self) -> Option<usize> {
        self.groups.iter().position(|g| {
            g.window
                .is_some_and(|w| self.plan.windows[w].1 == usize::MAX)
        })
    }

    /// An atomic group engaged anywhere (logged something or not).
    fn atomic_engaged(&self) -> bool {
        self.groups
            .iter()
            .any(|g| g.atomic && !g.engaged.is_empty())
    }

    /// Records a successful change by `pid` at step `s`.
    fn joined(&mut self, pid: u32, s: usize) {
        for &g in &self.procs[&pid].engaged {
            let grp = &mut self.groups[g];
            grp.records.push(s);
            if grp.atomic && grp.window.is_none() {
                self.plan.windows.push((s, usize::MAX));
                grp.window = Some(self.plan.windows.len() - 1);
            }
        }
    }

    fn closure(&self, g: usize, out: &mut BTreeSet<usize>) {
        if out.insert(g) {
            for &b in &self.groups[g].befores {
                self.closure(b, out);
            }
        }
    }

    fn file_op(&mut self, pid: u32) {
        let p = &self.procs[&pid];
        let dir = p.dir.clone();
        let own = p.files.clone();
        let all: Vec<String> = self
            .procs
            .values()
            .flat_map(|q| q.files.iter().cloned())
            .collect();
        let r = self.rng.gen_range(0..100);
        let act = if own.is_empty() || r < 20 {
            let p = self.procs.get_mut(&pid).expect("proc");
            p.next_name += 1;
            let path = format!("{dir}/f{}", p.next_name);
            p.files.push(path.clone());
            Act::Creat(path)
        } else {
            let f = own.choose(&mut self.rng).expect("a file").clone();
            match r {
                20..=54 => Act::Write {
                    path: f,
                    offset: self.rng.gen_range(0..9000),
                    len: self.rng.gen_range(1..6000),
                    fill: self.rng.gen(),
                },
                55..=64 => {
                    let p = self.procs.get_mut(&pid).expect("proc");
                    p.next_name += 1;
                    let to = format!("{dir}/f{}", p.next_name);
                    p.files.retain(|x| *x != f);
                    p.files.push(to.clone());
                    Act::Rename(f, to)
                }
                65..=71 => {
                    self.procs
                        .get_mut(&pid)
                        .expect("proc")
                        .files
                        .retain(|x| *x != f);
                    Act::Unlink(f)
                }
                72..=79 => Act::SetXattr(f, self.rng.gen_range(1..200)),
                _ => {
                    let from = all.choose(&mut self.rng).expect("a file").clone();
                    if from == f {
                        Act::SetXattr(f, 7)
                    } else {
                        Act::Copy { from, to: f }
                    }
                }
            }
        };
        let changes = self.track_data(&act);
        let s = self.step(pid, act, Ok(()));
        if changes {
            self.joined(pid, s);
        }
    }

    /// Follows which files hold data through `act`; whether `act` logs a change.
    fn track_data(&mut self, act: &Act) -> bool {
        match act {
            Act::Write { path, .. } => {
                self.nonempty.insert(path.clone());
            }
            Act::Rename(from, to) if self.nonempty.remove(from) => {
                self.nonempty.insert(to.clone());
            }
            Act::Creat(path) | Act::Unlink(path) => {
                self.nonempty.remove(path);
            }
            Act::Copy { from, to } => {
                if !self.nonempty.contains(from) {
                    return false;
                }
                self.nonempty.insert(to.clone());
            }
            _ => {}
        }
        true
    }

    /// A patchgroup call by `pid`: usually the next step of one of its groups' lives (create,
    /// depend, release, engage, disengage, sync, abandon), sometimes a call that breaks a rule.
    fn pg_call(&mut self, pid: u32) {
        let held: Vec<usize> = self.procs[&pid].handles.iter().copied().collect();
        if held.len() < 2 || self.rng.gen_bool(0.12) {
            return self.create(pid);
        }
        let g = *held.choose(&mut self.rng).expect("a group");
        if self.rng.gen_bool(0.1) {
            return self.rule_breaker(pid, g, &held);
        }
        let grp = &self.groups[g];
        let mine = self.procs[&pid].engaged.contains(&g);
        if mine {
            if self.rng.gen_bool(0.35) {
                self.disengage_step(pid, g);
            } else {
                self.file_op(pid);
            }
        } else if !grp.released {
            let other = *held.choose(&mut self.rng).expect("a group");
            if other != g && self.rng.gen_bool(0.5) {
                self.depend(pid, g, other);
            } else {
                self.groups[g].released = true;
                self.step(pid, Act::Pg(Call::Release(g)), Ok(()));
            }
        } else if !grp.sealed && !grp.spent && (!grp.used || self.rng.gen_bool(0.3)) {
            self.engage(pid, g);
        } else {
            match self.rng.gen_range(0..10) {
                0..=3 => self.sync(pid, Some(g)),
                4..=7 => self.abandon(pid, g),
                _ => {
                    // A new group that depends on this one.
                    self.create(pid);
                    let after = self.groups.len() - 1;
                    self.depend(pid, after, g);
                }
            }
        }
    }

    fn create(&mut self, pid: u32) {
        let slot = self.groups.len();
        let atomic = self.rng.gen_bool(0.3);
        self.groups.push(G {
            atomic,
            holders: [pid].into(),
            ..G::default()
        });
        let p = self.procs.get_mut(&pid).expect("proc");
        p.handles.insert(slot);
        p.has_state = true;
        self.step(pid, Act::Pg(Call::Create { slot, atomic }), Ok(()));
    }

    fn depend(&mut self, pid: u32, a: usize, b: usize) {
        let (ga, gb) = (&self.groups[a], &self.groups[b]);
        let expect = if a == b {
            Err(Errno::EINVAL)
        } else if !gb.engaged.is_empty() {
            Err(Errno::EBUSY)
        } else if ga.released || ga.sealed {
            Err(Errno::EINVAL)
        } else {
            Ok(())
        };
        if expect.is_ok() {
            self.groups[b].sealed = true;
            self.groups[a].befores.push(b);
            self.depends.push((a, b));
        }
        self.step(
            pid,
            Act::Pg(Call::Depend {
                after: a,
                before: b,
            }),
            expect,
        );
    }

    fn engage(&mut self, pid: u32, g: usize) {
        let own_atomic = self.procs[&pid].atomic;
        let grp = &self.groups[g];
        if grp.engaged.contains(&pid) {
            self.step(pid, Act::Pg(Call::Engage(g)), Ok(()));
            return;
        }
        let expect = if !grp.released || grp.sealed || grp.spent {
            Err(Errno::EINVAL)
        } else if grp.atomic && (own_atomic.is_some() || !grp.engaged.is_empty()) {
            Err(Errno::EBUSY)
        } else {
            Ok(())
        };
        // Another process's atomic group would make this one wait: not in these workloads.
        if grp.atomic && expect.is_ok() && self.atomic_engaged() {
            return;
        }
        if expect.is_ok() {
            self.groups[g].used = true;
            self.groups[g].engaged.insert(pid);
            let p = self.procs.get_mut(&pid).expect("proc");
            p.engaged.push(g);
            if self.groups[g].atomic {
                p.atomic = Some(g);
            }
        }
        self.step(pid, Act::Pg(Call::Engage(g)), expect);
    }

    fn disengage_step(&mut self, pid: u32, g: usize) {
        let engaged = self.procs[&pid].engaged.contains(&g);
        let s = self.step(
            pid,
            Act::Pg(Call::Disengage(g)),
            if engaged { Ok(()) } else { Err(Errno::EINVAL) },
        );
        if engaged {
            self.disengage(pid, g, s);
        }
    }

    fn abandon(&mut self, pid: u32, g: usize) {
        if self.procs[&pid].engaged.contains(&g) {
            self.step(pid, Act::Pg(Call::Abandon(g)), Err(Errno::EBUSY));
            return;
        }
        self.procs.get_mut(&pid).expect("proc").handles.remove(&g);
        self.groups[g].holders.remove(&pid);
        self.step(pid, Act::Pg(Call::Abandon(g)), Ok(()));
    }

    /// A call that breaks a rule (or one that is legal in an odd state): the model names the
    /// result.
    fn rule_breaker(&mut self, pid: u32, g: usize, held: &[usize]) {
        match self.rng.gen_range(0..6) {
            0 => self.engage(pid, g),
            1 => self.disengage_step(pid, g),
            2 => {
                let b = *held.choose(&mut self.rng).expect("a group");
                self.depend(pid, g, b)
            }
            3 => self.abandon(pid, g),
            4 => {
                let which = self.rng.gen_bool(0.5).then_some(g);
                self.sync(pid, which)
            }
            _ => {
                // A group this process does not hold (another's, or one never made).
                let other = self
                    .groups
                    .iter()
                    .enumerate()
                    .find(|(_, x)| !x.holders.contains(&pid))
                    .map_or(self.groups.len() + 7, |(i, _)| i);
                let call = match self.rng.gen_range(0..4) {
                    0 => Call::Engage(other),
                    1 => Call::Release(other),
                    2 => Call::Sync(Some(other)),
                    _ => Call::Depend {
                        after: g,
                        before: other,
                    },
                };
                self.step(pid, Act::Pg(call), Err(Errno::ENOENT));
            }
        }
    }

    fn disengage(&mut self, pid: u32, g: usize, s: usize) {
        let p = self.procs.get_mut(&pid).expect("proc");
        p.engaged.retain(|&x| x != g);
        if p.atomic == Some(g) {
            p.atomic = None;
        }
        let grp = &mut self.groups[g];
        grp.engaged.remove(&pid);
        if grp.atomic && grp.engaged.is_empty() {
            grp.spent = true;
            if let Some(w) = grp.window {
                self.plan.windows[w].1 = s;
            }
        }
    }

    fn sync(&mut self, pid: u32, g: Option<usize>) {
        let own_atomic = self.procs[&pid].atomic.is_some();
        let open = self.open_window();
        match g {
            None => {
                let expect = if own_atomic {
                    Err(Errno::EBUSY)
                } else {
                    Ok(())
                };
                if open.is_some() && expect.is_ok() {
                    return; // it would wait for another process's group
                }
                let s = self.step(pid, Act::Pg(Call::Sync(None)), expect);
                if expect.is_ok() {
                    self.plan.promises.insert(s, s);
                }
            }
            Some(g) => {
                let grp = &self.groups[g];
                let expect = if own_atomic || (grp.atomic && !grp.engaged.is_empty()) {
                    Err(Errno::EBUSY)
                } else {
                    Ok(())
                };
                let mut closure = BTreeSet::new();
                self.closure(g, &mut closure);
                let mut need = 0;
                for &c in &closure {
                    let cg = &self.groups[c];
                    need = need.max(cg.records.iter().map(|&s| s + 1).max().unwrap_or(0));
                    if let Some(w) = cg.window {
                        let close = self.plan.windows[w].1;
                        if close != usize::MAX {
                            need = need.max(close + 1);
                        }
                    }
                }
                if expect.is_ok()
                    && open.is_some_and(|w| {
                        self.groups[w]
                            .window
                            .is_some_and(|i| self.plan.windows[i].0 < need)
                    })
                {
                    return; // it would wait for another process's group
                }
                let s = self.step(pid, Act::Pg(Call::Sync(Some(g))), expect);
                if expect.is_ok() {
                    self.plan.promises.insert(s, need);
                }
            }
        }
    }
}

impl Gen {
    fn new(seed: u64) -> Gen {
        let mut procs = BTreeMap::new();
        for (i, &pid) in PIDS.iter().enumerate() {
            procs.insert(
                pid,
                P {
                    alive: true,
                    dir: format!("p{i}"),
                    ..P::default()
                },
            );
        }
        let plan = Plan {
            dirs: (0..PIDS.len())
                .map(|i| format!("p{i}"))
                .chain((0..8).map(|i| format!("c{i}")))
                .collect(),
            ..Plan::default()
        };
        Gen {
            rng: SmallRng::seed_from_u64(seed),
            plan,
            groups: Vec::new(),
            procs,
            next_child: 200,
            depends: Vec::new(),
            nonempty: BTreeSet::new(),
        }
    }

    fn run(&mut self, n: usize) {
        while self.plan.steps.len() < n {
            let alive: Vec<u32> = self
                .procs
                .iter()
                .filter(|(_, p)| p.alive)
                .map(|(&t, _)| t)
                .collect();
            let pid = *alive.choose(&mut self.rng).expect("a live process");
            let child = pid >= 200;
            if let Some(g) = self.procs[&pid].atomic {
                if self.groups[g].records.len() >= 2 && self.rng.gen_bool(0.3) {
                    self.disengage_step(pid, g);
                    continue;
                }
            }
            match self.rng.gen_range(0..100) {
                0..=49 => self.file_op(pid),
                50..=86 => self.pg_call(pid),
                87..=91 => self.fsync(pid),
                92..=93 => {
                    if self.open_window().is_none() {
                        self.step(pid, Act::Checkpoint, Ok(()));
                    }
                }
                94..=96 if !child => self.spawn(pid),
                94..=99 if child => self.exit(pid),
                _ => self.file_op(pid),
            }
        }
    }

    fn fsync(&mut self, pid: u32) {
        let own = self.procs[&pid].atomic;
        let open = self.open_window();
        let promise = match (own, open) {
            // The owner of the open group: everything before the group's first change.
            (Some(a), Some(w)) if a == w => {
                let first = self.plan.windows[self.groups[w].window.expect("a window")].0;
                Some(first)
            }
            (_, Some(_)) => None, // would wait for another process's group
            _ => Some(self.plan.steps.len()),
        };
        if let Some(k) = promise {
            let s = self.step(pid, Act::Fsync, Ok(()));
            self.plan.promises.insert(s, k);
        }
    }

    fn spawn(&mut self, pid: u32) {
        // Only a parent with groups (then the child inherits them at its first step, the next).
        let c = self.next_child;
        if !self.procs[&pid].has_state || c >= 208 {
            return;
        }
        self.next_child += 1;
        let parent = self.procs[&pid].clone();
        for &g in &parent.handles {
            self.groups[g].holders.insert(c);
        }
        for &g in &parent.engaged {
            self.groups[g].engaged.insert(c);
        }
        self.procs.insert(
            c,
            P {
                alive: true,
                has_state: true,
                handles: parent.handles,
                engaged: parent.engaged,
                atomic: parent.atomic,
                dir: format!("c{}", c - 200),
                files: Vec::new(),
                next_name: 0,
            },
        );
        self.step(pid, Act::Spawn(c), Ok(()));
        self.file_op(c);
    }

    fn exit(&mut self, pid: u32) {
        let s = self.step(pid, Act::Exit, Ok(()));
        let p = self.procs[&pid].clone();
        for g in p.engaged {
            self.disengage(pid, g, s);
        }
        for g in p.handles {
            self.groups[g].holders.remove(&pid);
        }
        let p = self.procs.get_mut(&pid).expect("proc");
        p.alive = false;
        p.handles.clear();
    }

    fn finish(mut self) -> Plan {
        for (a, b) in std::mem::take(&mut self.depends) {
            let mut before = BTreeSet::new();
            self.closure(b, &mut before);
            let before_steps: Vec<usize> = before
                .iter()
                .flat_map(|&g| self.groups[g].records.iter().copied())
                .collect();
            self.plan
                .deps
                .push((self.groups[a].records.clone(), before_steps));
        }
        self.plan
    }
}

/// Generates a workload of about `n` steps.
pub fn generate(seed: u64, n: usize) -> Plan {
    let mut g = Gen::new(seed);
    g.run(n);
    g.finish()
}

// ----- recording --------------------------------------------------------------------------

/// The recorded run of a workload.
pub struct PgRun {
    pub dev: Arc<FaultDevice>,
    pub plan: Plan,
    /// Normalized snapshot after each prefix of the steps.
    pub states: Vec<Snapshot>,
    /// (trace position right after a completed sync, steps it made durable).
    pub syncs: Vec<(usize, usize)>,
    /// Trace position after each step.
    pub after_step: Vec<usize>,
    pub options: Options,
}

pub fn pg_fs_options() -> FsOptions {
    FsOptions {
        processes: ProcessModel::Declared,
        ..super::fs_options()
    }
}

fn split(path: &str) -> Vec<Vec<u8>> {
    path.split('/').map(|c| c.as_bytes().to_vec()).collect()
}

/// Resolves `path` to its parent directory and the inode at it, holding their lookups in `held`.
fn resolve(fs: &Fs, path: &str, held: &mut Vec<u64>) -> Result<(u64, Vec<u8>, Option<u64>), Errno> {
    let comps = split(path);
    let mut cur = ROOT_INO;
    for c in &comps[..comps.len() - 1] {
        cur = fs.lookup(cur, c)?.ino;
        held.push(cur);
    }
    let last = comps.last().expect("a name").clone();
    let ino = fs.lookup(cur, &last).ok().map(|a| a.ino);
    held.extend(ino);
    Ok((cur, last, ino))
}

fn file_act(fs: &Fs, act: &Act) -> Result<(), Errno> {
    let ctx = Ctx::default();
    let mut held = Vec::new();
    let r = (|| -> Result<(), Errno> {
        let existing = |p: &str, held: &mut Vec<u64>| -> Result<u64, Errno> {
            resolve(fs, p, held)?.2.ok_or(Errno::ENOENT)
        };
        match act {
            Act::Creat(p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                let (a, fh) = fs.create(d, &n, 0o644, libc::O_RDWR, ctx)?;
                fs.release(a.ino, fh)?;
                fs.forget(a.ino, 1);
            }
            Act::Write {
                path,
                offset,
                len,
                fill,
            } => {
                let i = existing(path, &mut held)?;
                let fh = fs.open(i, libc::O_RDWR, ctx)?;
                let data: Vec<u8> = (0..*len).map(|k| fill.wrapping_add(k as u8)).collect();
                let r = fs.write(i, fh, *offset, &data, false);
                fs.release(i, fh)?;
                assert_eq!(r?, *len, "a short write");
            }
            Act::Rename(a, b) => {
                let (da, na, _) = resolve(fs, a, &mut held)?;
                let (db, nb, _) = resolve(fs, b, &mut held)?;
                fs.rename(da, &na, db, &nb, 0)?;
            }
            Act::Unlink(p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                fs.unlink(d, &n)?;
            }
            Act::SetXattr(p, len) => {
                let i = existing(p, &mut held)?;
                fs.setxattr(i, b"user.pg", &vec![b'x'; *len], 0)?;
            }
            Act::Copy { from, to } => {
                let i = existing(from, &mut held)?;
                let o = existing(to, &mut held)?;
                let size = fs.getattr(i)?.size;
                let data = fs.read(i, 0, size as u32)?;
                if !data.is_empty() {
                    let fh = fs.open(o, libc::O_RDWR, ctx)?;
                    let r = fs.write(o, fh, 0, &data, false);
                    fs.release(o, fh)?;
                    assert_eq!(r?, data.len(), "a short write");
                }
            }
            _ => unreachable!("not a file operation: {act:?}"),
        }
        Ok(())
    })();
    for ino in held {
        fs.forget(ino, 1);
    }
    r
}

fn pg_act(fs: &Fs, pid: u32, call: &Call, ids: &mut BTreeMap<usize, u64>) -> Result<(), Errno> {
    let pg = fs.patchgroups();
    let id = |s: &usize| ids.get(s).copied().unwrap_or(u64::MAX);
    match call {
        Call::Create { slot, atomic } => {
            let g = pg.create(pid, if *atomic { PG_ATOMIC } else { 0 })?;
            ids.insert(*slot, g);
            Ok(())
        }
        Call::Depend { after, before } => pg.add_depend(pid, id(after), id(before)),
        Call::Release(g) => pg.release(pid, id(g)),
        Call::Engage(g) => pg.engage(pid, id(g)),
        Call::Disengage(g) => pg.disengage(pid, id(g)),
        Call::Sync(g) => pg.sync(pid, g.map_or(0, |g| id(&g))),
        Call::Abandon(g) => pg.abandon(pid, id(g)),
    }
}

/// Runs a plan on a fault-recording device; asserts every step's result.
pub fn record_pg(plan: &Plan) -> PgRun {
    let dev = Arc::new(FaultDevice::new(32 << 20));
    let options = Options {
        // Far longer than a workload: a group cut here would be a bug (and an unexpected
        // ETIMEDOUT), not a hang.
        atomic_group_timeout: std::time::Duration::from_secs(20),
        ..engine_options()
    };
    let f = Format {
        log_size: Some(4 << 20),
        ..format()
    };
    let engine = Engine::create(dev.clone(), f, options.clone()).expect("create");
    Fs::mkfs(&engine, 0, 0).expect("mkfs");
    let fs = Fs::new(Arc::new(engine), pg_fs_options()).expect("mount");
    for d in &plan.dirs {
        let a = fs
            .mkdir(ROOT_INO, d.as_bytes(), 0o755, Ctx::default())
            .expect("setup mkdir");
        fs.forget(a.ino, 1);
    }
    fs.fsync().expect("sync");
    dev.restart_recording();
    let mut states = vec![normalize(&snapshot(&fs))];
    let mut syncs = vec![(0, 0)];
    let mut after_step = vec![0];
    let mut ids = BTreeMap::new();
    for (i, step) in plan.steps.iter().enumerate() {
        let _caller = fs.caller(step.pid);
        let r = match &step.act {
            Act::Pg(call) => pg_act(&fs, step.pid, call, &mut ids),
            Act::Fsync => fs.fsync(),
            Act::Checkpoint => fs.engine().checkpoint().map_err(Errno::from),
            Act::Spawn(child) => {
                fs.patchgroups().spawned(*child, step.pid);
                Ok(())
            }
            Act::Exit => {
                fs.patchgroups().process_exited(step.pid);
                Ok(())
            }
            act => file_act(&fs, act),
        };
        assert_eq!(r, step.expect, "step {i} of the workload: {step:?}");
        drop(_caller);
        if let Some(&k) = plan.promises.get(&i) {
            syncs.push((dev.trace_len(), k));
        }
        after_step.push(dev.trace_len());
        states.push(normalize(&snapshot(&fs)));
    }
    drop(fs);
    PgRun {
        dev,
        plan: plan.clone(),
        states,
        syncs,
        after_step,
        options,
    }
}

/// Mounts what a power cut at `pos` under `cut` leaves and checks it against the run.
pub fn check_pg_state(run: &PgRun, pos: usize, cut: &CrashPlan, what: &str) -> usize {
    let img = run.dev.crash_image(pos, cut);
    let got = recovered_tree(img, run.options.clone(), pg_fs_options(), what);
    let min = synced_by(&run.syncs, pos);
    (min..run.states.len())
        .rev()
        .find(|&k| run.states[k] == got && run.plan.allows(k))
        .unwrap_or_else(|| {
            let any: Vec<usize> = (0..run.states.len())
                .filter(|&k| run.states[k] == got)
                .collect();
            panic!(
                "{what}: the recovered tree is no allowed state after at least {min} steps \
                 (equal to the states after {any:?} steps; allowed there: {:?})",
                any.iter().map(|&k| run.plan.allows(k)).collect::<Vec<_>>()
            )
        })
}

/// Checks every flush point, every step boundary and `random` other points under three plans.
pub fn check_pg_run(run: &PgRun, seed: u64, random: usize, what: &str) -> usize {
    let mut points = run.dev.flush_points();
    points.extend(run.after_step.iter().copied());
    let len = run.dev.trace_len();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x9a7c);
    points.extend((0..random).map(|_| rng.gen_range(0..=len)));
    points.push(len);
    points.sort();
    points.dedup();
    let mut n = 0;
    for (i, pos) in points.into_iter().enumerate() {
        for cut in crash_plans(seed, i) {
            check_pg_state(
                run,
                pos,
                &cut,
                &format!("{what}, crash at {pos} with {cut:?}"),
            );
            n += 1;
        }
    }
    n
}
