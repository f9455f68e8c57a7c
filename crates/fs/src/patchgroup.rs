//! Patchgroups: applications say "these changes reach the disk before those" instead of calling
//! fsync (Featherstitch's API), plus atomic groups. See docs/PATCHGROUPS.md.
//!
//! A group collects every change a process makes while the group is *engaged*. `add_depend(after,
//! before)` asks that every change of `before` reach the disk before any change of `after`.
//! Amaranth has one ordered redo log and recovers a prefix of it, so the dependency holds as soon
//! as every record of `before` precedes every record of `after` in the log. The rules guarantee it
//! (the proof, step by step):
//! 1. A change joins the groups its process has engaged when its record is appended: the process's
//!    *gate* is held shared from reading the engaged groups until the append (`Patchgroups::write`).
//! 2. `disengage` (and a process's exit) takes the gate exclusively, so when it returns, every
//!    change that joined the group from that process is in the log.
//! 3. `add_depend(after, before)` requires `before` engaged nowhere (`EBUSY`), so by 2. all of
//!    `before`'s records are already logged, and it seals `before`: a group with afters is never
//!    engaged again (`EINVAL`), so `before` gains no record later.
//! 4. It also requires `after` not yet released (`EINVAL`), and only a released group can be
//!    engaged, so `after` has no record yet: each of its records comes later, after all of
//!    `before`'s. (Dependencies chain: `before` itself can gain befores only before it is sealed.)
//! 5. A crash keeps a prefix of the log (engine/atomic.rs refines where it may end), so any record
//!    of `after` that survives comes with all of `before`'s.
//!
//! Cycles cannot be built: a group with afters never gains befores (4. and the sealing in 3.).
//!
//! Atomic groups (`PG_ATOMIC`) use the engine's atomic groups: engaging one begins an engine group
//! (one is open at a time: this may wait), every change of the engaging processes is logged in it,
//! and the last disengage commits it; it can be engaged only once.
//!
//! Groups belong to processes: a FUSE request carries a thread id, mapped to its process through
//! `/proc` (`procs.rs`); a process holds handles to groups, like file descriptors, and may act only
//! on the groups it holds (`ENOENT` otherwise). A process seen for the first time inherits the
//! handles and engagements of its nearest known ancestor (groups are copied across fork, as in
//! Featherstitch: that is how a wrapper orders unmodified programs). Exits are noticed through
//! pidfds: the process's groups are disengaged (an atomic one commits) and its handles dropped.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use amaranth_engine::{Batch, Engine, Error, Lsn};
use parking_lot::{Mutex, RwLock};

use crate::error::{Errno, Result};

mod procs;

pub use procs::ProcessModel;
use procs::ProcessView;

/// `create` flag: the group is atomic (all of its changes survive a crash or none does).
pub const PG_ATOMIC: u32 = 1;
/// Groups one process may hold at once (`EMFILE` beyond).
pub const MAX_PER_PROCESS: usize = 1024;
/// Groups that may exist at once in the file system (`ENFILE` beyond).
pub const MAX_GROUPS: usize = 65536;

thread_local! {
    /// The caller (thread id) of the file-system operation running on this thread.
    static CALLER: Cell<u32> = const { Cell::new(0) };
}

/// While it lives, file-system operations on this thread are attributed to the thread `pid` (a
/// FUSE request's pid: a thread id). Made by [`crate::Fs::caller`].
pub struct CallerScope {
    prev: u32,
    _not_send: PhantomData<*const ()>,
}

impl CallerScope {
    pub(crate) fn enter(pid: u32) -> CallerScope {
        CallerScope {
            prev: CALLER.with(|c| c.replace(pid)),
            _not_send: PhantomData,
        }
    }
}

impl Drop for CallerScope {
    fn drop(&mut self) {
        CALLER.with(|c| c.set(self.prev));
    }
}

fn caller() -> u32 {
    CALLER.with(|c| c.get())
}

/// One patchgroup.
#[derive(Debug, Default)]
struct Group {
    atomic: bool,
    /// No more befores may be added; it may be engaged.
    released: bool,
    /// Another group depends on it: it is never engaged again.
    sealed: bool,
    /// Processes that have it engaged.
    engaged_by: u32,
    /// Processes holding a handle to it.
    holders: u32,
    /// The newest log record of the group or of a group it depends on.
    newest: Option<Lsn>,
    /// Atomic: the engine's group while engaged.
    engine_id: Option<u64>,
    /// Atomic: it was engaged (and committed at its last disengage); never again.
    spent: bool,
}

/// A process with patchgroup state.
#[derive(Debug, Default)]
struct Proc {
    /// Held shared by each change from reading `engaged` to its log append, exclusively by
    /// `disengage` and exit handling (step 1 and 2 of the proof above).
    gate: Arc<RwLock<()>>,
    handles: BTreeSet<u64>,
    engaged: Vec<u64>,
    /// The engaged atomic group and its engine group.
    atomic: Option<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Registry {
    last_id: u64,
    groups: HashMap<u64, Group>,
    procs: HashMap<u32, Proc>,
    /// Thread → process, for threads seen while patchgroups are in use.
    tids: HashMap<u32, u32>,
    /// Processes already seen: inheritance is decided at first sight.
    seen: HashSet<u32>,
}

/// Bound on the thread and process caches (they are rebuilt from `/proc` when cleared).
const SEEN_MAX: usize = 1 << 16;

/// The patchgroups of a mounted file system.
pub struct Patchgroups {
    engine: Arc<Engine>,
    view: Box<dyn ProcessView>,
    reg: Mutex<Registry>,
}

impl Patchgroups {
    pub(crate) fn new(engine: Arc<Engine>, model: ProcessModel) -> Arc<Patchgroups> {
        Arc::new_cyclic(|me: &Weak<Patchgroups>| Patchgroups {
            engine,
            view: procs::view(model, me.clone()),
            reg: Mutex::new(Registry::default()),
        })
    }
}

/// The API: each call names the caller by its thread id.
impl Patchgroups {
    /// Creates a group held by the caller's process (flags: 0 or [`PG_ATOMIC`]).
    pub fn create(&self, tid: u32, flags: u32) -> Result<u64> {
        if flags & !PG_ATOMIC != 0 {
            return Err(Errno::EINVAL);
        }
        let tgid = self.process(tid, true)?.ok_or(Errno::ESRCH)?;
        let mut reg = self.reg.lock();
        if reg.groups.len() >= MAX_GROUPS {
            return Err(Errno::ENFILE);
        }
        reg.last_id += 1;
        let id = reg.last_id;
        let p = reg.procs.get_mut(&tgid).ok_or(Errno::ESRCH)?;
        if p.handles.len() >= MAX_PER_PROCESS {
            return Err(Errno::EMFILE);
        }
        p.handles.insert(id);
        reg.groups.insert(
            id,
            Group {
                atomic: flags & PG_ATOMIC != 0,
                holders: 1,
                ..Group::default()
            },
        );
        Ok(id)
    }

    /// Makes every change of `before` reach the disk before any change of `after`.
    pub fn add_depend(&self, tid: u32, after: u64, before: u64) -> Result<()> {
        let tgid = self.held_by(tid, &[after, before])?;
        if after == before {
            return Err(Errno::EINVAL);
        }
        self.reap_engagers(before);
        let mut reg = self.reg.lock();
        debug_assert!(reg.procs.contains_key(&tgid));
        let b = &reg.groups[&before];
        if b.engaged_by > 0 {
            return Err(Errno::EBUSY);
        }
        let newest = b.newest;
        let a = &reg.groups[&after];
        if a.released || a.sealed {
            return Err(Errno::EINVAL);
        }
        reg.groups.get_mut(&before).expect("held").sealed = true;
        let a = reg.groups.get_mut(&after).expect("held");
        a.newest = a.newest.max(newest);
        Ok(())
    }

    /// Closes the group to new befores; it may then be engaged.
    pub fn release(&self, tid: u32, g: u64) -> Result<()> {
        self.held_by(tid, &[g])?;
        self.reg
            .lock()
            .groups
            .get_mut(&g)
            .ok_or(Errno::ENOENT)?
            .released = true;
        Ok(())
    }

    /// Every change the caller's process makes from now on joins `g` (until `disengage`).
    pub fn engage(&self, tid: u32, g: u64) -> Result<()> {
        let tgid = self.held_by(tid, &[g])?;
        let gate = self.gate(tgid)?;
        let _excl = gate.write();
        let begin = {
            let mut reg = self.reg.lock();
            let p = reg.procs.get(&tgid).ok_or(Errno::ESRCH)?;
            if p.engaged.contains(&g) {
                return Ok(());
            }
            let has_atomic = p.atomic.is_some();
            let grp = reg.groups.get_mut(&g).ok_or(Errno::ENOENT)?;
            if !grp.released || grp.sealed || grp.spent {
                return Err(Errno::EINVAL);
            }
            if grp.atomic && (has_atomic || grp.engaged_by > 0) {
                return Err(Errno::EBUSY);
            }
            grp.engaged_by += 1;
            grp.atomic
        };
        let engine_id = if begin {
            // May wait for another process's atomic group (at most until its deadline).
            match self.engine.begin_atomic() {
                Ok(id) => Some(id),
                Err(e) => {
                    if let Some(grp) = self.reg.lock().groups.get_mut(&g) {
                        grp.engaged_by -= 1;
                    }
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let mut reg = self.reg.lock();
        if let Some(id) = engine_id {
            reg.groups.get_mut(&g).expect("engaged").engine_id = Some(id);
        }
        let p = reg.procs.get_mut(&tgid).expect("gate held");
        p.engaged.push(g);
        if let Some(id) = engine_id {
            p.atomic = Some((g, id));
        }
        Ok(())
    }

    /// The caller's process stops adding changes to `g`. Returns once every change that joined
    /// it from this process is logged. The last disengage of an atomic group commits it
    /// (`ETIMEDOUT` if it was cut at its time limit: what it held then is committed).
    pub fn disengage(&self, tid: u32, g: u64) -> Result<()> {
        let tgid = self.held_by(tid, &[g])?;
        let gate = self.gate(tgid)?;
        let _excl = gate.write();
        let commit = {
            let mut reg = self.reg.lock();
            let p = reg.procs.get_mut(&tgid).ok_or(Errno::ESRCH)?;
            let Some(at) = p.engaged.iter().position(|&x| x == g) else {
                return Err(Errno::EINVAL);
            };
            p.engaged.remove(at);
            if p.atomic.is_some_and(|(a, _)| a == g) {
                p.atomic = None;
            }
            Self::drop_engagement(&mut reg, g)
        };
        self.commit_atomic(g, commit)
    }

    /// Returns once `g` and every group it depends on are on stable storage (`g` 0: everything
    /// acknowledged so far, whatever the durability mode).
    pub fn sync(&self, tid: u32, g: u64) -> Result<()> {
        let target = if g == 0 {
            let tgid = self.process(tid, false)?;
            self.refuse_own_atomic(tgid)?;
            self.engine.sync()?;
            return Ok(());
        } else {
            let tgid = self.held_by(tid, &[g])?;
            self.refuse_own_atomic(Some(tgid))?;
            self.reap_engagers(g);
            let reg = self.reg.lock();
            let grp = &reg.groups[&g];
            if grp.atomic && grp.engaged_by > 0 {
                // Not durable before its commit.
                return Err(Errno::EBUSY);
            }
            grp.newest
        };
        if let Some(lsn) = target {
            self.engine.sync_to(lsn)?;
        }
        Ok(())
    }

    /// Drops the caller's handle to `g` (`EBUSY` while the caller has it engaged). Its
    /// dependencies stay in force.
    pub fn abandon(&self, tid: u32, g: u64) -> Result<()> {
        let tgid = self.held_by(tid, &[g])?;
        let mut reg = self.reg.lock();
        let p = reg.procs.get_mut(&tgid).ok_or(Errno::ESRCH)?;
        if p.engaged.contains(&g) {
            return Err(Errno::EBUSY);
        }
        p.handles.remove(&g);
        Self::drop_holder(&mut reg, g);
        Ok(())
    }

    /// Declares that process `child` was forked by `parent` ([`ProcessModel::Declared`] only;
    /// with real processes, `/proc` says it). The child inherits `parent`'s groups when it is
    /// first seen.
    pub fn spawned(&self, child: u32, parent: u32) {
        self.view.declare_parent(child, parent);
    }

    /// Process `tgid` ended: its groups are disengaged (an atomic one commits if it was the last
    /// to have it engaged) and its handles dropped.
    pub fn process_exited(&self, tgid: u32) {
        let Some(gate) = self.reg.lock().procs.get(&tgid).map(|p| p.gate.clone()) else {
            self.forget_process(tgid);
            return;
        };
        let _excl = gate.write();
        let (engaged, handles) = {
            let mut reg = self.reg.lock();
            let Some(p) = reg.procs.remove(&tgid) else {
                return;
            };
            let commits: Vec<(u64, Option<u64>)> = p
                .engaged
                .iter()
                .map(|&g| (g, Self::drop_engagement(&mut reg, g)))
                .collect();
            (commits, p.handles)
        };
        for (g, commit) in engaged {
            if let Err(e) = self.commit_atomic(g, commit) {
                log::warn!("amaranth: atomic group {g} of exited process {tgid}: {e}");
            }
        }
        let mut reg = self.reg.lock();
        for g in handles {
            Self::drop_holder(&mut reg, g);
        }
        drop(reg);
        self.forget_process(tgid);
    }

    /// Number of groups that exist (for tests and statistics).
    pub fn groups(&self) -> usize {
        self.reg.lock().groups.len()
    }

    /// The newest log record of group `g` or of a group it depends on (for tests and
    /// statistics).
    pub fn newest_record(&self, g: u64) -> Option<Lsn> {
        self.reg.lock().groups.get(&g).and_then(|grp| grp.newest)
    }
}

/// Hooks for the file-system operations.
impl Patchgroups {
    /// Logs and applies a batch for the current caller, adding it to the caller's engaged groups.
    /// The batch is given up (not copied) unless an atomic group takes it.
    pub(crate) fn write(&self, b: Batch) -> Result<Lsn> {
        let tgid = match self.process(caller(), false) {
            Ok(Some(t)) => t,
            _ => return Ok(self.engine.write_owned(b)?),
        };
        let Ok(gate) = self.gate(tgid) else {
            return Ok(self.engine.write_owned(b)?);
        };
        // Step 1 of the proof: engaged groups cannot change until the record is appended.
        let _shared = gate.read_recursive();
        let (engaged, atomic) = match self.reg.lock().procs.get(&tgid) {
            Some(p) => (p.engaged.clone(), p.atomic),
            None => (Vec::new(), None),
        };
        let r = match atomic {
            Some((_, id)) => self.engine.write_atomic(id, &b),
            None => self.engine.write_owned(b),
        };
        let lsn = r.map_err(|e| Self::group_error(e, atomic))?;
        if !engaged.is_empty() {
            let mut reg = self.reg.lock();
            for g in engaged {
                if let Some(grp) = reg.groups.get_mut(&g) {
                    grp.newest = grp.newest.max(Some(lsn));
                }
            }
        }
        Ok(lsn)
    }

    /// `fsync`: durable, except for the owner of an open atomic group, which cannot wait for its
    /// own commit: everything before its group becomes durable, the group with its commit.
    pub(crate) fn fsync(&self) -> Result<()> {
        if self.owns_atomic() {
            self.engine.flush_log()?;
        } else {
            self.engine.sync()?;
        }
        Ok(())
    }

    /// Makes the change with LSN `lsn` durable (the `sync` mount option), like [`Self::fsync`]:
    /// the owner of an open atomic group only flushes the log.
    pub(crate) fn sync_to(&self, lsn: Lsn) -> Result<()> {
        if self.owns_atomic() {
            self.engine.flush_log()?;
        } else {
            self.engine.sync_to(lsn)?;
        }
        Ok(())
    }

    fn owns_atomic(&self) -> bool {
        match self.process(caller(), false) {
            Ok(Some(t)) => self
                .reg
                .lock()
                .procs
                .get(&t)
                .is_some_and(|p| p.atomic.is_some()),
            _ => false,
        }
    }
}

/// Internals: errors, engagements, processes and their gates.
impl Patchgroups {
    fn group_error(e: Error, atomic: Option<(u64, u64)>) -> Errno {
        let g = atomic.map_or(0, |(g, _)| g);
        match &e {
            Error::GroupExpired(_) => {
                log::warn!(
                    "amaranth: a change in atomic patchgroup {g} after its time limit: ETIMEDOUT"
                );
                Errno::ETIMEDOUT
            }
            Error::GroupTooLarge { bytes, max, .. } => {
                log::warn!(
                    "amaranth: atomic patchgroup {g} would hold {bytes} bytes, above its limit of {max}: EFBIG"
                );
                Errno::EFBIG
            }
            _ => e.into(),
        }
    }

    /// Lowers `g`'s engagement count; returns the engine group to commit if it was the last
    /// engagement of an atomic group.
    fn drop_engagement(reg: &mut Registry, g: u64) -> Option<u64> {
        let grp = reg.groups.get_mut(&g)?;
        grp.engaged_by -= 1;
        if grp.engaged_by > 0 || !grp.atomic {
            return None;
        }
        grp.spent = true;
        grp.engine_id.take()
    }

    fn commit_atomic(&self, g: u64, engine_id: Option<u64>) -> Result<()> {
        let Some(id) = engine_id else { return Ok(()) };
        let r = self.engine.commit_atomic(id);
        if let Ok(Some(lsn)) = r {
            if let Some(grp) = self.reg.lock().groups.get_mut(&g) {
                grp.newest = grp.newest.max(Some(lsn));
            }
        }
        match r {
            Ok(_) => Ok(()),
            Err(Error::GroupExpired(_)) => Err(Errno::ETIMEDOUT),
            Err(e) => Err(e.into()),
        }
    }

    fn drop_holder(reg: &mut Registry, g: u64) {
        if let Some(grp) = reg.groups.get_mut(&g) {
            grp.holders -= 1;
            if grp.holders == 0 {
                debug_assert_eq!(grp.engaged_by, 0, "an engaged group without holders");
                reg.groups.remove(&g);
            }
        }
    }

    /// `EBUSY` if the process has an atomic group engaged (a durable sync would wait for it).
    fn refuse_own_atomic(&self, tgid: Option<u32>) -> Result<()> {
        let own = tgid.is_some_and(|t| {
            self.reg
                .lock()
                .procs
                .get(&t)
                .is_some_and(|p| p.atomic.is_some())
        });
        if own {
            Err(Errno::EBUSY)
        } else {
            Ok(())
        }
    }

    /// Processes that engage `g` but have exited (their exit not yet noticed) are handled now,
    /// so a wrapper that waited for its children sees their groups disengaged.
    fn reap_engagers(&self, g: u64) {
        let engagers: Vec<u32> = {
            let reg = self.reg.lock();
            if reg.groups.get(&g).is_none_or(|grp| grp.engaged_by == 0) {
                return;
            }
            reg.procs
                .iter()
                .filter(|(_, p)| p.engaged.contains(&g))
                .map(|(&t, _)| t)
                .collect()
        };
        for t in engagers {
            if !self.view.alive(t) {
                self.process_exited(t);
            }
        }
    }

    /// The caller's process if it holds every group in `gs` (`ENOENT` otherwise).
    fn held_by(&self, tid: u32, gs: &[u64]) -> Result<u32> {
        let tgid = self.process(tid, false)?.ok_or(Errno::ENOENT)?;
        let reg = self.reg.lock();
        let p = reg.procs.get(&tgid).ok_or(Errno::ENOENT)?;
        if gs.iter().all(|g| p.handles.contains(g)) {
            Ok(tgid)
        } else {
            Err(Errno::ENOENT)
        }
    }

    fn gate(&self, tgid: u32) -> Result<Arc<RwLock<()>>> {
        self.reg
            .lock()
            .procs
            .get(&tgid)
            .map(|p| p.gate.clone())
            .ok_or(Errno::ESRCH)
    }

    /// The process of thread `tid` if it has patchgroup state (made for it with `create`, or
    /// inherited from its nearest known ancestor at first sight).
    fn process(&self, tid: u32, create: bool) -> Result<Option<u32>> {
        if tid == 0 {
            return Ok(None);
        }
        {
            let reg = self.reg.lock();
            if !create && reg.procs.is_empty() {
                return Ok(None); // nobody uses patchgroups: no cost at all
            }
            if let Some(&tgid) = reg.tids.get(&tid) {
                if self.view.same(tgid, tid) {
                    if reg.procs.contains_key(&tgid) {
                        return Ok(Some(tgid));
                    }
                    if !create && reg.seen.contains(&tgid) {
                        return Ok(None);
                    }
                }
            }
        }
        let Some((tgid, ppid)) = self.view.identify(tid) else {
            return Ok(None); // gone
        };
        let mut reg = self.reg.lock();
        if reg.seen.len() >= SEEN_MAX {
            reg.seen.clear();
            reg.tids.clear();
        }
        reg.tids.insert(tid, tgid);
        let first_sight = reg.seen.insert(tgid);
        if !reg.procs.contains_key(&tgid) {
            let inherited = if first_sight {
                self.inherit(&mut reg, ppid)
            } else {
                None
            };
            if inherited.is_none() && !create {
                return Ok(None);
            }
            reg.procs.insert(tgid, inherited.unwrap_or_default());
            self.view.watch(tgid);
        }
        Ok(Some(tgid))
    }

    /// A copy of the groups of the nearest ancestor (from `parent` up) that has patchgroup state,
    /// if the search meets one before a process seen without any.
    fn inherit(&self, reg: &mut Registry, parent: u32) -> Option<Proc> {
        let mut a = parent;
        for _ in 0..64 {
            if a <= 1 {
                return None;
            }
            if let Some(p) = reg.procs.get(&a) {
                let child = Proc {
                    gate: Arc::default(),
                    handles: p.handles.clone(),
                    engaged: p.engaged.clone(),
                    atomic: p.atomic,
                };
                for g in &child.handles {
                    if let Some(grp) = reg.groups.get_mut(g) {
                        grp.holders += 1;
                        if child.engaged.contains(g) {
                            grp.engaged_by += 1;
                        }
                    }
                }
                return Some(child);
            }
            if reg.seen.contains(&a) {
                return None;
            }
            a = self.view.parent(a)?;
        }
        None
    }

    fn forget_process(&self, tgid: u32) {
        self.view.unwatch(tgid);
        let mut reg = self.reg.lock();
        reg.tids.retain(|_, t| *t != tgid);
        reg.seen.remove(&tgid);
    }
}
