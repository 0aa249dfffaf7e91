//! This host and its peers as the system sees them: local names and addresses, name
//! resolution, and the address a host takes on the DVM interconnect.
//!
//! The only IO-touching part of identity derivation; the decisions are in [`dvmlab_core::identity`]
//! and [`dvmlab_core::net`].

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;

use ipnet::IpNet;

use dvmlab_core::conf::{Family, NetSpec, Settings};
use dvmlab_core::diag::{Diagnostic, Kind, Origin};
use dvmlab_core::hostname;
use dvmlab_core::identity::LocalHost;
use dvmlab_core::net::{self, Choice, Chosen};

/// A parsed hosts file (`/etc/hosts` format).
#[derive(Debug, Clone, Default)]
pub struct HostsFile {
    /// Lower-cased name → addresses, in file order.
    addrs: HashMap<String, Vec<IpAddr>>,
    /// Every line's names, for alias lookup.
    lines: Vec<Vec<String>>,
}

impl HostsFile {
    pub fn parse(text: &str) -> HostsFile {
        let mut h = HostsFile::default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) else {
                continue;
            };
            let names: Vec<String> = words.map(str::to_string).collect();
            for n in &names {
                let v = h.addrs.entry(n.to_ascii_lowercase()).or_default();
                if !v.contains(&ip) {
                    v.push(ip);
                }
            }
            h.lines.push(names);
        }
        h
    }

    pub fn load(path: &Path) -> io::Result<HostsFile> {
        std::fs::read_to_string(path).map(|t| HostsFile::parse(&t))
    }

    pub fn lookup(&self, name: &str) -> Vec<IpAddr> {
        self.addrs
            .get(&name.to_ascii_lowercase())
            .cloned()
            .unwrap_or_default()
    }

    /// Every name that shares a line with `name`.
    pub fn aliases(&self, name: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for names in &self.lines {
            if names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                for n in names {
                    if !out.contains(n) {
                        out.push(n.clone());
                    }
                }
            }
        }
        out
    }
}

/// How host names are resolved: the system resolver, or (test-only) one hosts file.
#[derive(Debug, Clone)]
pub enum Resolver {
    System,
    File(HostsFile),
}

impl Resolver {
    /// The resolver `settings` ask for.
    pub fn from_settings(s: &Settings) -> Result<Resolver, Diagnostic> {
        match &s.test_hosts_file {
            None => Ok(Resolver::System),
            Some(p) => HostsFile::load(p).map(Resolver::File).map_err(|e| {
                Diagnostic::new(
                    Kind::Unreadable,
                    Origin::File {
                        path: p.clone(),
                        line: None,
                    },
                    format!("cannot read test hosts file: {e}"),
                    p.display().to_string(),
                )
            }),
        }
    }

    /// Every address `name` resolves to (an IP literal resolves to itself).
    pub fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        if let Some(ip) = hostname::ip_literal(name) {
            return Ok(vec![ip]);
        }
        let mut v: Vec<IpAddr> = match self {
            Resolver::File(h) => h.lookup(name),
            Resolver::System => (name, 0).to_socket_addrs()?.map(|a| a.ip()).collect(),
        };
        let mut seen = std::collections::HashSet::new();
        v.retain(|a| seen.insert(*a));
        if v.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"));
        }
        Ok(v)
    }

    /// This host's names (host name and aliases) and addresses.
    pub fn local_host(&self, s: &Settings) -> io::Result<LocalHost> {
        let name = match &s.test_hostname {
            Some(n) => n.clone(),
            None => nix::unistd::gethostname()?
                .into_string()
                .map_err(|_| io::Error::other("host name is not UTF-8"))?,
        };
        let (aliases, addrs) = match self {
            Resolver::File(h) => (h.aliases(&name), h.lookup(&name)),
            Resolver::System => {
                let etc = HostsFile::load(Path::new("/etc/hosts")).unwrap_or_default();
                (etc.aliases(&name), interface_addrs()?)
            }
        };
        let mut names = vec![name];
        for a in aliases {
            if !names.contains(&a) {
                names.push(a);
            }
        }
        Ok(LocalHost { names, addrs })
    }

    /// `DVMNetworks` as subnets: interface names become the subnets of that local interface.
    pub fn networks(&self, s: &Settings) -> Result<Vec<IpNet>, Diagnostic> {
        let mut out = Vec::new();
        for spec in &s.networks {
            match spec {
                NetSpec::Cidr(n) => out.push(*n),
                NetSpec::Interface(name) => {
                    let nets: Vec<IpNet> = interface_nets()
                        .map_err(|e| {
                            Diagnostic::new(
                                Kind::NoMatchingAddress,
                                Origin::Host,
                                format!("cannot list interfaces: {e}"),
                                name.clone(),
                            )
                        })?
                        .into_iter()
                        .filter(|(i, n)| i == name && s.family.matches(&n.addr()))
                        .map(|(_, n)| n.trunc())
                        .collect();
                    if nets.is_empty() {
                        return Err(Diagnostic::new(
                            Kind::NoMatchingAddress,
                            s.networks_origin.clone().unwrap_or(Origin::Host),
                            "DVMNetworks names an interface with no address of the DVMIPVersion family on this host",
                            name.clone(),
                        ));
                    }
                    out.extend(nets);
                }
            }
        }
        Ok(out)
    }

    /// The address `host` (named at `origin`) has on the DVM interconnect.
    pub fn pick(
        &self,
        s: &Settings,
        networks: &[IpNet],
        host: &str,
        origin: &Origin,
    ) -> Result<Chosen, Diagnostic> {
        let addrs = self.resolve(host).map_err(|e| {
            Diagnostic::new(
                Kind::UnresolvedHost,
                origin.clone(),
                format!("cannot resolve host: {e}"),
                host,
            )
        })?;
        let list = |v: &[IpAddr]| {
            v.iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        net::choose(&addrs, s.family, networks, s.netmask).map_err(|c| match c {
            Choice::NoneOfFamily => Diagnostic::new(
                Kind::NoMatchingAddress,
                origin.clone(),
                format!(
                    "host has no IPv{} address (it resolves to {})",
                    if s.family == Family::V4 { 4 } else { 6 },
                    list(&addrs)
                ),
                host,
            ),
            Choice::OutsideNetworks(v) => Diagnostic::new(
                Kind::NoMatchingAddress,
                origin.clone(),
                format!(
                    "none of the host's addresses ({}) is in DVMNetworks",
                    list(&v)
                ),
                host,
            ),
            Choice::Ambiguous(v) => Diagnostic::new(
                Kind::AmbiguousAddress,
                origin.clone(),
                format!(
                    "host resolves to several addresses ({}); set DVMNetworks to pick one",
                    list(&v)
                ),
                host,
            ),
        })
    }
}

fn interface_nets() -> io::Result<Vec<(String, IpNet)>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
            continue;
        };
        let net = if let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
            IpNet::with_netmask(IpAddr::V4(a.ip()), IpAddr::V4(m.ip())).ok()
        } else if let (Some(a), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
            IpNet::with_netmask(IpAddr::V6(a.ip()), IpAddr::V6(m.ip())).ok()
        } else {
            None
        };
        if let Some(n) = net {
            out.push((ifa.interface_name, n));
        }
    }
    Ok(out)
}

fn interface_addrs() -> io::Result<Vec<IpAddr>> {
    Ok(interface_nets()?
        .into_iter()
        .map(|(_, n)| n.addr())
        .collect())
}

/// Whether this host can do IPv6 at all (the kernel has it and some interface holds an
/// IPv6 address).
pub fn ipv6_available() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|t| !t.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_files_give_addresses_and_aliases() {
        let h = HostsFile::parse(
            "127.0.0.1 localhost\n10.200.0.2 n01.lab n01 # c\n fd00:200::2 n01\nbad line\n",
        );
        assert_eq!(h.lookup("N01").len(), 2);
        assert_eq!(h.aliases("n01"), ["n01.lab", "n01"]);
        let r = Resolver::File(h);
        assert!(r.resolve("nope").is_err());
        assert_eq!(r.resolve("10.1.1.1").unwrap().len(), 1);
    }
}
