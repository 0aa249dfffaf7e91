//! A cluster's run directory: its hosts' `/etc` files and temporary directories and its
//! daemons' logs, on a tmpfs of its own where the harness may mount one.
//!
//! Every emulated host shares this machine's one file system, and a run leaves thousands of
//! files to delete (at 2048 hosts, each host's `hosts` file alone). On ext4 the inode
//! allocator skips inodes freed in the last seconds, reading their inode blocks one by one,
//! so after one run's teardown every file the next creates cost about a millisecond: a
//! daemon creating its session directory, its two files and its tools socket spent some
//! 4 ms of CPU in the allocator, most of what it spends from its start to joining, and the
//! harness as much again creating the logs. A real node creates those few files on its own
//! `/tmp` (often a tmpfs) and never sees another thousand hosts' deletions. A tmpfs per run
//! gives the hosts that, and takes the artifact out of what the benches time.

use std::fs;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// The most a run directory on its tmpfs may hold. A run at 2048 hosts holds about 150 MiB
/// (every host's `hosts` file lists every host); the rest is room for daemons' logs, and the
/// bound keeps a runaway log from filling this machine's memory.
pub const RUN_DIR_LIMIT: &str = "4g";

/// Creates `dir` and, when this process may mount (root) and `tmpfs` is asked for, mounts a
/// tmpfs of [`RUN_DIR_LIMIT`] on it. Returns whether it did. Without root it stays a plain
/// directory: the process backend runs without root, and loses only speed.
pub fn create(dir: &Path, tmpfs: bool) -> Result<bool, String> {
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    if !tmpfs || !nix::unistd::geteuid().is_root() {
        return Ok(false);
    }
    let opts = format!("size={RUN_DIR_LIMIT},mode=0755");
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(|e| format!("mount a tmpfs on the run directory {}: {e}", dir.display()))?;
    Ok(true)
}

/// Removes `dir` and everything in it, first unmounting the tmpfs [`create`] mounted there.
/// Lazily: a host's mount namespace that still holds a copy of it does not keep it here.
pub fn remove(dir: &Path, mounted: bool) {
    if mounted {
        let _ = umount2(dir, MntFlags::MNT_DETACH);
    }
    let _ = fs::remove_dir_all(dir);
}

/// Removes a run directory a cluster kept (or a crashed run left), unmounting first the
/// tmpfs [`create`] may have mounted on it.
pub fn remove_kept(dir: &Path) {
    remove(dir, is_tmpfs(dir));
}

/// Whether `dir` is the mount point of a tmpfs (as this process sees its mounts).
pub fn is_tmpfs(dir: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.display().to_string();
    info.lines().any(|l| {
        // Fields: id parent dev root MOUNTPOINT options [optional…] - FSTYPE SOURCE SUPER.
        let f: Vec<&str> = l.split(' ').collect();
        let fstype = f.iter().position(|x| *x == "-").and_then(|d| f.get(d + 1));
        f.get(4) == Some(&want.as_str()) && fstype == Some(&"tmpfs")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_is_a_tmpfs_of_its_own_as_root_and_goes_with_its_removal() {
        if !nix::unistd::geteuid().is_root() {
            crate::skip(
                "a_run_directory_is_a_tmpfs_of_its_own_as_root_and_goes_with_its_removal",
                "mounting a tmpfs needs root",
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!(
            "{}-rundir-test-{}",
            crate::PREFIX,
            std::process::id()
        ));
        assert!(create(&dir, true).expect("create"), "no tmpfs mounted");
        assert!(
            is_tmpfs(&dir),
            "{} is not a tmpfs mount point",
            dir.display()
        );
        fs::write(dir.join("f"), "x").expect("write into the run directory");
        remove(&dir, true);
        assert!(!is_tmpfs(&dir), "{} is still mounted", dir.display());
        assert!(!dir.exists(), "{} is still there", dir.display());
    }

    #[test]
    fn a_run_directory_asked_for_without_a_tmpfs_is_a_plain_directory() {
        let dir = std::env::temp_dir().join(format!(
            "{}-rundir-plain-{}",
            crate::PREFIX,
            std::process::id()
        ));
        assert!(!create(&dir, false).expect("create"));
        assert!(dir.is_dir() && !is_tmpfs(&dir));
        remove(&dir, false);
        assert!(!dir.exists());
    }
}
