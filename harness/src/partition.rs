//! Network partitions between sets of hosts, enforced like a switch ACL: nftables rules in the
//! bridge family of the cluster's switch (its switch namespace, or the Docker bridge in this
//! machine's namespace) drop the frames that carry IP traffic from one set to the other. Neither the hosts nor the daemons see any rule; packets just vanish,
//! so TCP times out exactly as on a cut cable.
//!
//! Every change is verified with probes before it is reported done: a TCP SYN to port 9 from a
//! representative host of one side to one of the other is counted by a chain that runs before
//! the partition rules (the frame was sent) and by one that runs after them (the frame got
//! through).

use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Which directions a partition blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Nothing passes between the two sets.
    Both,
    /// Traffic from the first set to the second is dropped; the other way passes.
    OneWay,
}

/// Handle of an installed partition, for [`crate::Cluster::heal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartitionId(pub(crate) u32);

/// The port probes are sent to: nothing listens there, so a probe that gets through is
/// refused at once, and one that is dropped times out.
pub(crate) const PROBE_PORT: u16 = 9;

/// Where a cluster's switch rules live: one nftables table of the bridge family, inside the
/// switch namespace (netns clusters) or in this machine's own namespace, where Docker's
/// bridges are (docker clusters, and the lab; the table is then theirs alone and matches
/// only their own addresses).
#[derive(Debug, Clone)]
pub struct Switch {
    /// The network namespace `nft` runs in; `None`: this process's.
    pub ns: Option<String>,
    /// The table's name (in family `bridge`).
    pub name: String,
}

impl Switch {
    /// `bridge <name>`, as nft scripts write it.
    pub fn table(&self) -> String {
        format!("bridge {}", self.name)
    }

    fn where_(&self) -> String {
        self.ns.as_deref().map_or_else(
            || "this namespace".to_string(),
            |n| format!("namespace {n}"),
        )
    }

    fn nft_command(&self) -> Command {
        match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "nft"]);
                c
            }
            None => Command::new("nft"),
        }
    }

    /// Runs an nft script.
    pub fn nft(&self, script: &str) -> Result<String, String> {
        run_nft(self.nft_command(), &self.where_(), script)
    }

    /// Lists one chain of the table, as nft's JSON.
    fn list_chain(&self, chain: &str) -> Result<serde_json::Value, String> {
        let at = self.where_();
        let out = self
            .nft_command()
            .args(["-j", "list", "chain", "bridge", &self.name, chain])
            .output()
            .map_err(|e| format!("running nft in {at}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "nft list chain {chain} in {at}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("nft JSON from {at}: {e}"))
    }

    /// Deletes the table if it exists.
    pub fn delete_table(&self) -> Result<(), String> {
        self.nft(&format!(
            "add table {t}\ndelete table {t}\n",
            t = self.table()
        ))
        .map(|_| ())
    }

    /// Packets counted so far by the probe rule for `src` → `dst` in `chain`.
    pub(crate) fn probe_count(&self, chain: &str, src: IpAddr, dst: IpAddr) -> Result<u64, String> {
        self.tagged_count(chain, &probe_tag(src, dst))
    }

    /// Packets counted so far by the rule tagged `tag` in `chain`.
    pub(crate) fn tagged_count(&self, chain: &str, tag: &str) -> Result<u64, String> {
        let v = self.list_chain(chain)?;
        let rules = v["nftables"].as_array().cloned().unwrap_or_default();
        for r in rules {
            let rule = &r["rule"];
            if rule["comment"].as_str() != Some(tag) {
                continue;
            }
            for e in rule["expr"].as_array().into_iter().flatten() {
                if let Some(p) = e["counter"]["packets"].as_u64() {
                    return Ok(p);
                }
            }
        }
        Err(format!(
            "no probe rule {tag:?} in chain {chain} in {}",
            self.where_()
        ))
    }
}

/// The script that creates the table: `watch` counts connection attempts, `seen` counts
/// probes before any partition rule, `cut` holds one jump per partition, `passed` counts
/// probes that got through. IPv6 neighbour discovery crosses partitions, as ARP does for
/// IPv4 (it is not IP): without it a probe could not even be sent, and the drop could not
/// be shown; what a partition cuts is the hosts' IP traffic.
/// Runs an nft script through `nft`, a command that ends in `nft` (it may enter a network
/// namespace first); `at` names where, for errors. Its output.
pub fn run_nft(mut nft: Command, at: &str, script: &str) -> Result<String, String> {
    let mut child = nft
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running nft in {at}: {e} (is nftables installed?)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft script to {at}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {at}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nft in {at} refused:\n{script}\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn table_script(t: &str) -> String {
    format!(
        "add table {t}\n\
         add chain {t} watch {{ type filter hook forward priority -20; policy accept; }}\n\
         add chain {t} seen {{ type filter hook forward priority -10; policy accept; }}\n\
         add chain {t} cut {{ type filter hook forward priority 0; policy accept; }}\n\
         add rule {t} cut icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept\n\
         add chain {t} passed {{ type filter hook forward priority 10; policy accept; }}\n"
    )
}

fn family(a: &IpAddr) -> &'static str {
    if a.is_ipv4() {
        "ip"
    } else {
        "ip6"
    }
}

fn set_of(addrs: &[IpAddr], v4: bool) -> Option<String> {
    let v: Vec<String> = addrs
        .iter()
        .filter(|a| a.is_ipv4() == v4)
        .map(|a| a.to_string())
        .collect();
    (!v.is_empty()).then(|| format!("{{ {} }}", v.join(", ")))
}

/// Rules (for chain `chain`) dropping every IP packet from `from` to `to`.
pub(crate) fn drop_rules(table: &str, chain: &str, from: &[IpAddr], to: &[IpAddr]) -> String {
    let mut s = String::new();
    for v4 in [true, false] {
        if let (Some(f), Some(t)) = (set_of(from, v4), set_of(to, v4)) {
            let fam = if v4 { "ip" } else { "ip6" };
            s.push_str(&format!(
                "add rule {table} {chain} {fam} saddr {f} {fam} daddr {t} counter drop\n"
            ));
        }
    }
    s
}

/// A rule (for chain `watch`) counting connection attempts (SYNs) from `src` to `dst`'s
/// `port`, tagged so [`Switch::tagged_count`] finds it.
pub(crate) fn syn_rule(table: &str, src: IpAddr, dst: IpAddr, port: u16) -> String {
    let fam = family(&src);
    format!(
        "add rule {table} watch {fam} saddr {src} {fam} daddr {dst} tcp dport {port} \
         tcp flags & (syn | ack) == syn counter comment \"{}\"\n",
        syn_tag(src, dst, port)
    )
}

pub(crate) fn syn_tag(src: IpAddr, dst: IpAddr, port: u16) -> String {
    format!("syn {src} > {dst}:{port}")
}

/// A counting rule for probes from `src` to `dst`, tagged so [`Switch::probe_count`] finds it.
pub(crate) fn probe_rule(table: &str, chain: &str, src: IpAddr, dst: IpAddr) -> String {
    let fam = family(&src);
    format!(
        "add rule {table} {chain} {fam} saddr {src} {fam} daddr {dst} tcp dport {PROBE_PORT} \
         counter comment \"{}\"\n",
        probe_tag(src, dst)
    )
}

fn probe_tag(src: IpAddr, dst: IpAddr) -> String {
    format!("probe {src} > {dst}")
}

/// How long a probe waits for a refusal before it counts as unanswered.
pub(crate) const PROBE_WAIT: Duration = Duration::from_millis(1500);

/// The shell command a host runs to send one probe to `dst`.
pub(crate) fn probe_argv(dst: IpAddr) -> Vec<String> {
    vec![
        "bash".into(),
        "-c".into(),
        format!("exec 3<>/dev/tcp/{dst}/{PROBE_PORT}"),
    ]
}
