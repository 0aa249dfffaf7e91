//! Address plans: which addresses the hosts of a cluster get.
//!
//! netns clusters live in their own bridge namespace, so every cluster can use the same
//! dedicated subnets (10.200.0.0/16, fd00:200::/64) without clashing. Process clusters share
//! the machine's loopback, so each takes a block `127.B.0.0/16` reserved by a lock file.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
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

/// A reserved loopback block, released on drop.
#[derive(Debug)]
pub struct LoopbackBlock {
    pub block: u8,
    path: PathBuf,
}

impl LoopbackBlock {
    /// Reserves a free block among 127.10.0.0/16 … 127.250.0.0/16, reclaiming locks whose
    /// owner process is gone.
    pub fn reserve() -> io::Result<LoopbackBlock> {
        let dir = lock_dir();
        fs::create_dir_all(&dir)?;
        let me = std::process::id();
        for block in 10u8..=250 {
            let path = dir.join(format!("{block}.lock"));
            for _ in 0..2 {
                match OpenOptions::new().write(true).create_new(true).open(&path) {
                    Ok(mut f) => {
                        writeln!(f, "{me}")?;
                        return Ok(LoopbackBlock { block, path });
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        if crate::gc::owner_gone(&path) {
                            let _ = fs::remove_file(&path);
                            continue;
                        }
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Err(io::Error::other(
            "no free loopback block (127.10-250.x.x all reserved)",
        ))
    }
}

impl Drop for LoopbackBlock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The lock directory, for `gc`.
pub fn loopback_lock_dir() -> PathBuf {
    lock_dir()
}
