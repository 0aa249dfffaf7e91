//! The netns backend: one network namespace per host, all plugged into bridges that live in a
//! switch namespace of their own (so the machine's firewall and interfaces are never touched),
//! and processes started inside a host with its own UTS name and a private `/etc`.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use crate::addr;
use crate::cluster::HostInfo;

/// A bridge holds at most 1023 ports; keep a margin for the uplinks between bridges.
pub const PORTS_PER_BRIDGE: usize = 1000;

/// The namespaces and links of one cluster. Destroyed by [`NetnsWorld::destroy`].
#[derive(Debug)]
pub struct NetnsWorld {
    switch: String,
    hosts: Vec<String>,
    created: Vec<String>,
    /// Machine-wide settings this cluster raised: (file, value before, value set), to put
    /// back.
    raised: Vec<(&'static str, u64, u64)>,
}

/// From this many hosts on, the machine's network limits are raised to fit the cluster.
const RAISE_FROM_HOSTS: usize = 500;

/// The machine-wide limits a big cluster outgrows, each with the value it needs for `hosts`.
///
/// - The neighbour (ARP and NDP) tables are shared by every network namespace of the
///   machine, 1024 entries by default: past about 500 hosts, each knowing its parent and
///   children, new entries fail ("neighbor table overflow") and hosts cannot reach each other.
/// - The per-CPU queue of received packets: a broadcast on a bridge (every ARP request) puts
///   one packet per port on it at once, and what does not fit is dropped.
fn limits_for(hosts: usize) -> Vec<(&'static str, u64)> {
    let n = hosts as u64;
    // Raised from the top down, thresh1 <= thresh2 <= thresh3 holds at every step.
    vec![
        ("/proc/sys/net/ipv4/neigh/default/gc_thresh3", 16 * n),
        ("/proc/sys/net/ipv4/neigh/default/gc_thresh2", 8 * n),
        ("/proc/sys/net/ipv4/neigh/default/gc_thresh1", 2 * n),
        ("/proc/sys/net/ipv6/neigh/default/gc_thresh3", 16 * n),
        ("/proc/sys/net/ipv6/neigh/default/gc_thresh2", 8 * n),
        ("/proc/sys/net/ipv6/neigh/default/gc_thresh1", 2 * n),
        (
            "/proc/sys/net/core/netdev_max_backlog",
            4 * (n + hosts.div_ceil(PORTS_PER_BRIDGE) as u64),
        ),
    ]
}

/// Raises the machine's network limits to fit a cluster of `hosts` (never lowers one); what
/// it changed. Machine-wide settings, so each change is said and put back by
/// [`NetnsWorld::destroy`].
fn raise_limits(hosts: usize) -> Vec<(&'static str, u64, u64)> {
    let mut raised = Vec::new();
    if hosts < RAISE_FROM_HOSTS {
        return raised;
    }
    for (file, want) in limits_for(hosts) {
        let Some(now) = read_u64(file) else { continue };
        if now >= want {
            continue;
        }
        match std::fs::write(file, want.to_string()) {
            Ok(()) => {
                eprintln!("harness: {file} {now} -> {want} for {hosts} hosts; put back at teardown");
                raised.push((file, now, want));
            }
            Err(e) => eprintln!(
                "harness: cannot raise {file} ({now}) to {want} for {hosts} hosts: {e}; some hosts may not reach others"
            ),
        }
    }
    raised
}

fn read_u64(file: &str) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Puts back what [`raise_limits`] changed, last change first (so the thresholds stay in
/// order), where the value is still this cluster's (another may have changed it since).
fn restore_limits(raised: &mut Vec<(&'static str, u64, u64)>) {
    while let Some((file, before, set)) = raised.pop() {
        if read_u64(file) == Some(set) {
            let _ = std::fs::write(file, before.to_string());
        }
    }
}

/// Runs `ip -b -` (optionally inside namespace `ns`) with `lines` as the batch.
pub(crate) fn ip_batch(ns: Option<&str>, lines: &[String]) -> io::Result<()> {
    let mut cmd = Command::new("ip");
    if let Some(n) = ns {
        cmd.args(["-n", n]);
    }
    let mut child = cmd
        .args(["-b", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(lines.join("\n").as_bytes())?;
        stdin.write_all(b"\n")?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}-b failed: {}",
            ns.map(|n| format!("-n {n} ")).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Makes every mount of a freshly unshared mount namespace private, so that what the process
/// mounts next is seen nowhere else. Only a system call: safe between fork and exec.
pub(crate) fn mounts_private() -> nix::Result<()> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
}

/// Writes a sysctl inside namespace `ns`.
fn sysctl_in(ns: &str, key: &str, value: &str) -> io::Result<()> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "sysctl",
            "-q",
            "-w",
            &format!("{key}={value}"),
        ])
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "sysctl {key}={value} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Keeps the switch namespace's bridges out of the IP firewall. Where `br_netfilter` is
/// loaded (Docker loads it, and turns it on in this machine's namespace), every frame a
/// bridge forwards is also run through the iptables hooks, as if routed; a switch does
/// nothing of the kind, and on a 2-core machine of 128 hosts it cost the traffic of a job
/// about 2 % of its time. The switch's own rules (partitions) are nftables rules of the
/// bridge family, which run either way. Without the module there is nothing to turn off
/// (`-e`: the keys are then absent).
fn bridge_netfilter_off(ns: &str) -> io::Result<()> {
    let keys =
        ["iptables", "ip6tables", "arptables"].map(|t| format!("net.bridge.bridge-nf-call-{t}=0"));
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-q", "-e", "-w"])
        .args(&keys)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "sysctl {} in {ns}: {}",
            keys.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

impl NetnsWorld {
    /// Creates the switch namespace, one namespace per host, the bridges and veth links, and
    /// assigns each host its addresses. On error, everything created so far is removed.
    pub fn create(run: &str, hosts: &[HostInfo], no_ipv6: &[usize]) -> io::Result<NetnsWorld> {
        let mut w = NetnsWorld {
            switch: format!("{run}-sw"),
            hosts: (0..hosts.len()).map(|i| format!("{run}-h{i}")).collect(),
            created: Vec::new(),
            raised: raise_limits(hosts.len()),
        };
        match w.build(hosts, no_ipv6) {
            Ok(()) => Ok(w),
            Err(e) => {
                w.destroy();
                Err(e)
            }
        }
    }

    fn build(&mut self, hosts: &[HostInfo], no_ipv6: &[usize]) -> io::Result<()> {
        let mut all = vec![self.switch.clone()];
        all.extend(self.hosts.iter().cloned());
        // Recorded first: `ip -b` stops at the first failing line, and whatever it did create
        // before that must still be destroyed.
        self.created = all.clone();
        ip_batch(
            None,
            &all.iter()
                .map(|n| format!("netns add {n}"))
                .collect::<Vec<_>>(),
        )?;

        bridge_netfilter_off(&self.switch)?;
        let dual = hosts.iter().any(|h| !h.second.is_empty());
        let mut sw = self.network_lines("br", "h", "eth0");
        if dual {
            sw.extend(self.network_lines("sb", "g", "eth1"));
        }
        ip_batch(Some(&self.switch), &sw)?;

        let mut children = Vec::new();
        for (i, (ns, h)) in self.hosts.iter().zip(hosts).enumerate() {
            let mut lines = vec!["link set lo up".to_string()];
            let mut add = |a: IpAddr, dev: &str| {
                if a.is_ipv4() {
                    lines.push(format!("addr add {a}/{} dev {dev}", addr::NETNS_V4_PREFIX));
                } else if !no_ipv6.contains(&i) {
                    lines.push(format!(
                        "addr add {a}/{} dev {dev} nodad",
                        addr::NETNS_V6_PREFIX
                    ));
                }
            };
            for a in [h.v4, h.v6].into_iter().flatten() {
                add(a, "eth0");
            }
            for a in &h.second {
                add(*a, "eth1");
            }
            lines.push("link set eth0 up".to_string());
            if dual {
                lines.push("link set eth1 up".to_string());
            }
            let ns = ns.clone();
            children.push(std::thread::spawn(move || ip_batch(Some(&ns), &lines)));
        }
        let results: Vec<io::Result<()>> = children
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(io::Error::other("address setup thread panicked")))
            })
            .collect();
        results.into_iter().collect::<io::Result<()>>()?;
        for &i in no_ipv6 {
            sysctl_in(&self.hosts[i], "net.ipv6.conf.all.disable_ipv6", "1")?;
        }
        Ok(())
    }

    /// Batch lines (switch namespace) for one network: bridges `<br>0…` chained to `<br>0`,
    /// and a veth per host whose host end is `iface`.
    fn network_lines(&self, br: &str, port: &str, iface: &str) -> Vec<String> {
        let bridges = self.hosts.len().div_ceil(PORTS_PER_BRIDGE).max(1);
        let mut sw = Vec::new();
        for b in 0..bridges {
            sw.push(format!("link add {br}{b} type bridge"));
            sw.push(format!("link set {br}{b} up"));
            if b > 0 {
                sw.push(format!("link add {br}up{b} type veth peer name {br}dn{b}"));
                sw.push(format!("link set {br}up{b} master {br}{b} up"));
                sw.push(format!("link set {br}dn{b} master {br}0 up"));
            }
        }
        for (i, ns) in self.hosts.iter().enumerate() {
            sw.push(format!(
                "link add {port}{i} type veth peer name {iface} netns {ns}"
            ));
            sw.push(format!(
                "link set {port}{i} master {br}{} up",
                i / PORTS_PER_BRIDGE
            ));
        }
        sw
    }

    /// Makes `cmd` start inside host `i`: its network namespace, a new UTS namespace named
    /// `hostname`, and a private mount namespace where `etc_dir` overlays `/etc`.
    pub fn enter(
        &self,
        cmd: &mut Command,
        i: usize,
        hostname: &str,
        etc_dir: &Path,
    ) -> io::Result<()> {
        enter_named(cmd, &self.hosts[i], hostname, etc_dir)
    }

    /// The network namespace of host `i`.
    pub fn netns(&self, i: usize) -> &str {
        &self.hosts[i]
    }
}

/// Makes `cmd` run in the host whose network namespace is `netns`: its network, a mount
/// namespace of its own with `etc_dir` laid over `/etc`, and the host name `hostname`.
pub fn enter_named(
    cmd: &mut Command,
    netns: &str,
    hostname: &str,
    etc_dir: &Path,
) -> io::Result<()> {
    {
        let nsfile = File::open(Path::new("/var/run/netns").join(netns))?;
        let opts = CString::new(format!("lowerdir={}:/etc", etc_dir.display()))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let host = hostname.to_string();
        let stacked = etc_dir.parent().map_or(0, hosts_etc_overlays);
        // SAFETY: the closure runs between fork and exec and only makes system calls on data
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                setns(&nsfile, CloneFlags::CLONE_NEWNET)?;
                unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS)?;
                mounts_private()?;
                for _ in 0..stacked {
                    umount2("/etc", MntFlags::MNT_DETACH)?;
                }
                mount(
                    Some("overlay"),
                    "/etc",
                    Some("overlay"),
                    MsFlags::MS_RDONLY,
                    Some(opts.as_c_str()),
                )?;
                nix::unistd::sethostname(&host)?;
                Ok(())
            });
        }
        Ok(())
    }
}

/// How many hosts' `/etc` overlays (lower directories under `etc_root`, the run's) sit on
/// `/etc` in this process's mount namespace. A process inside a host that enters another
/// (an `orted` launching the next level of its tree through the agent) takes them off
/// first: overlayfs stacks at most two deep, so a third host's overlay failed with EINVAL,
/// and the new host would have seen its launcher's files too.
fn hosts_etc_overlays(etc_root: &Path) -> usize {
    let lower = format!("lowerdir={}/", etc_root.display());
    crate::procs::mounts()
        .iter()
        .filter(|m| m.point == "/etc" && m.fstype == "overlay" && m.options.contains(&lower))
        .count()
}

impl NetnsWorld {
    /// Cuts host `i` off every network (or reconnects it).
    pub fn set_link(&self, i: usize, up: bool, dual: bool) -> io::Result<()> {
        let state = if up { "up" } else { "down" };
        let mut lines = vec![format!("link set h{i} {state}")];
        if dual {
            lines.push(format!("link set g{i} {state}"));
        }
        ip_batch(Some(&self.switch), &lines)
    }

    /// The switch namespace, where bridges, partition rules and link relays live.
    pub(crate) fn switch(&self) -> &str {
        &self.switch
    }

    /// Deletes every namespace (killing what runs inside); links and bridges go with them.
    pub fn destroy(&mut self) {
        for ns in self.created.drain(..) {
            crate::gc::delete_namespace(&ns);
        }
        restore_limits(&mut self.raised);
    }
}

impl Drop for NetnsWorld {
    fn drop(&mut self) {
        self.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_limits_keep_each_neighbour_table_in_order_at_every_step_and_fit_the_cluster() {
        let limits = limits_for(2049);
        for ip in ["ipv4", "ipv6"] {
            let t: Vec<(&str, u64)> = limits
                .iter()
                .filter(|(f, _)| f.contains(&format!("/{ip}/")))
                .copied()
                .collect();
            let names: Vec<&str> = t.iter().map(|(f, _)| &f[f.len() - 10..]).collect();
            // Raised top down (and put back in reverse), so thresh1 <= thresh2 <= thresh3 holds
            // between any two writes.
            assert_eq!(names, ["gc_thresh3", "gc_thresh2", "gc_thresh1"], "{ip}");
            assert!(t[0].1 >= t[1].1 && t[1].1 >= t[2].1, "{ip}: {t:?}");
            // Every host knows at least its parent and itself in its parent's table.
            assert!(t[0].1 >= 2 * 2049, "{ip}: {t:?}");
        }
        let backlog = limits
            .iter()
            .find(|(f, _)| f.ends_with("netdev_max_backlog"));
        // One ARP broadcast puts a packet per port (hosts and bridge uplinks) on the queue.
        assert!(backlog.is_some_and(|(_, v)| *v >= 2049 + 3), "{backlog:?}");
        assert!(raise_limits(RAISE_FROM_HOSTS - 1).is_empty());
    }

    #[test]
    fn the_switch_forwards_frames_without_running_them_through_the_ip_firewall() {
        let test = "switch without br_netfilter";
        if !crate::netns_available() {
            crate::skip(test, "needs root for network namespaces");
            return;
        }
        let hosts: Vec<HostInfo> = (0..2)
            .map(|i| HostInfo {
                name: format!("h{i}"),
                index: i,
                v4: Some(IpAddr::from([10, 200, 250, 10 + i as u8])),
                v6: None,
                second: Vec::new(),
            })
            .collect();
        let mut w = NetnsWorld::create(&format!("dvl{}-brnf", std::process::id()), &hosts, &[])
            .expect("a two-host world");
        let read = |t: &str| {
            Command::new("ip")
                .args(["netns", "exec", w.switch(), "cat"])
                .arg(format!("/proc/sys/net/bridge/bridge-nf-call-{t}"))
                .output()
        };
        let seen: Vec<(String, std::process::Output)> = ["iptables", "ip6tables", "arptables"]
            .iter()
            .map(|t| (t.to_string(), read(t).expect("running ip netns exec cat")))
            .collect();
        w.destroy();
        if seen.iter().all(|(_, o)| !o.status.success()) {
            eprintln!("{test}: br_netfilter is not loaded on this machine: no bridge runs frames through the firewall, nothing to check");
            return;
        }
        for (t, o) in seen {
            assert_eq!(
                String::from_utf8_lossy(&o.stdout).trim(),
                "0",
                "bridge-nf-call-{t} in the switch namespace: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}
