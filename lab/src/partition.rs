//! Partitions between sets of lab hosts, as a switch ACL: nftables rules in the bridge
//! family of the host's network namespace drop frames carrying IP traffic between the two
//! sets on the lab's Docker bridge. The containers see no rule; packets just vanish. Only the
//! lab's own addresses are matched, and the whole table is the lab's, so `heal` (and `down`)
//! remove it without touching anything else.

use dvmlab_harness::partition::Switch;

use crate::plan::Host;

/// The lab's table, in this machine's namespace where Docker's bridge is.
fn switch() -> Switch {
    Switch {
        ns: None,
        name: "dvmlab_lab".into(),
    }
}

fn nft(script: &str) -> Result<String, String> {
    switch().nft(script)
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
            "add rule {t} cut ip saddr {} ip daddr {} drop\n",
            set(x, false),
            set(y, false),
            t = switch().table()
        ));
        rules.push_str(&format!(
            "add rule {t} cut ip6 saddr {} ip6 daddr {} drop\n",
            set(x, true),
            set(y, true),
            t = switch().table()
        ));
    }
    nft(&format!(
        "add table {t}\n\
         add chain {t} cut {{ type filter hook forward priority 0; policy accept; }}\n\
         {rules}",
        t = switch().table()
    ))?;
    // In effect only once the kernel lists them.
    let listed = nft(&format!("list chain {} cut\n", switch().table()))?;
    let first = a.first().map(|h| h.v4.to_string()).ok_or("an empty side")?;
    if !listed.contains(&first) {
        return Err(format!("the partition rules are not listed:\n{listed}"));
    }
    Ok(())
}

/// Removes every partition of the lab; true if there was one.
pub fn heal() -> Result<bool, String> {
    let sw = switch();
    let tables = nft("list tables\n")?;
    if !tables
        .lines()
        .any(|l| l.trim() == format!("table {}", sw.table()))
    {
        return Ok(false);
    }
    sw.delete_table()?;
    Ok(true)
}
