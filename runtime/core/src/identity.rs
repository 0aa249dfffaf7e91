//! Identity derivation: the DVM membership every daemon computes from `prte.conf`, and where
//! this host stands in it (rank and role), with no launcher to say so.

use std::net::IpAddr;

use serde::Serialize;

use crate::conf::Settings;
use crate::diag::{Diagnostic, Kind, Origin};
use crate::hostname;
use crate::tree::{RadixTree, Rank};

/// The DVM as the configuration defines it. The daemon derives its identity from it and the
/// controller builds its node pool from it, so both read the file the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub nspace: String,
    /// Whether `DVMControllerHost` is also listed in `DVMNodes` (then it is a compute node).
    pub controller_listed: bool,
    /// The host of each rank, indexed by rank; rank 0 is `DVMControllerHost`.
    pub hosts: Vec<String>,
    /// Where each rank's host was named, for diagnostics.
    pub origins: Vec<Origin>,
    /// Ranks that left the DVM (known to a daemon the controller launched later).
    pub departed: std::collections::BTreeSet<Rank>,
    keep_fqdn: bool,
}

impl Membership {
    /// Ranks the DVM: the controller is 0, the other `DVMNodes` entries follow in listed order.
    /// Names are stored as they are matched: short unless `KeepFQDNHostnames`.
    pub fn from_settings(s: &Settings) -> Membership {
        let stored = |name: &str| {
            if s.keep_fqdn {
                name.to_string()
            } else {
                hostname::short(name).to_string()
            }
        };
        let ctl_key = hostname::match_key(&s.controller_host, s.keep_fqdn);
        let mut hosts = vec![stored(&s.controller_host)];
        let mut origins = vec![s.controller_origin.clone()];
        let mut controller_listed = false;
        for n in &s.nodes {
            if hostname::match_key(&n.name, s.keep_fqdn) == ctl_key {
                controller_listed = true;
            } else {
                hosts.push(stored(&n.name));
                origins.push(n.origin.clone());
            }
        }
        Membership {
            nspace: s.namespace(),
            controller_listed,
            hosts,
            origins,
            departed: Default::default(),
            keep_fqdn: s.keep_fqdn,
        }
    }

    /// A daemon the controller launched into a grown DVM: the ranks added since `prte.conf`
    /// (this one among them) and those departed, as the launch told it (`origin`).
    pub fn join(&mut self, w: &crate::roster::Wireup, origin: &Origin) -> Result<(), String> {
        for (r, host) in &w.added {
            match self.hosts.get(*r as usize) {
                Some(h) if h == host => {}
                Some(h) => return Err(format!("rank {r} is {h} in prte.conf, not {host}")),
                None if *r as usize == self.hosts.len() => {
                    self.hosts.push(host.clone());
                    self.origins.push(origin.clone());
                }
                None => {
                    return Err(format!(
                        "rank {r} does not follow on from the {} ranks known",
                        self.hosts.len()
                    ))
                }
            }
        }
        self.departed.extend(w.departed.iter());
        Ok(())
    }

    /// Daemons in the DVM: `N` when the controller is listed in `DVMNodes`, else `N + 1`.
    pub fn size(&self) -> u32 {
        self.hosts.len() as u32
    }

    pub fn tree(&self, radix: u32) -> RadixTree {
        RadixTree::new(radix, self.size())
    }

    /// The ranks whose configured host is this host.
    fn ranks_of(&self, local: &LocalHost) -> Vec<Rank> {
        (0..self.size())
            .filter(|r| !self.departed.contains(r))
            .filter(|&r| local.is(&self.hosts[r as usize], self.keep_fqdn))
            .collect()
    }
}

/// What this host knows about itself: its names (host name, canonical name, aliases) and its
/// interface addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalHost {
    pub names: Vec<String>,
    pub addrs: Vec<IpAddr>,
}

impl LocalHost {
    /// Whether a configured host name or IP literal denotes this host: IP literals compare as
    /// addresses, names by the `KeepFQDNHostnames` rule against every local name and alias.
    pub fn is(&self, configured: &str, keep_fqdn: bool) -> bool {
        if let Some(ip) = hostname::ip_literal(configured) {
            return self.addrs.contains(&ip);
        }
        let key = hostname::match_key(configured, keep_fqdn);
        self.names
            .iter()
            .any(|n| hostname::match_key(n, keep_fqdn) == key)
    }
}

/// Whether this daemon is the DVM controller (the HNP) or an ordinary daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Controller,
    Daemon,
}

/// A daemon's identity: `(namespace, rank)`, its role and the host name the configuration
/// gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    pub nspace: String,
    pub rank: Rank,
    pub role: Role,
    pub host: String,
}

/// Finds this host in the membership. Exactly the host matching `DVMControllerHost` becomes
/// the controller; a host matching nothing, or matching two entries, is refused.
pub fn derive(m: &Membership, s: &Settings, local: &LocalHost) -> Result<Identity, Diagnostic> {
    let ranks = m.ranks_of(local);
    let describe = || {
        let mut parts: Vec<String> = local.names.clone();
        parts.extend(local.addrs.iter().map(|a| a.to_string()));
        parts.join(", ")
    };
    match ranks.as_slice() {
        [] => Err(Diagnostic::new(
            Kind::NotAMember,
            s.nodes_origin.clone(),
            format!(
                "this host is neither DVMControllerHost ({}) nor listed in DVMNodes (known as: {})",
                s.controller_host,
                describe()
            ),
            local.names.first().cloned().unwrap_or_default(),
        )),
        [rank] => Ok(Identity {
            nspace: m.nspace.clone(),
            rank: *rank,
            role: if *rank == 0 {
                Role::Controller
            } else {
                Role::Daemon
            },
            host: m.hosts[*rank as usize].clone(),
        }),
        several => Err(Diagnostic::new(
            Kind::AmbiguousIdentity,
            m.origins[several[1] as usize].clone(),
            format!(
                "this host matches several DVM entries ({}); refusing to guess a rank",
                several
                    .iter()
                    .map(|r| m.hosts[*r as usize].as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            describe(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::{ConfFile, Params};
    use std::path::Path;

    fn settings(text: &str) -> Settings {
        let conf = ConfFile::parse(text, Path::new("/etc/prte.conf")).unwrap();
        let read = |_: &Path| -> std::io::Result<String> { Ok(String::new()) };
        Settings::resolve(&conf, &Params::default(), &read).unwrap()
    }

    fn host(names: &[&str], addrs: &[&str]) -> LocalHost {
        LocalHost {
            names: names.iter().map(|s| s.to_string()).collect(),
            addrs: addrs.iter().map(|s| s.parse().unwrap()).collect(),
        }
    }

    fn rank_of(s: &Settings, names: &[&str]) -> Result<Identity, Diagnostic> {
        derive(&Membership::from_settings(s), s, &host(names, &[]))
    }

    #[test]
    fn controller_not_listed_gives_n_plus_one_daemons() {
        let s = settings("ClusterName=alpha\nDVMNodes=n[2:1-4]\nDVMControllerHost=head\n");
        let m = Membership::from_settings(&s);
        assert_eq!(m.size(), 5);
        assert!(!m.controller_listed);
        assert_eq!(m.nspace, "alpha-prte-dvm");
        let id = rank_of(&s, &["head"]).unwrap();
        assert_eq!((id.rank, id.role), (0, Role::Controller));
        assert_eq!(rank_of(&s, &["n03"]).unwrap().rank, 3);
    }

    #[test]
    fn controller_listed_is_skipped_in_numbering() {
        let s = settings("DVMNodes=n1,n2,n3,n4\nDVMControllerHost=n3\n");
        let m = Membership::from_settings(&s);
        assert_eq!(m.size(), 4);
        assert!(m.controller_listed);
        assert_eq!(m.hosts, ["n3", "n1", "n2", "n4"]);
        assert_eq!(rank_of(&s, &["n3"]).unwrap().rank, 0);
        assert_eq!(rank_of(&s, &["n4"]).unwrap().rank, 3);
    }

    #[test]
    fn names_are_stored_short_unless_keep_fqdn() {
        let s = settings("DVMNodes=n1.a.example,10.0.0.2\nDVMControllerHost=ctl.a.example\n");
        assert_eq!(
            Membership::from_settings(&s).hosts,
            ["ctl", "n1", "10.0.0.2"]
        );
        let s = settings(
            "DVMNodes=n1.a.example\nDVMControllerHost=ctl.a.example\nKeepFQDNHostnames=true\n",
        );
        assert_eq!(
            Membership::from_settings(&s).hosts,
            ["ctl.a.example", "n1.a.example"]
        );
    }

    #[test]
    fn names_match_short_unless_keep_fqdn_and_aliases_count() {
        let s = settings("DVMNodes=n1.cluster.example,n2\nDVMControllerHost=ctl\n");
        assert_eq!(rank_of(&s, &["n1.other"]).unwrap().rank, 1);
        assert_eq!(rank_of(&s, &["localhost", "N2.cluster"]).unwrap().rank, 2);
        let s = settings(
            "DVMNodes=n1.cluster.example,n1.b\nDVMControllerHost=ctl\nKeepFQDNHostnames=true\n",
        );
        assert_eq!(rank_of(&s, &["n1.b"]).unwrap().rank, 2);
        assert_eq!(rank_of(&s, &["n1"]).unwrap_err().kind, Kind::NotAMember);
    }

    #[test]
    fn ip_literals_match_local_addresses() {
        let s = settings("DVMNodes=10.200.0.2,10.200.0.3\nDVMControllerHost=10.200.0.1\n");
        let m = Membership::from_settings(&s);
        let id = derive(&m, &s, &host(&["x"], &["127.0.0.1", "10.200.0.3"])).unwrap();
        assert_eq!(id.rank, 2);
        let id = derive(&m, &s, &host(&["x"], &["10.200.0.1"])).unwrap();
        assert_eq!(id.role, Role::Controller);
    }

    #[test]
    fn a_stranger_is_refused_with_a_diagnostic_naming_it() {
        let s = settings("DVMNodes=n1,n2\nDVMControllerHost=ctl\n");
        let e = rank_of(&s, &["intruder"]).unwrap_err();
        assert_eq!(e.kind, Kind::NotAMember);
        assert_eq!(e.offending, "intruder");
        assert!(e.to_string().contains("/etc/prte.conf:1"), "{e}");
    }

    #[test]
    fn a_host_matching_two_entries_is_refused() {
        let s = settings("DVMNodes=n1,10.0.0.9\nDVMControllerHost=ctl\n");
        let m = Membership::from_settings(&s);
        let e = derive(&m, &s, &host(&["n1"], &["10.0.0.9"])).unwrap_err();
        assert_eq!(e.kind, Kind::AmbiguousIdentity);
    }
}
