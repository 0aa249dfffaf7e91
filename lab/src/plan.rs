//! What a lab is, before any host exists: host names, the one `prte.conf` every daemon
//! reads, and, for the exports (whose orchestrators take fixed addresses), the addresses and
//! the hosts table that makes the names resolve without DNS. The lab that `up` starts and the
//! Kubernetes and compose exports all derive from this one plan.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The controller's host name.
pub const CONTROLLER: &str = "ctl";
/// Names the lab's keeper directory, the exports' network and image.
pub const PREFIX: &str = "dvmlab-lab";
/// The exports' IPv4 subnet: dedicated, far from Docker's defaults and the harness's blocks.
pub const SUBNET_V4: &str = "10.210.0.0/16";
/// The exports' IPv6 subnet (unique local).
pub const SUBNET_V6: &str = "fd00:210::/64";
/// The port daemons listen on (the runtime's default DVMPort).
pub const DVM_PORT: u16 = 7817;
/// Where every form of the lab keeps the DVM key (`DVMKeyFile`): the harness's key on `lab
/// up`'s hosts, the exported `dvm.key` mounted there by compose and Kubernetes.
pub const KEY_PATH: &str = "/etc/dvm.key";

/// Which address family the daemons use; the network is dual-stack either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpVersion {
    V4,
    V6,
}

impl IpVersion {
    pub fn parse(s: &str) -> Result<IpVersion, String> {
        match s {
            "4" => Ok(IpVersion::V4),
            "6" => Ok(IpVersion::V6),
            other => Err(format!("IP={other}: expected 4 or 6")),
        }
    }

    pub fn number(self) -> u8 {
        match self {
            IpVersion::V4 => 4,
            IpVersion::V6 => 6,
        }
    }
}

/// One host of the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl Host {
    /// The address daemons use for this host.
    pub fn addr(&self, ip: IpVersion) -> IpAddr {
        match ip {
            IpVersion::V4 => IpAddr::V4(self.v4),
            IpVersion::V6 => IpAddr::V6(self.v6),
        }
    }
}

/// The whole lab: a controller and `nodes` compute nodes `node01`… in a radix tree, and
/// `spares` hosts `spare01`… that exist but are not in `DVMNodes`: an elastic DVM grows
/// onto them (`lab grow`, `lab alloc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub nodes: usize,
    pub radix: u32,
    pub ip: IpVersion,
    pub spares: usize,
}

/// Most hosts (nodes and spares) a lab may have: the addresses below stay inside the
/// subnets, and the names keep a fixed width.
pub const MAX_NODES: usize = 999;

impl Plan {
    pub fn new(nodes: usize, radix: u32, ip: IpVersion) -> Result<Plan, String> {
        if nodes == 0 || nodes > MAX_NODES {
            return Err(format!("NODES={nodes}: expected 1 to {MAX_NODES}"));
        }
        if radix < 1 {
            return Err(format!("RADIX={radix}: expected at least 1"));
        }
        Ok(Plan {
            nodes,
            radix,
            ip,
            spares: 0,
        })
    }

    /// This plan with `spares` spare hosts.
    pub fn with_spares(self, spares: usize) -> Result<Plan, String> {
        if self.nodes + spares > MAX_NODES {
            return Err(format!(
                "SPARES={spares}: at most {} beside {} nodes",
                MAX_NODES - self.nodes,
                self.nodes
            ));
        }
        Ok(Plan { spares, ..self })
    }

    pub fn spare_name(&self, i: usize) -> String {
        format!("spare{i:0w$}", w = self.spares.to_string().len().max(2))
    }

    /// The spare hosts, in the order `lab grow` takes them.
    pub fn spare_hosts(&self) -> Vec<Host> {
        (1..=self.spares)
            .map(|i| host(self.spare_name(i), (self.nodes + i) as u32))
            .collect()
    }

    /// Every host the lab creates: the DVM's, then the spares.
    pub fn all_hosts(&self) -> Vec<Host> {
        let mut v = self.hosts();
        v.extend(self.spare_hosts());
        v
    }

    pub fn is_spare(&self, name: &str) -> bool {
        self.spare_hosts().iter().any(|h| h.name == name)
    }

    /// Width of the node numbers: node01…node32, node001…node128.
    fn width(&self) -> usize {
        self.nodes.to_string().len().max(2)
    }

    pub fn node_name(&self, i: usize) -> String {
        format!("node{i:0w$}", w = self.width())
    }

    /// The controller first, then the nodes in rank order.
    pub fn hosts(&self) -> Vec<Host> {
        let mut v = vec![host(CONTROLLER.into(), 0)];
        v.extend((1..=self.nodes).map(|i| host(self.node_name(i), i as u32)));
        v
    }

    pub fn host(&self, name: &str) -> Result<Host, String> {
        self.all_hosts()
            .into_iter()
            .find(|h| h.name == name)
            .ok_or_else(|| {
                let spares = match self.spares {
                    0 => String::new(),
                    1 => format!(", {}", self.spare_name(1)),
                    k => format!(", {} … {}", self.spare_name(1), self.spare_name(k)),
                };
                format!(
                    "no host {name} in this lab (hosts: {CONTROLLER}, {} … {}{spares})",
                    self.node_name(1),
                    self.node_name(self.nodes)
                )
            })
    }

    /// The exports' one `prte.conf`, mounted read-only into every container.
    pub fn prte_conf(&self) -> String {
        let subnet = match self.ip {
            IpVersion::V4 => SUBNET_V4,
            IpVersion::V6 => SUBNET_V6,
        };
        self.conf_text(
            "lab up",
            &self.dvm_nodes(),
            CONTROLLER,
            Some(subnet),
            KEY_PATH,
        )
    }

    /// DVMNodes for node01 … (the names `lab up` and the swarm give the nodes).
    pub fn dvm_nodes(&self) -> String {
        format!("node[{}:1-{}]", self.width(), self.nodes)
    }

    /// A `prte.conf` of this plan for hosts named otherwise (another orchestrator's names),
    /// written by `by`; `networks` restricts the daemons to that subnet; the key is read
    /// from `key`.
    pub fn conf_text(
        &self,
        by: &str,
        nodes: &str,
        controller: &str,
        networks: Option<&str>,
        key: &str,
    ) -> String {
        let mut text = format!(
            "# The dvmlab lab: {n} nodes, radix {r}, IPv{ip}. Written by `{by}`.\n\
             ClusterName = lab\n\
             DVMNodes = {nodes}\n\
             DVMControllerHost = {controller}\n\
             DVMRadix = {r}\n\
             DVMPort = {DVM_PORT}\n\
             DVMIPVersion = {ip}\n\
             DVMKeyFile = {key}\n",
            n = self.nodes,
            r = self.radix,
            ip = self.ip.number(),
        );
        if let Some(net) = networks {
            text.push_str(&format!("DVMNetworks = {net}\n"));
        }
        text
    }

    /// `name:address` entries for every host, in the family the daemons use, so no lookup
    /// ever reaches Docker's DNS (which takes seconds to fail on a name it lacks).
    pub fn extra_hosts(&self) -> Vec<String> {
        self.hosts()
            .iter()
            .map(|h| format!("{}:{}", h.name, h.addr(self.ip)))
            .collect()
    }
}

fn host(name: String, index: u32) -> Host {
    // .1 and ::1 are the bridge's gateway; hosts start at .10.
    let n = 10 + index;
    Host {
        name,
        v4: Ipv4Addr::new(10, 210, (n >> 8) as u8, (n & 0xff) as u8),
        v6: Ipv6Addr::new(0xfd00, 0x210, 0, 0, 0, 0, 0, n as u16),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_fixed_width() {
        let p = Plan::new(32, 64, IpVersion::V4).unwrap();
        let names: Vec<String> = p.hosts().into_iter().map(|h| h.name).collect();
        assert_eq!(names[0], "ctl");
        assert_eq!(names[1], "node01");
        assert_eq!(names[32], "node32");
        let p = Plan::new(128, 2, IpVersion::V4).unwrap();
        assert_eq!(p.node_name(7), "node007");
        assert!(p.prte_conf().contains("DVMNodes = node[3:1-128]"));
    }

    #[test]
    fn addresses_are_distinct_and_inside_the_lab_subnets() {
        let p = Plan::new(MAX_NODES, 2, IpVersion::V6).unwrap();
        let hosts = p.hosts();
        let v4: std::collections::HashSet<_> = hosts.iter().map(|h| h.v4).collect();
        let v6: std::collections::HashSet<_> = hosts.iter().map(|h| h.v6).collect();
        assert_eq!(v4.len(), hosts.len());
        assert_eq!(v6.len(), hosts.len());
        assert!(hosts.iter().all(|h| h.v4.octets()[..2] == [10, 210]));
        assert!(hosts
            .iter()
            .all(|h| h.v6.segments()[..4] == [0xfd00, 0x210, 0, 0]));
    }

    #[test]
    fn extra_hosts_follow_the_ip_version() {
        let p = Plan::new(2, 2, IpVersion::V6).unwrap();
        assert_eq!(p.extra_hosts()[1], "node01:fd00:210::b");
        assert!(p.prte_conf().contains("DVMNetworks = fd00:210::/64"));
        assert!(p.prte_conf().contains("DVMIPVersion = 6"));
        let p = Plan::new(2, 2, IpVersion::V4).unwrap();
        assert_eq!(p.extra_hosts()[0], "ctl:10.210.0.10");
    }

    #[test]
    fn spares_follow_the_nodes_and_stay_out_of_the_dvm() {
        let p = Plan::new(4, 2, IpVersion::V4)
            .unwrap()
            .with_spares(3)
            .unwrap();
        let names: Vec<String> = p.all_hosts().into_iter().map(|h| h.name).collect();
        assert_eq!(
            names,
            ["ctl", "node01", "node02", "node03", "node04", "spare01", "spare02", "spare03"]
        );
        assert!(p.is_spare("spare02") && !p.is_spare("node02"));
        assert!(p.prte_conf().contains("DVMNodes = node[2:1-4]"));
        let v4: std::collections::HashSet<_> = p.all_hosts().iter().map(|h| h.v4).collect();
        assert_eq!(v4.len(), 8);
        assert!(p.host("spare04").unwrap_err().contains("spare01 … spare03"));
        assert!(Plan::new(990, 2, IpVersion::V4)
            .unwrap()
            .with_spares(10)
            .unwrap_err()
            .contains("SPARES=10: at most 9"));
    }

    #[test]
    fn bad_sizes_are_refused_with_the_parameter_named() {
        assert!(Plan::new(0, 2, IpVersion::V4)
            .unwrap_err()
            .contains("NODES=0"));
        assert!(Plan::new(4, 0, IpVersion::V4)
            .unwrap_err()
            .contains("RADIX=0"));
        assert!(IpVersion::parse("5").unwrap_err().contains("IP=5"));
    }
}
