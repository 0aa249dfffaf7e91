//! The job reaper: a small process, forked from the daemon before anything else starts,
//! that outlives a daemon killed with SIGKILL just long enough to kill the process groups of
//! its jobs.
//!
//! The parent-death signal reaches only a daemon's direct children, and it forces every job
//! process to be started by fork rather than the much cheaper vfork-style spawn. The reaper
//! covers both: the daemon tells it each job process group it starts and ends over a pipe,
//! and when the pipe reads end-of-file (the kernel closes it when the daemon dies, however
//! it dies) the reaper SIGKILLs every group still listed, so what a job process forked in its
//! group dies too. It leads its own process group, so a signal to the daemon's group (a
//! terminal's ^C, a test killing a "host") does not take it down with the daemon. A job
//! process that moves itself to another process group or session escapes it.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use nix::fcntl::OFlag;
use nix::sys::signal::{killpg, signal, SigHandler, Signal};
use nix::unistd::{fork, pipe2, setpgid, ForkResult, Pid};
use tracing::warn;

/// How long the reaper lets news from the daemon pile up before reading it.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(20);

/// The daemon's end of the pipe to its reaper.
pub struct Reaper {
    pipe: Option<File>,
}

impl Reaper {
    /// Forks the reaper. Must run while the process has one thread (before the async
    /// runtime), as only then may the child run ordinary code after fork.
    pub fn start() -> std::io::Result<Reaper> {
        // Close-on-exec: a job process holding the write end would keep the reaper waiting.
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        // SAFETY: the caller guarantees a single-threaded process (see above).
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop(write);
                serve(read)
            }
            ForkResult::Parent { .. } => {
                drop(read);
                Ok(Reaper {
                    pipe: Some(File::from(write)),
                })
            }
        }
    }

    /// A reaper that kills nothing, for a daemon that could not start one.
    pub fn none() -> Reaper {
        Reaper { pipe: None }
    }

    /// A job process group started.
    pub fn started(&mut self, group: i32) {
        self.tell(group);
    }

    /// A job process group ended: its number may be reused.
    pub fn ended(&mut self, group: i32) {
        self.tell(-group);
    }

    fn tell(&mut self, word: i32) {
        let Some(p) = self.pipe.as_mut() else { return };
        // Four bytes are written whole to a pipe, which holds 16384 such words: far more
        // than a node starts and ends in the reaper's coalescing interval.
        if let Err(e) = p.write_all(&word.to_le_bytes()) {
            warn!("the job reaper is gone ({e}): job processes may outlive a killed daemon");
            self.pipe = None;
        }
    }
}

/// The reaper's life: collect groups until the daemon's end closes, then kill them.
fn serve(read: OwnedFd) -> ! {
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
    let mut groups = HashSet::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut have = 0;
    loop {
        match pipe.read(&mut buf[have..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => have += n,
        }
        let whole = have - have % 4;
        for word in buf[..whole].chunks_exact(4) {
            let g = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            if g > 0 {
                groups.insert(g);
            } else {
                groups.remove(&g.saturating_neg());
            }
        }
        buf.copy_within(whole..have, 0);
        have -= whole;
        // Coalesce: waking once per job process on a busy node costs the jobs CPU, and the
        // kill after the daemon's death may come this much later without harm.
        std::thread::sleep(COALESCE);
    }
    for g in groups {
        let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
    }
    std::process::exit(0)
}
