//! Partitions between sets of lab hosts, as a switch ACL: nftables rules in the bridge
//! family of the host's network namespace drop frames carrying IP traffic between the two
//! sets on the lab's Docker bridge. The containers see no rule; packets just vanish. Only the
//! lab's own addresses are matched, and the whole table is the lab's, so `heal` (and `down`)
//! remove it without touching anything else.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::plan::{Host, PREFIX};

const TABLE: &str = "bridge dvmlab_lab";

fn nft(script: &str) -> Result<String, String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running nft: {e} (install nftables; partitions need root)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nft refused the {PREFIX} rules: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn set(hosts: &[Host], v6: bool) -> String {
    let addrs: Vec<String> = hosts
        .iter()
        .map(|h| {
            if v6 {
                h.v6.to_string()
            } else {
                h.v4.to_string()
            }
        })
        .collect();
    format!("{{ {} }}", addrs.join(", "))
}

/// Cuts `a` from `b`, both ways, for IPv4 and IPv6. Partitions add up until [`heal`].
pub fn partition(a: &[Host], b: &[Host]) -> Result<(), String> {
    let mut rules = String::new();
    for (x, y) in [(a, b), (b, a)] {
        rules.push_str(&format!(
            "add rule {TABLE} cut ip saddr {} ip daddr {} drop\n",
            set(x, false),
            set(y, false)
        ));
        rules.push_str(&format!(
            "add rule {TABLE} cut ip6 saddr {} ip6 daddr {} drop\n",
            set(x, true),
            set(y, true)
        ));
    }
    nft(&format!(
        "add table {TABLE}\n\
         add chain {TABLE} cut {{ type filter hook forward priority 0; policy accept; }}\n\
         {rules}"
    ))?;
    // In effect only once the kernel lists them.
    let listed = nft(&format!("list chain {TABLE} cut\n"))?;
    let first = a.first().map(|h| h.v4.to_string()).ok_or("an empty side")?;
    if !listed.contains(&first) {
        return Err(format!("the partition rules are not listed:\n{listed}"));
    }
    Ok(())
}

/// Removes every partition of the lab; true if there was one.
pub fn heal() -> Result<bool, String> {
    let tables = nft("list tables\n")?;
    if !tables.lines().any(|l| l.trim() == format!("table {TABLE}")) {
        return Ok(false);
    }
    nft(&format!("delete table {TABLE}\n"))?;
    Ok(true)
}
