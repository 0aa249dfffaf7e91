//! Address plans: which addresses the hosts of a cluster get.
//!
//! netns clusters live in their own bridge namespace, so every cluster can use the same
//! dedicated subnets (10.200.0.0/16, fd00:200::/64) without clashing. Process clusters share
//! the machine's loopback, so each takes a block `127.B.0.0/16` reserved by a lock file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// Host `i`'s IPv4 address in a netns cluster.
pub fn netns_v4(i: usize) -> Ipv4Addr {
    let n = i + 2;
    Ipv4Addr::new(10, 200, (n / 250) as u8, (n % 250 + 1) as u8)
}

/// Host `i`'s IPv4 address on the second network of a dual-homed netns cluster
/// (10.201.0.0/16, on `eth1`).
pub fn netns_second_v4(i: usize) -> Ipv4Addr {
    let [a, b, c, d] = netns_v4(i).octets();
    Ipv4Addr::new(a, b + 1, c, d)
}

/// Host `i`'s IPv6 address on the second network (fd00:201::/64, on `eth1`).
pub fn netns_second_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x201, 0, 0, 0, 0, 0, (i + 2) as u16)
}

pub const NETNS_V4_PREFIX: u8 = 16;

/// Host `i`'s IPv6 address in a netns cluster.
pub fn netns_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, (i + 2) as u16)
}

pub const NETNS_V6_PREFIX: u8 = 64;

/// Host `i`'s address in loopback block `block`.
pub fn loopback(block: u8, i: usize) -> IpAddr {
    let n = i + 1;
    IpAddr::V4(Ipv4Addr::new(
        127,
        block,
        (n / 250) as u8,
        (n % 250 + 1) as u8,
    ))
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join(format!("{}-loopback", crate::PREFIX))
}

/// Takes an exclusive `flock` on `path` without waiting, and checks that `path` still names
/// the locked file (an unlocking owner unlinks it first), so a lock is never held on a file
/// that another process has already replaced.
pub(crate) fn try_lock(path: &Path) -> io::Result<Option<Flock<File>>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, e)) => return Err(e.into()),
    };
    let held = locked.metadata()?;
    match fs::metadata(path) {
        Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => Ok(Some(locked)),
        _ => Ok(None),
    }
}

/// A reserved loopback block, released on drop (and by the kernel if this process dies).
#[derive(Debug)]
pub struct LoopbackBlock {
    pub block: u8,
    path: PathBuf,
    lock: Option<Flock<File>>,
}

impl LoopbackBlock {
    /// Reserves a free block among 127.10.0.0/16 … 127.250.0.0/16.
    pub fn reserve() -> io::Result<LoopbackBlock> {
        let dir = lock_dir();
        fs::create_dir_all(&dir)?;
        for block in 10u8..=250 {
            let path = dir.join(format!("{block}.lock"));
            if let Some(mut lock) = try_lock(&path)? {
                lock.set_len(0)?;
                writeln!(lock, "{}", std::process::id())?;
                return Ok(LoopbackBlock {
                    block,
                    path,
                    lock: Some(lock),
                });
            }
        }
        Err(io::Error::other(
            "no free loopback block (127.10-250.x.x all reserved)",
        ))
    }
}

impl Drop for LoopbackBlock {
    fn drop(&mut self) {
        // Unlink while still holding the lock; see `try_lock`.
        let _ = fs::remove_file(&self.path);
        self.lock.take();
    }
}

/// The lock directory, for `gc`.
pub fn loopback_lock_dir() -> PathBuf {
    lock_dir()
}
