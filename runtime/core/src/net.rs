//! Picking a host's address on the DVM interconnect, and the contact URI synthesized from it.
//!
//! Pure: the caller resolves names and lists local interfaces; this module only decides.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::conf::Family;
use crate::tree::Rank;

/// Why no single address could be chosen for a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// No address of the DVM's family at all.
    NoneOfFamily,
    /// Addresses of the family exist but none is inside `DVMNetworks`.
    OutsideNetworks(Vec<IpAddr>),
    /// More than one candidate remains.
    Ambiguous(Vec<IpAddr>),
}

/// An address chosen for a host and the reachability mask (prefix length) that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen {
    pub addr: IpAddr,
    pub mask: u8,
}

/// Chooses among `candidates` (a host's resolved addresses): keeps those of `family`, narrows
/// to `networks` when given, and never guesses among what remains. The mask is `netmask` if
/// set, else the prefix of the matching network, else 0 (universally reachable).
pub fn choose(
    candidates: &[IpAddr],
    family: Family,
    networks: &[IpNet],
    netmask: Option<u8>,
) -> Result<Chosen, Choice> {
    let mut of_family: Vec<IpAddr> = Vec::new();
    for a in candidates.iter().filter(|a| family.matches(a)) {
        if !of_family.contains(a) {
            of_family.push(*a);
        }
    }
    if of_family.is_empty() {
        return Err(Choice::NoneOfFamily);
    }
    let picked: Vec<(IpAddr, u8)> = if networks.is_empty() {
        of_family.iter().map(|&a| (a, 0)).collect()
    } else {
        let mut v: Vec<(IpAddr, u8)> = Vec::new();
        for a in &of_family {
            if let Some(net) = networks.iter().find(|n| n.contains(a)) {
                v.push((*a, net.prefix_len()));
            }
        }
        if v.is_empty() {
            return Err(Choice::OutsideNetworks(of_family));
        }
        v
    };
    match picked.as_slice() {
        [(addr, prefix)] => Ok(Chosen {
            addr: *addr,
            mask: netmask.unwrap_or(*prefix),
        }),
        _ => Err(Choice::Ambiguous(picked.into_iter().map(|x| x.0).collect())),
    }
}

/// A daemon's contact URI: `<nspace>.<rank>;tcp://<ip>:<port>:<mask>`, or `tcp6://[ip]:...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContactUri {
    pub nspace: String,
    pub rank: Rank,
    pub addr: SocketAddr,
    pub mask: u8,
}

impl fmt::Display for ContactUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            SocketAddr::V4(a) => write!(
                f,
                "{}.{};tcp://{}:{}:{}",
                self.nspace,
                self.rank,
                a.ip(),
                a.port(),
                self.mask
            ),
            SocketAddr::V6(a) => write!(
                f,
                "{}.{};tcp6://[{}]:{}:{}",
                self.nspace,
                self.rank,
                a.ip(),
                a.port(),
                self.mask
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|x| x.parse().unwrap()).collect()
    }

    #[test]
    fn repeated_answers_are_one_address() {
        let c = choose(
            &ips(&["10.0.0.1", "10.0.0.2", "10.0.0.1"]),
            Family::V4,
            &[],
            None,
        );
        assert!(matches!(c, Err(Choice::Ambiguous(v)) if v.len() == 2));
        let c = choose(
            &ips(&["10.0.0.1", "fd00::1", "10.0.0.1"]),
            Family::V4,
            &[],
            None,
        );
        assert_eq!(c.unwrap().addr.to_string(), "10.0.0.1");
    }

    #[test]
    fn single_homed_needs_no_networks() {
        let c = choose(&ips(&["10.200.0.5", "fd00:200::5"]), Family::V4, &[], None).unwrap();
        assert_eq!(c.addr.to_string(), "10.200.0.5");
        assert_eq!(c.mask, 0);
        let c = choose(
            &ips(&["10.200.0.5", "fd00:200::5"]),
            Family::V6,
            &[],
            Some(64),
        )
        .unwrap();
        assert_eq!((c.addr.to_string().as_str(), c.mask), ("fd00:200::5", 64));
    }

    #[test]
    fn networks_pick_on_a_multihomed_host_and_ambiguity_is_refused() {
        let two = ips(&["192.168.7.5", "10.200.0.5"]);
        assert!(matches!(
            choose(&two, Family::V4, &[], None),
            Err(Choice::Ambiguous(v)) if v.len() == 2
        ));
        let nets = ["10.200.0.0/16".parse().unwrap()];
        let c = choose(&two, Family::V4, &nets, None).unwrap();
        assert_eq!((c.addr.to_string().as_str(), c.mask), ("10.200.0.5", 16));
        assert_eq!(choose(&two, Family::V4, &nets, Some(24)).unwrap().mask, 24);
        let other = ["172.16.0.0/12".parse().unwrap()];
        assert!(matches!(
            choose(&two, Family::V4, &other, None),
            Err(Choice::OutsideNetworks(_))
        ));
        assert_eq!(
            choose(&ips(&["10.0.0.1"]), Family::V6, &[], None),
            Err(Choice::NoneOfFamily)
        );
    }

    #[test]
    fn uri_forms_for_both_families() {
        let u = ContactUri {
            nspace: "c-prte-dvm".into(),
            rank: 3,
            addr: "10.200.0.4:7817".parse().unwrap(),
            mask: 16,
        };
        assert_eq!(u.to_string(), "c-prte-dvm.3;tcp://10.200.0.4:7817:16");
        let u = ContactUri {
            addr: "[fd00:200::4]:7817".parse().unwrap(),
            ..u
        };
        assert_eq!(u.to_string(), "c-prte-dvm.3;tcp6://[fd00:200::4]:7817:16");
    }
}
