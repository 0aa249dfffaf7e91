//! Bootstrap preparation: everything a `prted --bootstrap` works out before it listens —
//! settings, membership, its own identity and address, and the addresses of its ancestors —
//! with every failure a [`Diagnostic`].

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ipnet::IpNet;
use serde::Serialize;

use crate::hosts::{self, Resolver};
use dvmlab_core::conf::{Family, Params, Settings};
use dvmlab_core::diag::{Diagnostic, Kind, Origin};
use dvmlab_core::identity::{self, Identity, Membership};
use dvmlab_core::net::{Chosen, ContactUri};
use dvmlab_core::tree::{RadixTree, Rank};

/// A daemon ready to start: who it is and how to reach the ranks it may connect to.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub settings: Settings,
    pub membership: Membership,
    pub identity: Identity,
    pub tree: RadixTree,
    pub resolver: Resolver,
    pub networks: Vec<IpNet>,
    /// This daemon's own listening address and mask.
    pub own: Chosen,
    /// Contact address of every ancestor, the controller included.
    pub ancestors: BTreeMap<Rank, Chosen>,
    /// A daemon the controller launched to grow the DVM: the membership it was given
    /// ([`JOIN_PARAM`]), beyond `prte.conf`.
    pub join: Option<dvmlab_core::roster::Wireup>,
    /// Ranks `prte.conf` defines.
    pub conf_size: u32,
    /// The `--prtemca` pairs this daemon was given (the controller passes them on to the
    /// daemons it launches).
    pub cli: Vec<(String, String)>,
}

/// The parameter the controller gives a daemon it launches: the membership beyond
/// `prte.conf` (`EPOCH/RANK=HOST,…/DEPARTED`), which names this daemon's host and rank.
pub const JOIN_PARAM: &str = "dvmlab_join";

/// What `prted --bootstrap --show-identity --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct IdentityReport {
    pub namespace: String,
    pub rank: Rank,
    pub role: identity::Role,
    pub host: String,
    pub uri: String,
    pub daemons: u32,
    pub controller_listed: bool,
    pub radix: u32,
    pub parent: Option<Rank>,
    pub parent_uri: Option<String>,
    pub ancestors: Vec<Rank>,
    pub family: Family,
    pub port: u16,
    pub conf: String,
}

/// Where each ancestor's daemon is now: its host name resolved again, exactly as at
/// bootstrap (the same resolver, address family and DVMNetworks). A host that came back
/// under its name with another address (a rescheduled container or pod, a new lease) is
/// found there by the next connect attempt.
#[derive(Debug, Clone)]
pub struct Ancestors {
    resolver: Resolver,
    settings: Settings,
    networks: Vec<IpNet>,
    hosts: BTreeMap<Rank, (String, Origin)>,
}

impl Ancestors {
    /// `rank`'s address as its name resolves now (blocking: a name service lookup), or
    /// `None` when it does not resolve or `rank` is not an ancestor.
    pub fn address(&self, rank: Rank) -> Option<std::net::IpAddr> {
        let (host, origin) = self.hosts.get(&rank)?;
        self.resolver
            .pick(&self.settings, &self.networks, host, origin)
            .ok()
            .map(|c| c.addr)
    }
}

impl Prepared {
    /// The ancestors by name, to resolve again when connecting to them later.
    pub fn ancestors_by_name(&self) -> Ancestors {
        let hosts = self
            .ancestors
            .keys()
            .map(|&r| {
                let i = r as usize;
                let named = (
                    self.membership.hosts[i].clone(),
                    self.membership.origins[i].clone(),
                );
                (r, named)
            })
            .collect();
        Ancestors {
            resolver: self.resolver.clone(),
            settings: self.settings.clone(),
            networks: self.networks.clone(),
            hosts,
        }
    }

    /// Reads the configuration and derives this host's place in the DVM.
    pub fn new(params: &Params) -> Result<Prepared, Diagnostic> {
        let settings = crate::conf_file::load(params)?;
        let resolver = Resolver::from_settings(&settings)?;
        if settings.family == Family::V6
            && settings.test_hosts_file.is_none()
            && !hosts::ipv6_available()
        {
            return Err(Diagnostic::new(
                Kind::Ipv6Unavailable,
                Origin::File {
                    path: settings.conf_path.clone(),
                    line: None,
                },
                "DVMIPVersion=6 but this host has no IPv6 (no IPv6 addresses in /proc/net/if_inet6)",
                "DVMIPVersion=6",
            ));
        }
        let mut membership = Membership::from_settings(&settings);
        let conf_size = membership.size();
        let join = match params.get(JOIN_PARAM) {
            None => None,
            Some((v, origin)) => {
                let bad = |e: String| {
                    Diagnostic::new(
                        Kind::BadValue,
                        origin.clone(),
                        format!("{JOIN_PARAM}: {e}"),
                        v,
                    )
                };
                let w = dvmlab_core::roster::Wireup::from_arg(v).map_err(bad)?;
                membership.join(&w, &origin).map_err(bad)?;
                Some(w)
            }
        };
        let local = resolver.local_host(&settings).map_err(|e| {
            Diagnostic::new(
                Kind::UnresolvedHost,
                Origin::Host,
                format!("cannot learn this host's names and addresses: {e}"),
                "localhost",
            )
        })?;
        let identity = identity::derive(&membership, &settings, &local)?;
        let tree = membership.tree(settings.radix);
        let networks = resolver.networks(&settings)?;
        let pick = |r: Rank| {
            resolver.pick(
                &settings,
                &networks,
                &membership.hosts[r as usize],
                &membership.origins[r as usize],
            )
        };
        let own = pick(identity.rank)?;
        let mut ancestors = BTreeMap::new();
        // Ancestors that left the DVM are connected past, and their hosts may be gone.
        for a in tree.ancestors(identity.rank) {
            if !membership.departed.contains(&a) {
                ancestors.insert(a, pick(a)?);
            }
        }
        Ok(Prepared {
            settings,
            membership,
            identity,
            tree,
            resolver,
            networks,
            own,
            ancestors,
            join,
            conf_size,
            cli: params.cli_pairs().to_vec(),
        })
    }

    /// This daemon's first copy of the membership: `prte.conf`'s, and for a launched
    /// daemon what the launch added to it.
    pub fn roster(&self) -> dvmlab_core::roster::Roster {
        use dvmlab_core::roster::{Roster, State};
        let conf = &self.membership.hosts[..self.conf_size as usize];
        let me = self.identity.rank;
        let mut r = Roster::from_conf(conf, self.membership.controller_listed, me);
        if let Some(w) = &self.join {
            // Checked against the same conf when the membership was joined.
            if r.apply(w).is_ok() {
                r.set(me, State::Wired);
            }
        }
        r
    }

    pub fn uri_of(&self, rank: Rank, chosen: Chosen) -> ContactUri {
        ContactUri {
            nspace: self.identity.nspace.clone(),
            rank,
            addr: SocketAddr::new(chosen.addr, self.settings.port),
            mask: chosen.mask,
        }
    }

    /// The controller's contact URI (this daemon's own if it is the controller).
    pub fn controller_uri(&self) -> ContactUri {
        let c = self.ancestors.get(&0).copied().unwrap_or(self.own);
        self.uri_of(0, c)
    }

    pub fn report(&self) -> IdentityReport {
        let parent = self.tree.parent(self.identity.rank);
        IdentityReport {
            namespace: self.identity.nspace.clone(),
            rank: self.identity.rank,
            role: self.identity.role,
            host: self.identity.host.clone(),
            uri: self.uri_of(self.identity.rank, self.own).to_string(),
            daemons: self.membership.size(),
            controller_listed: self.membership.controller_listed,
            radix: self.tree.radix(),
            parent,
            parent_uri: parent.and_then(|p| {
                self.ancestors
                    .get(&p)
                    .map(|c| self.uri_of(p, *c).to_string())
            }),
            ancestors: self.tree.ancestors(self.identity.rank),
            family: self.settings.family,
            port: self.settings.port,
            conf: self.settings.conf_path.display().to_string(),
        }
    }
}

/// Where a tool finds the controller: the same configuration, the same address choice.
pub fn controller_addr(params: &Params) -> Result<(Settings, SocketAddr), Diagnostic> {
    let settings = crate::conf_file::load(params)?;
    let resolver = Resolver::from_settings(&settings)?;
    let networks = resolver.networks(&settings)?;
    let m = Membership::from_settings(&settings);
    let c = resolver.pick(&settings, &networks, &m.hosts[0], &m.origins[0])?;
    let addr = SocketAddr::new(c.addr, settings.port);
    Ok((settings, addr))
}
