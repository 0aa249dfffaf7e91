//! What the network shows of a daemon, whatever the runtime says: the TCP connections its
//! process (and anything it started) holds, read from the kernel's tables in `/proc`.
//!
//! The harness started every daemon, so it knows each one's pid on this machine; the
//! sockets that pid and its descendants hold, looked up in the `/proc/PID/net/tcp{,6}` of the
//! host's network namespace, are the connections that daemon made or accepted. A daemon's
//! **upstream** connections are its established ones to `DVMPort` on another host: the tree
//! parent it actually connected to, readable for a runtime that reports nothing. Reading
//! files, not running `ss` in each host, keeps a sample of a 66-host cluster cheap enough
//! to take at every status read.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::cluster::Cluster;

/// TCP state `ESTABLISHED` in `/proc/net/tcp`.
const ESTABLISHED: u8 = 1;

/// One row of `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRow {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub inode: u64,
}

/// Parses an address column (`0100007F:1E99`): the address as the kernel stores it, in
/// 32-bit words of host byte order, then the port in hexadecimal.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(a.get(8 * i..8 * i + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match a.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(b);
            // A dual-stack socket shows IPv4 peers as ::ffff:a.b.c.d.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Parses the text of `/proc/PID/net/tcp` or `tcp6`; rows it cannot read are an error naming
/// the line.
pub fn parse_tcp_table(text: &str) -> Result<Vec<TcpRow>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("/proc/net/tcp line {}: cannot read {line:?}", n + 1);
        if f.len() < 10 {
            return Err(bad());
        }
        rows.push(TcpRow {
            local: parse_addr(f[1]).ok_or_else(bad)?,
            remote: parse_addr(f[2]).ok_or_else(bad)?,
            state: u8::from_str_radix(f[3], 16).map_err(|_| bad())?,
            inode: f[9].parse().map_err(|_| bad())?,
        });
    }
    Ok(rows)
}

/// `pid` and every process it started, transitively (through `/proc/PID/task/*/children`).
fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            all.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<u32>().ok()),
            );
        }
    }
    all
}

/// The socket inodes `pids` hold open.
fn socket_inodes(pids: &[u32]) -> BTreeSet<u64> {
    let mut inodes = BTreeSet::new();
    for p in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{p}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let t = target.to_string_lossy();
            if let Some(n) = t
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|n| n.parse().ok())
            {
                inodes.insert(n);
            }
        }
    }
    inodes
}

/// The TCP connections the daemon on a host holds: (local, remote, state) of each socket its
/// process tree owns, from the tables of its network namespace.
pub fn daemon_connections(pid: u32) -> Result<Vec<TcpRow>, String> {
    let tree = process_tree(pid);
    let inodes = socket_inodes(&tree);
    let mut rows = Vec::new();
    for table in ["tcp", "tcp6"] {
        let path = format!("/proc/{pid}/net/{table}");
        match std::fs::read_to_string(&path) {
            Ok(text) => rows.extend(
                parse_tcp_table(&text)
                    .map_err(|e| format!("{path}: {e}"))?
                    .into_iter()
                    .filter(|r| inodes.contains(&r.inode)),
            ),
            // The daemon exited meanwhile: it holds nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            // A kernel without IPv6 has no tcp6 table.
            Err(_) if table == "tcp6" => {}
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
    Ok(rows)
}

impl Cluster {
    /// The host an address belongs to, if any host of this cluster has it.
    pub fn host_of(&self, addr: IpAddr) -> Option<&str> {
        self.hosts()
            .iter()
            .find(|h| h.v4 == Some(addr) || h.v6 == Some(addr) || h.second.contains(&addr))
            .map(|h| h.name.as_str())
    }

    /// The hosts the daemon on `host` holds an established connection to, on their `port`
    /// (its upstream links), as the kernel shows them now. Connections to itself (a tool
    /// of its own host) do not count; a peer address no host of the cluster has is given as
    /// the address. Empty when the daemon is not running.
    pub fn upstreams(&self, host: &str, port: u16) -> Result<Vec<String>, String> {
        let Some(pid) = self.pid(host) else {
            return Ok(Vec::new());
        };
        let mut peers: Vec<String> = daemon_connections(pid)
            .map_err(|e| format!("{host}: {e}"))?
            .into_iter()
            .filter(|r| r.state == ESTABLISHED && r.remote.port() == port && r.local.port() != port)
            .filter_map(|r| match self.host_of(r.remote.ip()) {
                Some(h) if h == host => None,
                Some(h) => Some(h.to_string()),
                None if r.remote.ip().is_loopback() => None,
                None => Some(r.remote.ip().to_string()),
            })
            .collect();
        peers.sort();
        peers.dedup();
        Ok(peers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ipv4_and_ipv6_rows_of_the_kernel_table() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0200C80A:C350 0100C80A:1E89 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1\n";
        let r = parse_tcp_table(t).unwrap();
        assert_eq!(r[0].local, "10.200.0.2:50000".parse().unwrap());
        assert_eq!(r[0].remote, "10.200.0.1:7817".parse().unwrap());
        assert_eq!((r[0].state, r[0].inode), (ESTABLISHED, 4242));
        let t6 = "hdr\n   0: 000002FD000000000000000002000000:C350 0000000000000000FFFF00000100C80A:1E89 01 0:0 0:0 0 0 0 77 1\n";
        let r = parse_tcp_table(t6).unwrap();
        assert_eq!(r[0].local, "[fd02::2]:50000".parse().unwrap());
        assert_eq!(r[0].remote, "10.200.0.1:7817".parse().unwrap());
    }

    #[test]
    fn a_row_it_cannot_read_is_an_error_naming_the_line() {
        let e = parse_tcp_table("hdr\n 0: nonsense\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn this_process_sees_its_own_connection_and_no_other() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let rows = daemon_connections(std::process::id()).unwrap();
        assert!(
            rows.iter().any(|r| r.state == ESTABLISHED
                && r.remote == l.local_addr().unwrap()
                && r.local == c.local_addr().unwrap()),
            "{rows:?}"
        );
    }
}
