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
use std::sync::Once;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// The most a run directory on its tmpfs may hold. A run at 2048 hosts holds about 150 MiB
/// (every host's `hosts` file lists every host); the rest is room for daemons' logs, and the
/// bound keeps a runaway log from filling this machine's memory.
pub const RUN_DIR_LIMIT: &str = "4g";

/// Creates `dir` and, when this process is root and `tmpfs` is asked for, mounts a tmpfs of
/// [`RUN_DIR_LIMIT`] on it. Returns whether it did. Without root, or where root may not mount
/// (an unprivileged container), it stays a plain directory, said once: the hosts lose only
/// speed.
pub fn create(dir: &Path, tmpfs: bool) -> Result<bool, String> {
    // A directory of this name is a crashed run's whose pid this process now has: a mount
    // on top of its tmpfs would hide that one from every later removal.
    if dir.exists() {
        remove_kept(dir)?;
    }
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    if !tmpfs || !nix::unistd::geteuid().is_root() {
        return Ok(false);
    }
    let opts = format!("size={RUN_DIR_LIMIT},mode=0755");
    match mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    ) {
        Ok(()) => Ok(true),
        Err(e) => {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "harness: no tmpfs for run directories ({}: {e}); they stay on this machine's disk, where the files hosts create cost more",
                    dir.display()
                );
            });
            Ok(false)
        }
    }
}

/// Removes `dir` and everything in it, first unmounting the tmpfs [`create`] mounted there.
/// Lazily: a host's mount namespace that still holds a copy of it does not keep it here.
pub fn remove(dir: &Path, mounted: bool) {
    if mounted {
        let _ = umount2(dir, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
    }
    let _ = fs::remove_dir_all(dir);
}

/// How many tmpfs mounts may have been stacked on one run directory (by builds before a
/// crashed run's directory was removed rather than mounted over).
const MOST_STACKED: usize = 8;

/// Removes a run directory a cluster kept (or a crashed run left), unmounting first every
/// tmpfs mounted on it; an error if it is still there after. Only a real directory that is
/// itself a tmpfs mount point is unmounted: `gc` runs as root over a directory others may
/// write into, and a link planted there must not lead it to unmount anything else.
pub fn remove_kept(dir: &Path) -> Result<(), String> {
    match fs::symlink_metadata(dir) {
        Err(_) => return Ok(()),
        Ok(m) if !m.file_type().is_dir() => {
            return fs::remove_file(dir).map_err(|e| format!("{}: {e}", dir.display()));
        }
        Ok(_) => {}
    }
    for _ in 0..MOST_STACKED {
        if tmpfs_mounts(dir) == 0 {
            break;
        }
        if let Err(e) = umount2(dir, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            return Err(format!(
                "{}: a tmpfs is mounted on it and cannot be unmounted: {e}",
                dir.display()
            ));
        }
    }
    remove(dir, false);
    if dir.exists() {
        return Err(format!("{}: could not be removed", dir.display()));
    }
    Ok(())
}

/// Whether `dir` is the mount point of a tmpfs, as this process sees its mounts.
pub fn is_tmpfs(dir: &Path) -> bool {
    tmpfs_mounts(dir) > 0
}

/// How many tmpfs mounts this process sees at `dir` (its real path: a `TMPDIR` through a link
/// names the mount point differently).
fn tmpfs_mounts(dir: &Path) -> usize {
    let Ok(dir) = fs::canonicalize(dir) else {
        return 0;
    };
    let want = crate::procs::mount_point_text(&dir);
    crate::procs::mounts()
        .iter()
        .filter(|m| m.point == want && m.fstype == "tmpfs")
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own with a tmpfs mounted on it, or `None` (said loudly)
    /// where this process may not mount.
    fn mounted(test: &str) -> Option<std::path::PathBuf> {
        if !nix::unistd::geteuid().is_root() {
            crate::skip(test, "mounting a tmpfs needs root");
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("{}-{test}-{}", crate::PREFIX, std::process::id()));
        if !create(&dir, true).expect("create") {
            remove(&dir, false);
            crate::skip(test, "root may not mount here (an unprivileged container?)");
            return None;
        }
        Some(dir)
    }

    #[test]
    fn a_run_directory_is_a_tmpfs_of_its_own_as_root_and_goes_with_its_removal() {
        let Some(dir) =
            mounted("a_run_directory_is_a_tmpfs_of_its_own_as_root_and_goes_with_its_removal")
        else {
            return;
        };
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
    fn a_crashed_runs_directory_of_the_same_name_is_replaced_not_mounted_over() {
        let Some(dir) =
            mounted("a_crashed_runs_directory_of_the_same_name_is_replaced_not_mounted_over")
        else {
            return;
        };
        fs::write(dir.join("left"), "x").expect("write");
        assert!(create(&dir, true).expect("second create"));
        let mounts = tmpfs_mounts(&dir);
        let left = dir.join("left").exists();
        remove(&dir, true);
        assert_eq!(mounts, 1, "tmpfs mounts stacked on {}", dir.display());
        assert!(!left, "the crashed run's files are still there");
        assert!(!is_tmpfs(&dir) && !dir.exists());
    }

    /// `gc` removes, as root, what it finds in a directory others may write into: a link
    /// there to a mount point is removed itself, and what it names stays mounted.
    #[test]
    fn a_link_among_run_directories_is_removed_not_followed_to_a_mount() {
        let Some(target) =
            mounted("a_link_among_run_directories_is_removed_not_followed_to_a_mount")
        else {
            return;
        };
        let link = target.with_extension("link");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let removed = remove_kept(&link);
        let still = is_tmpfs(&target);
        remove(&target, true);
        assert_eq!(removed, Ok(()));
        assert!(
            fs::symlink_metadata(&link).is_err(),
            "the link is still there"
        );
        assert!(still, "following the link unmounted {}", target.display());
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
