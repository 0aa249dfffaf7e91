//! Processes as `/proc` shows them: one's name, state and process group, and every process
//! in a network namespace (a host's), whoever started it.

use std::fs;
use std::path::Path;

/// What `/proc/PID/stat` says of a process that a test or the lab cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The command's name, as the kernel keeps it (at most 15 bytes).
    pub comm: String,
    /// `R`, `S`, `T` (stopped), `Z` (a zombie), …
    pub state: char,
    pub pgrp: u32,
}

impl Stat {
    /// Whether it leads its process group.
    pub fn leads(&self, pid: u32) -> bool {
        self.pgrp == pid
    }
}

/// `pid`'s name, state and group; `None` once it is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp …`: the name may hold spaces and parentheses, so split at
    // the last ')'.
    let (head, rest) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some(Stat { comm, state, pgrp })
}

/// Every process in the network namespace `ns` names (`/run/netns/NAME`, or
/// `/proc/PID/ns/net` of a process inside it): also those something other than the harness
/// started there, such as the daemons an elastic DVM launches.
pub fn pids_in_netns(ns: &Path) -> Result<Vec<u32>, String> {
    use std::os::unix::fs::MetadataExt;
    let want = fs::metadata(ns)
        .map_err(|e| format!("{}: {e}", ns.display()))?
        .ino();
    let entries = fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    Ok(entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == want))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::Duration;

    #[test]
    fn a_process_name_group_and_stop_are_read_from_proc_and_a_gone_one_is_none() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let st = stat(pid).unwrap();
        assert!(st.leads(pid) && st.comm == "sleep", "{st:?}");
        assert!(pids_in_netns(Path::new("/proc/self/ns/net"))
            .unwrap()
            .contains(&pid));
        let p = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGSTOP).unwrap();
        crate::wait_until(
            Duration::from_secs(5),
            Duration::from_millis(5),
            || match stat(pid) {
                Some(s) if s.state == 'T' => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(stat(pid), None, "reaped");
    }
}
