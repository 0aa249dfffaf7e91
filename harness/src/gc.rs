//! Removing what crashed runs left behind: namespaces (and the processes in them), run
//! directories and loopback locks whose owning process is gone.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::PREFIX;

/// Whether `pid` names a live process.
pub fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| {
        p > 0 && !matches!(kill(Pid::from_raw(p), None), Err(nix::errno::Errno::ESRCH))
    })
}

/// The pid embedded in a harness name `dvl<pid>-...`.
pub fn owner_of(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Where run directories live.
pub fn runs_dir() -> PathBuf {
    std::env::temp_dir().join(format!("{PREFIX}-runs"))
}

/// Every harness-made network namespace on this machine.
pub fn harness_namespaces() -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX) && owner_of(n).is_some())
        .map(str::to_string)
        .collect()
}

/// SIGKILLs every process in the network namespace `ns` names.
pub fn kill_in_netns(ns: &Path) {
    for pid in crate::procs::pids_in_netns(ns).unwrap_or_default() {
        if let Ok(p) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
}

/// Kills every process inside namespace `ns` and deletes it.
pub fn delete_namespace(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(p) = pid.parse::<i32>() {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// What one `gc` pass removed.
#[derive(Debug, Default)]
pub struct Collected {
    pub namespaces: Vec<String>,
    pub run_dirs: Vec<PathBuf>,
    pub locks: Vec<PathBuf>,
    /// What it found and could not remove, and why.
    pub stuck: Vec<String>,
}

/// Removes leftovers of runs whose owner process is gone (`all`: of every run).
pub fn collect(all: bool) -> Collected {
    let mut c = Collected::default();
    let stale = |name: &str| all || owner_of(name).is_some_and(|p| !alive(p));
    for ns in harness_namespaces() {
        if stale(&ns) {
            delete_namespace(&ns);
            c.namespaces.push(ns);
        }
    }
    if let Ok(rd) = fs::read_dir(runs_dir()) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if stale(&name) {
                match crate::rundir::remove_kept(&e.path()) {
                    Ok(()) => c.run_dirs.push(e.path()),
                    Err(why) => c.stuck.push(why),
                }
            }
        }
    }
    for e in crate::addr::BlockKind::ALL
        .iter()
        .filter_map(|k| fs::read_dir(k.lock_dir()).ok())
        .flat_map(|rd| rd.flatten())
    {
        // A lock nobody holds belonged to a process that is gone.
        if let Ok(Some(lock)) = crate::addr::try_lock(&e.path()) {
            let _ = fs::remove_file(e.path());
            drop(lock);
            c.locks.push(e.path());
        }
    }
    c
}
