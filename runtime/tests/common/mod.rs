//! Shared by the end-to-end tests: a DVM of real `prted` processes on harness hosts, driven
//! through `pctl` like an operator would.
#![allow(dead_code)]

use std::time::{Duration, SystemTime};

use dvmlab_harness::{wait_until, BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};
use dvmlab_proto::contract::{JobReport, StatusReport};

pub const PRTED: &str = env!("CARGO_BIN_EXE_prted");
pub const PCTL: &str = env!("CARGO_BIN_EXE_pctl");
pub const PRUN: &str = env!("CARGO_BIN_EXE_prun");
pub const PEVENT: &str = env!("CARGO_BIN_EXE_pevent");

/// What a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    AnyBackend,
    /// IPv6 hosts (netns only).
    Ipv6,
    /// Network namespaces specifically (kernel knobs per host).
    Netns,
}

/// The backend to run on, or `None` after saying loudly why this test skips.
pub fn backend(test: &str, needs: Needs) -> Option<BackendKind> {
    let b = match BackendKind::from_env() {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    if b == BackendKind::Process && needs != Needs::AnyBackend {
        let what = if needs == Needs::Ipv6 {
            "IPv6 hosts"
        } else {
            "per-host kernel settings"
        };
        dvmlab_harness::skip(
            test,
            &format!("needs network namespaces for {what} (run as root, or DVMLAB_BACKEND=netns)"),
        );
        return None;
    }
    Some(b)
}

/// `n01`, `n02`, …
pub fn node_names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("n{i:02}")).collect()
}

/// The MCA parameter naming the DVM key file, as environment.
pub const KEY_ENV: &str = "PRTE_MCA_dvmlab_dvm_key_file";

/// `n` nodes `n01…` and the host list `ctl, n01, …`.
pub fn ctl_and_nodes(n: usize) -> (Vec<String>, Vec<String>) {
    let nodes = node_names(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    (nodes, hosts)
}

/// A `prte.conf` with DVMNodes `n[2:1-n]` and DVMControllerHost `ctl`.
pub fn conf_for(n: usize) -> PrteConf {
    PrteConf::new()
        .set("DVMNodes", format!("n[2:1-{n}]"))
        .set("DVMControllerHost", "ctl")
}

/// The radix-tree parent by the formula in the specs README, written independently of the
/// runtime's tree module so the two check each other.
pub fn formula_parent(r: u32, radix: u32) -> Option<u32> {
    if r == 0 {
        return None;
    }
    let (r, radix) = (u64::from(r), u64::from(radix));
    let (mut off, mut width) = (0u64, 1u64);
    let mut prev = (0u64, 1u64);
    while r >= off + width {
        prev = (off, width);
        off += width;
        width *= radix;
    }
    Some((prev.0 + (r - off) % prev.1) as u32)
}

/// A DVM under test: a harness cluster whose hosts run `prted --bootstrap`.
pub struct Dvm {
    pub cluster: Cluster,
    /// The host the controller runs on (also where `pctl` runs).
    pub ctl: String,
}

impl Dvm {
    /// A formed DVM of `ctl` and `n` nodes at `radix` over IPv4 (all started together), with
    /// its host list; `None` after saying loudly why `test` skips.
    pub fn formed(test: &str, needs: Needs, n: usize, radix: u32) -> Option<(Dvm, Vec<String>)> {
        Dvm::formed_with(test, needs, n, radix, |_| {})
    }

    /// As [`Dvm::formed`], with no DVM key: links in the clear, as the bootstrap spec has
    /// them.
    pub fn formed_keyless(
        test: &str,
        needs: Needs,
        n: usize,
        radix: u32,
    ) -> Option<(Dvm, Vec<String>)> {
        Dvm::formed_with(test, needs, n, radix, |s| {
            s.key_file = None;
            s.env.retain(|(k, _)| k != KEY_ENV);
        })
    }

    pub fn formed_with(
        test: &str,
        needs: Needs,
        n: usize,
        radix: u32,
        tweak: impl FnOnce(&mut ClusterSpec),
    ) -> Option<(Dvm, Vec<String>)> {
        let b = backend(test, needs)?;
        let (_, hosts) = ctl_and_nodes(n);
        let conf = conf_for(n).set("DVMRadix", radix);
        let mut dvm = Dvm::with_spec(test, b, IpMode::V4, &hosts, &conf, tweak);
        dvm.cluster.start_all().unwrap();
        dvm.wait_formed(Duration::from_secs(10));
        Some((dvm, hosts))
    }

    /// Builds (does not start) a cluster of `hosts` sharing `conf`.
    pub fn new(
        label: &str,
        backend: BackendKind,
        ip: IpMode,
        hosts: &[String],
        conf: &PrteConf,
    ) -> Dvm {
        Dvm::with_spec(label, backend, ip, hosts, conf, |_| {})
    }

    pub fn with_spec(
        label: &str,
        backend: BackendKind,
        ip: IpMode,
        hosts: &[String],
        conf: &PrteConf,
        tweak: impl FnOnce(&mut ClusterSpec),
    ) -> Dvm {
        let mut spec = ClusterSpec::new(label, hosts, vec![PRTED.into(), "--bootstrap".into()]);
        spec.backend = backend;
        spec.ip = ip;
        spec.conf = conf.render();
        // Every test DVM has a key, as the harness makes one per cluster.
        spec.env
            .push(("PRTE_MCA_dvmlab_dvm_key_file".into(), "{key}".into()));
        tweak(&mut spec);
        let cluster = Cluster::new(spec).unwrap_or_else(|e| panic!("cluster {label}: {e}"));
        Dvm {
            cluster,
            ctl: hosts[0].clone(),
        }
    }

    /// Runs `pctl ARGS` on the controller's host; returns (success, stdout, stderr).
    pub fn pctl(&self, args: &[&str]) -> (bool, String, String) {
        let mut argv = vec![PCTL.to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let (st, out, err) = self
            .cluster
            .exec_within(&self.ctl, &argv, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("pctl: {e}"));
        (st.is_some_and(|s| s.success()), out, err)
    }

    pub fn status(&self) -> Result<StatusReport, String> {
        let (ok, out, err) = self.pctl(&["status", "--json", "--timeout", "2"]);
        if !ok {
            return Err(err);
        }
        serde_json::from_str(&out).map_err(|e| format!("status JSON {out:?}: {e}"))
    }

    /// Waits until `pctl status` says formed.
    pub fn wait_formed(&self, within: Duration) -> StatusReport {
        self.wait_status(within, "formed", |s| s.formed)
    }

    /// Waits until `pctl status` satisfies `pred`.
    pub fn wait_status(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&StatusReport) -> bool,
    ) -> StatusReport {
        wait_until(within, Duration::from_millis(25), || {
            let s = self.status()?;
            if pred(&s) {
                Ok(s)
            } else {
                Err(format!(
                    "not yet {what}: {}",
                    serde_json::to_string(&s).unwrap_or_default()
                ))
            }
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `pctl stop`, then every started daemon must exit with status 0.
    pub fn stop_cleanly(&mut self, hosts: &[String]) {
        let (ok, out, err) = self.pctl(&["stop"]);
        assert!(ok, "pctl stop failed: {out}{err}");
        for h in hosts {
            let st = self
                .cluster
                .wait_exit(h, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{h} did not exit after pctl stop: {e}"));
            assert!(st.success(), "{h} exited with {st} after pctl stop");
        }
    }
}

/// Runs `prun ARGS` on the controller's host; returns (exit code, stdout, stderr) as bytes.
pub fn prun_bytes(dvm: &Dvm, args: &[&str]) -> (Option<i32>, Vec<u8>, Vec<u8>) {
    let mut argv = vec![PRUN.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let (st, out, err) = dvm
        .cluster
        .exec_within_bytes(&dvm.ctl, &argv, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("prun: {e}"));
    (st.and_then(|s| s.code()), out, err)
}

/// Starts `prun ARGS` on the controller's host in the background, its stdout going to the
/// file `out` (stderr discarded).
pub fn spawn_prun(dvm: &Dvm, args: &[&str], out: &std::path::Path) -> std::process::Child {
    let mut argv = vec![PRUN.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    dvm.cluster
        .command(&dvm.ctl, &argv)
        .unwrap()
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// [`prun_bytes`] with the output as text.
pub fn prun(dvm: &Dvm, args: &[&str]) -> (Option<i32>, String, String) {
    let (code, out, err) = prun_bytes(dvm, args);
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (code, text(out), text(err))
}

/// `pctl jobs --json`.
pub fn jobs(dvm: &Dvm) -> Vec<JobReport> {
    let (ok, out, err) = dvm.pctl(&["jobs", "--json"]);
    assert!(ok, "pctl jobs: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The resident set of `host`'s daemon, in KiB.
pub fn rss_kib(dvm: &Dvm, host: &str) -> u64 {
    status_kib(dvm, host, "VmRSS")
}

/// A size `/proc/PID/status` gives for `host`'s daemon (`VmRSS`, `VmHWM`, …), in KiB.
pub fn status_kib(dvm: &Dvm, host: &str, field: &str) -> u64 {
    let pid = dvm.cluster.pid(host).expect("daemon running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}
