//! Address plans: which addresses the hosts of a cluster get.
//!
//! netns clusters live in their own bridge namespace, so every cluster can use the same
//! dedicated subnets (10.200.0.0/16, fd00:200::/64) without clashing. Process clusters share
//! the machine's loopback, so each takes a block `127.B.0.0/16` reserved by a lock file.
//! Docker clusters' networks share the engine's address space, so each takes one of
//! [`DOCKER_BLOCKS`] blocks of subnets the same way.

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

/// A kind of address block clusters reserve, each with its own lock directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// `127.B.0.0/16` for process clusters, B in 10..=250.
    Loopback,
    /// Docker networks of a docker cluster (see [`docker_v4`]), B in 0..=15.
    Docker,
}

impl BlockKind {
    fn dir(self) -> PathBuf {
        let what = match self {
            BlockKind::Loopback => "loopback",
            BlockKind::Docker => "docker",
        };
        std::env::temp_dir().join(format!("{}-{what}", crate::PREFIX))
    }

    fn range(self) -> std::ops::RangeInclusive<u8> {
        match self {
            BlockKind::Loopback => 10..=250,
            BlockKind::Docker => 0..=DOCKER_BLOCKS - 1,
        }
    }

    /// Every kind, for `gc`.
    pub const ALL: [BlockKind; 2] = [BlockKind::Loopback, BlockKind::Docker];

    /// The lock directory, for `gc`.
    pub fn lock_dir(self) -> PathBuf {
        self.dir()
    }
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

/// A reserved address block, released on drop (and by the kernel if this process dies).
#[derive(Debug)]
pub struct Block {
    pub block: u8,
    path: PathBuf,
    lock: Option<Flock<File>>,
}

impl Block {
    /// Reserves a free block of `kind`.
    pub fn reserve(kind: BlockKind) -> io::Result<Block> {
        Block::reserve_except(kind, &|_| false)
    }

    /// Reserves a free block of `kind` for which `taken` is false (it may know of users that
    /// hold no lock).
    pub fn reserve_except(kind: BlockKind, taken: &dyn Fn(u8) -> bool) -> io::Result<Block> {
        let dir = kind.dir();
        fs::create_dir_all(&dir)?;
        for block in kind.range().filter(|b| !taken(*b)) {
            let path = dir.join(format!("{block}.lock"));
            if let Some(mut lock) = try_lock(&path)? {
                lock.set_len(0)?;
                writeln!(lock, "{}", std::process::id())?;
                return Ok(Block {
                    block,
                    path,
                    lock: Some(lock),
                });
            }
        }
        Err(io::Error::other(format!(
            "no free {kind:?} address block ({:?} all reserved)",
            kind.range()
        )))
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // Unlink while still holding the lock; see `try_lock`.
        let _ = fs::remove_file(&self.path);
        self.lock.take();
    }
}

/// How many docker clusters may exist at once on one machine.
pub const DOCKER_BLOCKS: u8 = 16;

/// Host `i`'s IPv4 address in docker block `b`: 10.(220+b).0.0/16.
pub fn docker_v4(b: u8, i: usize) -> Ipv4Addr {
    let [_, _, c, d] = netns_v4(i).octets();
    Ipv4Addr::new(10, 220 + b, c, d)
}

/// Host `i`'s IPv4 address on the second network of docker block `b`: 10.(236+b).0.0/16.
pub fn docker_second_v4(b: u8, i: usize) -> Ipv4Addr {
    let [_, _, c, d] = netns_v4(i).octets();
    Ipv4Addr::new(10, 220 + DOCKER_BLOCKS + b, c, d)
}

/// Host `i`'s IPv6 address in docker block `b`: fd00:220:b::/64.
pub fn docker_v6(b: u8, i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x220, u16::from(b), 0, 0, 0, 0, (i + 2) as u16)
}

/// Host `i`'s IPv6 address on the second network of docker block `b`: fd00:221:b::/64.
pub fn docker_second_v6(b: u8, i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x221, u16::from(b), 0, 0, 0, 0, (i + 2) as u16)
}

/// The subnets of docker block `b`'s network (`second`: its second network), IPv4 and IPv6.
pub fn docker_subnets(b: u8, second: bool) -> (String, String) {
    if second {
        (
            format!("10.{}.0.0/16", 220 + DOCKER_BLOCKS + b),
            format!("fd00:221:{b:x}::/64"),
        )
    } else {
        (
            format!("10.{}.0.0/16", 220 + b),
            format!("fd00:220:{b:x}::/64"),
        )
    }
}
