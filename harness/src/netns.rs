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

use nix::mount::{mount, MsFlags};
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

impl NetnsWorld {
    /// Creates the switch namespace, one namespace per host, the bridges and veth links, and
    /// assigns each host its addresses. On error, everything created so far is removed.
    pub fn create(run: &str, hosts: &[HostInfo], no_ipv6: &[usize]) -> io::Result<NetnsWorld> {
        let mut w = NetnsWorld {
            switch: format!("{run}-sw"),
            hosts: (0..hosts.len()).map(|i| format!("{run}-h{i}")).collect(),
            created: Vec::new(),
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
        // SAFETY: the closure runs between fork and exec and only makes system calls on data
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                setns(&nsfile, CloneFlags::CLONE_NEWNET)?;
                unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS)?;
                mounts_private()?;
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
    }
}

impl Drop for NetnsWorld {
    fn drop(&mut self) {
        self.destroy();
    }
}
