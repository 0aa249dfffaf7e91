//! The job reaper: a small process, forked from the daemon before anything else starts,
//! that outlives a daemon killed with SIGKILL just long enough to kill the process groups of
//! its jobs.
//!
//! The parent-death signal reaches only a daemon's direct children, and it forces every job
//! process to be started by fork rather than the much cheaper vfork-style spawn. The reaper
//! covers both. The daemon lists each job process group it starts in a table of memory it
//! shares with the reaper, and takes it off once the group's leader is reaped; the reaper
//! sleeps in a read of a pipe whose only writer is the daemon, and when that read ends (the
//! kernel closes the pipe when the daemon dies, however it dies) it SIGKILLs every group
//! still listed, so what a job process forked in its group dies too. Listing a group is a
//! store to memory: the reaper does not wake once while the daemon lives, which on a busy
//! node left the jobs' processes a core's worth of context switches (it used to be told
//! over the pipe). It leads its own process group, so a signal to the daemon's group (a
//! terminal's ^C, a test killing a "host") does not take it down with the daemon. A job
//! process that moves itself to another process group or session escapes it.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use dvmlab_proto::limits::MAX_PROCS_PER_NODE;
use nix::fcntl::OFlag;
use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
use nix::sys::signal::{killpg, signal, SigHandler, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe2, setpgid, ForkResult, Pid};
use tracing::warn;

/// Process groups the table holds at once: two nodes' worth of the most a job may place on
/// a node. Its pages are touched only as far as the most groups ever live together.
const REAPER_SLOTS: usize = 2 * MAX_PROCS_PER_NODE as usize;

/// The shared table: word 0 is how many slots have ever been used (the reaper reads no
/// further), words 1.. are the slots, a live group's number or 0.
struct Table {
    words: &'static [AtomicI32],
}

impl Table {
    fn new() -> std::io::Result<Table> {
        let len = NonZeroUsize::new((REAPER_SLOTS + 1) * size_of::<AtomicI32>())
            .ok_or_else(|| std::io::Error::other("empty reaper table"))?;
        // SAFETY: a fresh anonymous mapping aliases nothing; it is zeroed, and an all-zero
        // AtomicI32 is a valid 0. It is never unmapped, so the slice may live forever.
        let words = unsafe {
            let p = mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
            )?;
            std::slice::from_raw_parts(p.as_ptr().cast::<AtomicI32>(), REAPER_SLOTS + 1)
        };
        Ok(Table { words })
    }

    fn used(&self) -> usize {
        (self.words[0].load(Ordering::Acquire).max(0) as usize).min(REAPER_SLOTS)
    }
}

/// The daemon's side of the reaper: the shared table, which slot holds which group, and the
/// pipe whose closing wakes the reaper.
pub struct Reaper {
    inner: Option<Listing>,
}

struct Listing {
    table: Table,
    slot_of: HashMap<i32, usize>,
    /// Slots given back, reused before the table grows.
    free: Vec<usize>,
    /// Held, never written: the reaper's read ends when this closes.
    _pipe: File,
    warned: bool,
    /// Set once this listing is dropped: the reaper's exit that follows is expected.
    done: Arc<AtomicBool>,
}

impl Drop for Listing {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

impl Listing {
    fn new(table: Table, pipe: OwnedFd, done: Arc<AtomicBool>) -> Listing {
        Listing {
            table,
            slot_of: HashMap::new(),
            free: Vec::new(),
            _pipe: File::from(pipe),
            warned: false,
            done,
        }
    }
}

impl Reaper {
    /// Maps the table and forks the reaper. Must run while the process has one thread
    /// (before the async runtime), as only then may the child run ordinary code after fork.
    pub fn start() -> std::io::Result<Reaper> {
        let table = Table::new()?;
        // Close-on-exec: a job process holding the write end would keep the reaper waiting.
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        // SAFETY: the caller guarantees a single-threaded process (see above).
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop(write);
                serve(read, &table)
            }
            ForkResult::Parent { child } => {
                drop(read);
                let done = Arc::new(AtomicBool::new(false));
                watch(child, done.clone())?;
                Ok(Reaper {
                    inner: Some(Listing::new(table, write, done)),
                })
            }
        }
    }

    /// A reaper that kills nothing, for a daemon that could not start one.
    pub fn none() -> Reaper {
        Reaper { inner: None }
    }

    /// A job process group started.
    pub fn started(&mut self, group: i32) {
        let Some(l) = self.inner.as_mut() else { return };
        if group <= 0 || l.slot_of.contains_key(&group) {
            return;
        }
        let slot = match l.free.pop() {
            Some(s) => s,
            None => {
                let used = l.table.used();
                if used == REAPER_SLOTS {
                    if !l.warned {
                        l.warned = true;
                        warn!(
                            "the job reaper's table is full ({REAPER_SLOTS} process groups): \
                             groups started now outlive a killed daemon"
                        );
                    }
                    return;
                }
                l.table.words[0].store(used as i32 + 1, Ordering::Release);
                used + 1
            }
        };
        l.table.words[slot].store(group, Ordering::Release);
        l.slot_of.insert(group, slot);
    }

    /// A job process group ended: its number may be reused.
    pub fn ended(&mut self, group: i32) {
        let Some(l) = self.inner.as_mut() else { return };
        if let Some(slot) = l.slot_of.remove(&group) {
            l.table.words[slot].store(0, Ordering::Release);
            l.free.push(slot);
        }
    }

    /// Groups listed now (for tests).
    #[cfg(test)]
    fn listed(&self) -> Vec<i32> {
        let Some(l) = self.inner.as_ref() else {
            return Vec::new();
        };
        let mut g: Vec<i32> = (1..=l.table.used())
            .map(|s| l.table.words[s].load(Ordering::Acquire))
            .filter(|g| *g > 0)
            .collect();
        g.sort_unstable();
        g
    }
}

/// Stack of the thread that waits for the reaper: it only waits and logs.
const WATCH_STACK: usize = 64 << 10;

/// Waits on a thread of its own for the reaper to exit, which before `done` (the daemon let
/// go of it) it does only when killed by hand or by the kernel's OOM killer, and then says
/// so once: the daemon never writes to it, so nothing else would notice that its jobs have
/// lost their cover.
fn watch(reaper: Pid, done: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("reaper-watch".into())
        .stack_size(WATCH_STACK)
        .spawn(move || {
            crate::helper_thread_ignores_signals();
            let end = loop {
                match waitpid(reaper, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Ok(WaitStatus::Exited(_, code)) => break format!("exited with {code}"),
                    Ok(WaitStatus::Signaled(_, sig, _)) => break format!("was killed by {sig}"),
                    Ok(other) => break format!("ended ({other:?})"),
                    Err(e) => break format!("cannot be waited for ({e})"),
                }
            };
            if !done.load(Ordering::Acquire) {
                warn!(
                    "the job reaper (pid {reaper}) {end}: if this daemon is killed now, its \
                     job processes outlive it"
                );
            }
        })?;
    Ok(())
}

/// The reaper's life: sleep until the daemon's end of the pipe closes, then kill every
/// group the table still lists.
fn serve(read: OwnedFd, table: &Table) -> ! {
    let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
    let _ = nix::sys::prctl::set_name(c"prted-reaper");
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        // SAFETY: ignoring a signal installs no handler code.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    let mut pipe = File::from(read);
    let mut byte = [0u8; 1];
    // Nothing is ever written: the read returns at end-of-file, or fails, once the daemon
    // is gone; an interrupted read is tried again.
    loop {
        match pipe.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
    for slot in 1..=table.used() {
        let g = table.words[slot].load(Ordering::Acquire);
        if g > 0 {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
    }
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing() -> Reaper {
        let (_read, write) = pipe2(OFlag::O_CLOEXEC).expect("pipe");
        Reaper {
            inner: Some(Listing::new(
                Table::new().expect("table"),
                write,
                Arc::default(),
            )),
        }
    }

    #[test]
    fn the_table_lists_exactly_the_groups_started_and_not_ended() {
        let mut r = listing();
        for g in [10, 11, 12] {
            r.started(g);
        }
        r.ended(11);
        r.started(13);
        r.started(13);
        assert_eq!(r.listed(), vec![10, 12, 13]);
        r.ended(10);
        r.ended(12);
        r.ended(13);
        r.ended(99);
        assert!(r.listed().is_empty());
    }

    #[test]
    fn slots_given_back_are_reused_so_the_table_grows_only_with_live_groups() {
        let mut r = listing();
        for round in 0..1000 {
            r.started(100 + round);
            r.started(5000 + round);
            r.ended(100 + round);
            r.ended(5000 + round);
        }
        let used = r.inner.as_ref().map(|l| l.table.used());
        assert_eq!(used, Some(2));
    }

    #[test]
    fn a_full_table_refuses_more_groups_without_losing_the_listed_ones() {
        let mut r = listing();
        for g in 1..=REAPER_SLOTS as i32 {
            r.started(g);
        }
        r.started(REAPER_SLOTS as i32 + 1);
        let listed = r.listed();
        assert_eq!(listed.len(), REAPER_SLOTS);
        assert!(!listed.contains(&(REAPER_SLOTS as i32 + 1)));
        r.ended(1);
        r.started(REAPER_SLOTS as i32 + 1);
        assert!(r.listed().contains(&(REAPER_SLOTS as i32 + 1)));
    }
}
