//! Processes as `/proc` shows them: one's name, state and process group, every process in a
//! network namespace (a host's), whoever started it, and this process's mounts.

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

/// One of this process's mounts, as `/proc/self/mountinfo` gives it (escapes kept: the
/// kernel writes space, tab, newline and backslash in a path as `\ooo` octal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub point: String,
    pub fstype: String,
    /// The file system's own options (an overlay's `lowerdir=…` among them).
    pub options: String,
}

/// This process's mounts, in mount order; none if `/proc` cannot be read.
pub fn mounts() -> Vec<Mount> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            // Fields: id parent dev root MOUNTPOINT options [optional…] - FSTYPE SOURCE SUPER.
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|x| *x == "-")?;
            Some(Mount {
                point: f.get(4)?.to_string(),
                fstype: f.get(dash + 1)?.to_string(),
                options: f.get(dash + 3).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// `path` as `/proc/self/mountinfo` writes a mount point.
pub fn mount_point_text(path: &Path) -> String {
    let mut text = String::new();
    for c in path.display().to_string().chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => text.push_str(&format!("\\{:03o}", c as u32)),
            c => text.push(c),
        }
    }
    text
}
