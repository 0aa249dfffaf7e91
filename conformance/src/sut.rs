//! The system under test: an implementation's DVM on a harness cluster, driven only through
//! its profile (daemon command, status, stop, identity), never through its code.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dvmlab_harness::{wait_until, BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};

use crate::knobs::Cell;
use crate::outcome::{check, fail, OrUnresolved, Problem, Verdict};
use crate::profile::Profile;
use crate::status::{Field, Identity, Status};

/// A cluster a test built: where its logs are, for the report.
#[derive(Debug, Clone)]
pub struct ClusterRecord {
    pub label: String,
    pub run_dir: PathBuf,
    pub hosts: Vec<String>,
}

/// What a test gets: the profile, its matrix cell, the seed, and a place to leave notes
/// (printed with a failure) and the clusters it built.
pub struct Ctx {
    pub profile: Arc<Profile>,
    pub cell: Cell,
    pub seed: u64,
    pub test: String,
    notes: Mutex<Vec<String>>,
    clusters: Mutex<Vec<ClusterRecord>>,
    aspects: Mutex<BTreeMap<String, Verdict>>,
}

impl Ctx {
    pub fn new(profile: Arc<Profile>, cell: Cell, seed: u64, test: &str) -> Ctx {
        Ctx {
            profile,
            cell,
            seed,
            test: test.to_string(),
            notes: Mutex::new(Vec::new()),
            clusters: Mutex::new(Vec::new()),
            aspects: Mutex::new(BTreeMap::new()),
        }
    }

    /// Judges one aspect of this test (see [`crate::checks::TestDef`]): its verdict is kept
    /// and the test goes on. An aspect judged twice keeps its first failure.
    pub fn aspect(&self, name: &str, v: Verdict) {
        if let Ok(mut a) = self.aspects.lock() {
            match a.get(name) {
                Some(Err(_)) => {}
                _ => {
                    a.insert(name.to_string(), v);
                }
            }
        }
    }

    pub fn aspects(&self) -> BTreeMap<String, Verdict> {
        self.aspects.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Records something that happened, for the failure report.
    pub fn note(&self, s: impl Into<String>) {
        if let Ok(mut n) = self.notes.lock() {
            n.push(s.into());
        }
    }

    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().map(|n| n.clone()).unwrap_or_default()
    }

    pub fn clusters(&self) -> Vec<ClusterRecord> {
        self.clusters.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The IP mode of the cell.
    pub fn ip_mode(&self) -> IpMode {
        if self.cell.ip == 6 {
            IpMode::V6
        } else {
            IpMode::V4
        }
    }

    /// Not run unless the cell's backend is netns (impaired links and per-host kernel knobs
    /// need it).
    pub fn need_netns(&self, what: &str) -> Verdict {
        if self.cell.backend == BackendKind::Netns {
            Ok(())
        } else {
            Err(Problem::NotRun(format!(
                "{what} needs the netns backend (this run uses {} hosts)",
                self.backend_name()
            )))
        }
    }

    /// Not run unless hosts have networks of their own (netns or docker backend): host
    /// names, address families, partitions, a switch that counts connections.
    pub fn need_own_networks(&self, what: &str) -> Verdict {
        if self.cell.backend != BackendKind::Process {
            Ok(())
        } else {
            Err(Problem::NotRun(format!(
                "{what} needs the netns or docker backend (this run uses process hosts)"
            )))
        }
    }

    fn backend_name(&self) -> &'static str {
        match self.cell.backend {
            BackendKind::Netns => "netns",
            BackendKind::Process => "process",
            BackendKind::Docker => "docker",
        }
    }

    /// Unsupported unless the profile's status reports `field`: for a test whose only
    /// evidence it is (the suite cannot observe it from outside).
    pub fn need_report(&self, field: Field, what: &str) -> Verdict {
        if self.profile.status.reports(field) {
            Ok(())
        } else {
            Err(Problem::Unsupported(format!(
                "{what} needs the status to report `{}`, which profile {} says it does not, and the suite cannot observe it from outside",
                field.key(),
                self.profile.path.display()
            )))
        }
    }

    /// Unsupported unless the profile declares `feature`.
    pub fn need_feature(&self, feature: &str, declared: bool) -> Verdict {
        if declared {
            Ok(())
        } else {
            Err(Problem::Unsupported(format!(
                "profile {} does not declare feature `{feature}`",
                self.profile.path.display()
            )))
        }
    }
}

/// `n01`, `n02`, …
pub fn node_names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("n{i:02}")).collect()
}

/// A DVM of the implementation under test. The controller's host is `ctl` unless said
/// otherwise; status and stop commands run there.
pub struct Dvm<'a> {
    pub cluster: Cluster,
    pub ctl: String,
    /// Words appended to the status and stop commands (e.g. an MCA override the daemons
    /// were also given).
    pub tool_args: Vec<String>,
    /// The DVMPort its daemons connect to (7817 unless the test's configuration says).
    pub port: u16,
    /// Every upstream link the network showed so far: host -> peer -> when first seen.
    links: Mutex<BTreeMap<String, BTreeMap<String, Duration>>>,
    born: Instant,
    ctx: &'a Ctx,
}

/// How long a status or stop command may take before it counts as hung.
const COMMAND_LIMIT: Duration = Duration::from_secs(20);

impl<'a> Dvm<'a> {
    /// Builds a cluster of `hosts` (the first runs the controller) sharing `conf`, in the
    /// cell's IP family; nothing is started.
    pub fn new(
        ctx: &'a Ctx,
        label: &str,
        hosts: &[String],
        conf: &PrteConf,
    ) -> Result<Self, Problem> {
        Dvm::with(ctx, label, hosts, conf, |_| {})
    }

    /// As [`Dvm::new`], letting `tweak` adjust the cluster spec first.
    pub fn with(
        ctx: &'a Ctx,
        label: &str,
        hosts: &[String],
        conf: &PrteConf,
        tweak: impl FnOnce(&mut ClusterSpec),
    ) -> Result<Self, Problem> {
        let p = &ctx.profile;
        if !p.has_dvm {
            return Err(Problem::Unsupported(format!(
                "profile {} drives no DVM (it has no [daemon], [status] and [stop])",
                p.path.display()
            )));
        }
        Dvm::build(ctx, label, hosts, conf, p.daemon.command.clone(), tweak)
    }

    /// A cluster of `hosts` whose every host runs `daemon` when started.
    pub(crate) fn build(
        ctx: &'a Ctx,
        label: &str,
        hosts: &[String],
        conf: &PrteConf,
        daemon: Vec<String>,
        tweak: impl FnOnce(&mut ClusterSpec),
    ) -> Result<Self, Problem> {
        let p = &ctx.profile;
        let mut spec = ClusterSpec::new(label, hosts, daemon);
        spec.backend = ctx.cell.backend;
        spec.ip = ctx.ip_mode();
        spec.conf = conf.render();
        spec.conf_file = p.daemon.conf_path.trim_start_matches("/etc/").to_string();
        spec.env = p
            .daemon
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if spec.backend == BackendKind::Process {
            let Some(pb) = &p.process_backend else {
                return Err(Problem::Unsupported(format!(
                    "profile {} has no [process_backend] (hosts as plain processes need it)",
                    p.path.display()
                )));
            };
            spec.identity_env = pb.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        // Docker hosts see this machine's directories only where mounted: those of every
        // program and script the profile names.
        spec.mounts = p.named_directories();
        tweak(&mut spec);
        if spec.ip == IpMode::V6 && !p.features.ipv6 {
            return Err(Problem::Unsupported(format!(
                "IPv6-only hosts, and profile {} does not declare feature `ipv6`",
                p.path.display()
            )));
        }
        if spec.backend == BackendKind::Process && spec.ip != IpMode::V4 {
            return Err(Problem::NotRun(
                "IPv6 hosts need the netns or docker backend".into(),
            ));
        }
        let mut cluster = Cluster::new(spec).or_unresolved(&format!("building cluster {label}"))?;
        cluster.keep_run_dir();
        if let Ok(mut c) = ctx.clusters.lock() {
            c.push(ClusterRecord {
                label: label.to_string(),
                run_dir: cluster.run_dir().to_path_buf(),
                hosts: hosts.to_vec(),
            });
        }
        let port = conf
            .render()
            .lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == "DVMPort")
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(7817);
        Ok(Dvm {
            cluster,
            ctl: hosts.first().cloned().unwrap_or_default(),
            tool_args: Vec::new(),
            port,
            links: Mutex::new(BTreeMap::new()),
            born: Instant::now(),
            ctx,
        })
    }

    /// What the network shows now: for every host whose daemon runs, the hosts it holds an
    /// established connection to on DVMPort (its upstream links, read from the kernel, not
    /// from the runtime). Each link's first sighting is kept ([`Dvm::first_seen`]).
    pub fn observe(&self) -> Result<BTreeMap<String, Vec<String>>, Problem> {
        let mut now = BTreeMap::new();
        for h in self.hosts() {
            let peers = self
                .cluster
                .upstreams(&h, self.port)
                .or_unresolved("reading a host's TCP connections")?;
            now.insert(h, peers);
        }
        let at = self.born.elapsed();
        if let Ok(mut links) = self.links.lock() {
            for (h, peers) in &now {
                let seen = links.entry(h.clone()).or_default();
                for p in peers {
                    seen.entry(p.clone()).or_insert(at);
                }
            }
        }
        Ok(now)
    }

    /// When this DVM was built: [`Dvm::first_seen`] counts from here.
    pub fn built_at(&self) -> Instant {
        self.born
    }

    /// The profile driving this DVM.
    pub fn profile(&self) -> &crate::profile::Profile {
        &self.ctx.profile
    }

    /// Whether the profile's status reports `f`.
    pub fn reports(&self, f: Field) -> bool {
        self.ctx.profile.status.reports(f)
    }

    /// When the suite first saw `host`'s daemon connected up to `peer`, since the DVM was
    /// built (to the resolution of its status reads and observations).
    pub fn first_seen(&self, host: &str, peer: &str) -> Option<Duration> {
        self.links.lock().ok()?.get(host)?.get(peer).copied()
    }

    /// The cluster host a name or address a runtime reports stands for: the host itself, a
    /// host's IP address, or a host's fully qualified name.
    pub fn host_named(&self, reported: &str) -> Option<String> {
        let hosts = self.hosts();
        if hosts.iter().any(|h| h == reported) {
            return Some(reported.to_string());
        }
        if let Ok(ip) = reported.parse() {
            return self.cluster.host_of(ip).map(str::to_string);
        }
        let short = reported.split('.').next()?;
        hosts.into_iter().find(|h| h == short)
    }

    pub fn start(&mut self, host: &str) -> Verdict {
        self.cluster
            .start(host)
            .or_unresolved(&format!("starting the daemon on {host}"))
    }

    pub fn start_many<S: AsRef<str>>(&mut self, hosts: &[S]) -> Verdict {
        hosts.iter().try_for_each(|h| self.start(h.as_ref()))
    }

    pub fn start_all(&mut self) -> Verdict {
        let all: Vec<String> = self
            .cluster
            .hosts()
            .iter()
            .map(|h| h.name.clone())
            .collect();
        self.start_many(&all)
    }

    /// Runs `argv` on `host` with a time limit; (exit code if it exited, stdout, stderr).
    pub fn run_on(
        &self,
        host: &str,
        argv: &[String],
        within: Duration,
    ) -> Result<(Option<i32>, String, String), Problem> {
        let (st, out, err) = self
            .cluster
            .exec_within(host, argv, within)
            .or_unresolved(&format!("running {argv:?} on {host}"))?;
        Ok((st.map(|s| s.code().unwrap_or(128)), out, err))
    }

    /// The profile's status command on the controller's host, parsed. `Err(Ok(why))` when
    /// the implementation gave no status (it may not be up yet); `Err(Err(problem))` when
    /// the command could not even be run (an unresolved harness problem).
    pub fn status(&self) -> Result<Status, Result<String, Problem>> {
        let s = self.status_unobserved();
        // The network is read at every status read, so a link is seen about when the
        // runtime reports it.
        self.observe().map_err(Err)?;
        s
    }

    /// As [`Dvm::status`] without reading the network (which runs a command on every
    /// host): for a caller that times the DVM and must not load the machine.
    pub fn status_unobserved(&self) -> Result<Status, Result<String, Problem>> {
        let mut argv = self.ctx.profile.status.command.clone();
        argv.extend(self.tool_args.iter().cloned());
        let (code, out, err) = self.run_on(&self.ctl, &argv, COMMAND_LIMIT).map_err(Err)?;
        if code != Some(0) {
            return Err(Ok(format!(
                "status command exited {code:?}: {}",
                err.trim()
            )));
        }
        Status::parse(&out, &self.ctx.profile.status.reports)
            .map_err(|e| Ok(format!("status command printed {e}")))
    }

    /// The status now; no status at all is a failure to report one.
    pub fn status_now(&self, what: &str) -> Result<Status, Problem> {
        match self.status() {
            Ok(s) => Ok(s),
            Err(Ok(why)) => Err(fail(what, why)),
            Err(Err(p)) => Err(p),
        }
    }

    /// Waits until the status satisfies `pred`; fails (with the last status seen) if it
    /// does not within `within`.
    pub fn wait_status(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Status) -> bool,
    ) -> Result<Status, Problem> {
        let mut last = String::from("no status yet");
        let mut broken = None;
        let r = wait_until(within, Duration::from_millis(50), || match self.status() {
            Ok(s) if pred(&s) => Ok(s),
            Ok(s) => {
                last = s.describe();
                Err(String::new())
            }
            Err(Ok(e)) => {
                last = e;
                Err(String::new())
            }
            Err(Err(p)) => {
                broken = Some(p);
                // Ends the wait at once: the harness, not the implementation, failed.
                Ok(Status::default())
            }
        });
        if let Some(p) = broken {
            return Err(p);
        }
        r.map_err(|_| fail(format!("{what} within {within:?}"), last))
    }

    pub fn wait_formed(&self, within: Duration) -> Result<Status, Problem> {
        self.wait_status(within, "the DVM reported formed", |s| s.formed)
    }

    /// Checks that `pred` holds on every status read for `window` (a negative property needs
    /// an observation window); fails with the first status that breaks it.
    pub fn holds_for(
        &self,
        window: Duration,
        what: &str,
        pred: impl Fn(&Status) -> bool,
    ) -> Verdict {
        let end = Instant::now() + window;
        while Instant::now() < end {
            match self.status() {
                Ok(s) if pred(&s) => {}
                Ok(s) => return Err(fail(format!("{what} (for {window:?})"), s.describe())),
                Err(Ok(e)) => return Err(fail(format!("{what} (for {window:?})"), e)),
                Err(Err(p)) => return Err(p),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The profile's stop command; then every daemon started must have exited, with status 0.
    pub fn stop(&mut self) -> Verdict {
        self.stop_sparing(&[])
    }

    /// As [`Dvm::stop`], the daemons of `killed` (killed on purpose) not judged by how they
    /// exited.
    pub fn stop_sparing(&mut self, killed: &[String]) -> Verdict {
        let mut argv = self.ctx.profile.stop.command.clone();
        argv.extend(self.tool_args.iter().cloned());
        let (code, out, err) = self.run_on(&self.ctl, &argv, COMMAND_LIMIT)?;
        if code != Some(0) {
            return Err(fail(
                "the stop command succeeds",
                format!("exit {code:?}: {out}{err}"),
            ));
        }
        let grace = Duration::from_secs_f64(self.ctx.profile.stop.grace_seconds);
        for h in self.hosts() {
            if self.cluster.pid(&h).is_none() || killed.contains(&h) {
                continue;
            }
            // A daemon that exited before the stop is judged by its status too.
            match self.cluster.wait_exit(&h, grace) {
                Ok(st) if st.success() => {}
                Ok(st) => {
                    return Err(fail(
                        format!("the daemon on {h} exits with status 0 after stop"),
                        format!("it exited with {st}"),
                    ))
                }
                Err(_) => {
                    return Err(fail(
                        format!("the daemon on {h} exits within {grace:?} after stop"),
                        "it is still running",
                    ))
                }
            }
        }
        Ok(())
    }

    /// Runs the daemon command once on `host` (outside the cluster's supervision) and waits
    /// for it to exit: for configurations that must make it abort.
    pub fn run_daemon_once(
        &self,
        host: &str,
        within: Duration,
    ) -> Result<(Option<i32>, String, String), Problem> {
        let argv = self.ctx.profile.daemon.command.clone();
        let (code, out, err) = self.run_on(host, &argv, within)?;
        // Into the host's log, which a failure report copies and points to.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.cluster.log_file(host))
        {
            use std::io::Write;
            let _ = writeln!(f, "==== {argv:?} exited {code:?}\n{out}{err}");
        }
        Ok((code, out, err))
    }

    /// The profile's identity command on `host`.
    pub fn identity(&self, host: &str) -> Result<Identity, Problem> {
        let Some(cmd) = &self.ctx.profile.identity else {
            return Err(Problem::Unsupported(
                "the profile has no [identity] command".into(),
            ));
        };
        let (code, out, err) = self.run_on(host, &cmd.command, COMMAND_LIMIT)?;
        if code != Some(0) {
            return Err(fail(
                format!("the identity command succeeds on {host}"),
                format!("exit {code:?}: {err}"),
            ));
        }
        serde_json::from_str(out.trim()).map_err(|e| {
            fail(
                format!("the identity JSON on {host}"),
                format!("{e}: {out}"),
            )
        })
    }

    /// TCP sockets on `host` (as `ss -Htan` prints them): what the host's daemon uses.
    pub fn tcp_sockets(&self, host: &str) -> Result<String, Problem> {
        let argv = ["ss", "-Htan"].map(String::from);
        let (code, out, err) = self.run_on(host, &argv, Duration::from_secs(10))?;
        if code != Some(0) {
            return Err(Problem::Unresolved(format!("ss on {host}: {err}")));
        }
        Ok(out)
    }

    /// Whether something on `host` listens on TCP `port`. Process hosts share the machine's
    /// sockets, so there the listener must be bound to the host's own address.
    pub fn listens_on(&self, host: &str, port: u16) -> Result<bool, Problem> {
        let socks = self.tcp_sockets(host)?;
        let own = match self.ctx.cell.backend {
            BackendKind::Netns | BackendKind::Docker => None,
            BackendKind::Process => self
                .cluster
                .host(host)
                .ok()
                .and_then(|h| h.v4)
                .map(|a| format!("{a}:{port}")),
        };
        Ok(socks.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"LISTEN")
                && f.get(3).is_some_and(|a| match &own {
                    Some(own) => a == own,
                    None => a.ends_with(&format!(":{port}")),
                })
        }))
    }

    fn jobs_profile(&self) -> Result<crate::profile::Jobs, Problem> {
        self.ctx.profile.jobs.clone().ok_or_else(|| {
            Problem::Unsupported("the profile has no [jobs] section (how to run jobs)".into())
        })
    }

    /// The submit command for `nprocs` processes on `hosts` running `cmd`, with `extra`
    /// words (a time limit) before the command.
    pub fn submit_argv(
        &self,
        nprocs: usize,
        hosts: &[String],
        extra: &[String],
        cmd: &[&str],
    ) -> Result<Vec<String>, Problem> {
        let j = self.jobs_profile()?;
        let mut argv: Vec<String> = j
            .submit
            .iter()
            .map(|w| {
                w.replace("{nprocs}", &nprocs.to_string())
                    .replace("{hosts}", &hosts.join(","))
            })
            .collect();
        argv.extend(extra.iter().cloned());
        argv.extend(cmd.iter().map(|s| s.to_string()));
        Ok(argv)
    }

    /// Runs a job to its end: (exit code, stdout, stderr).
    pub fn run_job(
        &self,
        nprocs: usize,
        hosts: &[String],
        cmd: &[&str],
    ) -> Result<(Option<i32>, String, String), Problem> {
        let argv = self.submit_argv(nprocs, hosts, &[], cmd)?;
        self.run_on(&self.ctl, &argv, COMMAND_LIMIT)
    }

    /// Starts a job in the background; its stdout and stderr go to files `<name>.out` and
    /// `<name>.err` of the run directory.
    pub fn spawn_job(
        &self,
        name: &str,
        argv: &[String],
    ) -> Result<(std::process::Child, PathBuf, PathBuf), Problem> {
        let out = self.cluster.run_dir().join(format!("{name}.out"));
        let err = self.cluster.run_dir().join(format!("{name}.err"));
        let file = |p: &PathBuf| {
            std::fs::File::create(p)
                .map_err(|e| Problem::Unresolved(format!("{}: {e}", p.display())))
        };
        let child = self
            .cluster
            .command(&self.ctl, argv)
            .or_unresolved("the submit command")?
            .stdin(std::process::Stdio::null())
            .stdout(file(&out)?)
            .stderr(file(&err)?)
            .spawn()
            .or_unresolved("starting the submit command")?;
        Ok((child, out, err))
    }

    /// The job list, parsed.
    pub fn jobs(&self) -> Result<Vec<crate::status::JobView>, Problem> {
        let j = self.jobs_profile()?;
        let (code, out, err) = self.run_on(&self.ctl, &j.list, COMMAND_LIMIT)?;
        if code != Some(0) {
            return Err(fail(
                "the job list command succeeds",
                format!("exit {code:?}: {err}"),
            ));
        }
        serde_json::from_str(out.trim())
            .map_err(|e| fail("the job list JSON", format!("{e}: {out}")))
    }

    /// Waits until job `id` (the newest job when `None`) satisfies `pred`.
    pub fn wait_job(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&crate::status::JobView) -> bool,
    ) -> Result<crate::status::JobView, Problem> {
        let mut last = String::from("no job list yet");
        let end = Instant::now() + within;
        loop {
            let jobs = self.jobs()?;
            if let Some(j) = jobs.last() {
                if pred(j) {
                    return Ok(j.clone());
                }
                last = format!("{j:?}");
            }
            if Instant::now() >= end {
                return Err(fail(format!("{what} within {within:?}"), last));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (a name such as `TERM`) to every process of job `id`.
    pub fn kill_job(&self, id: u64, signal: &str) -> Verdict {
        let j = self.jobs_profile()?;
        let argv: Vec<String> = j
            .kill
            .iter()
            .map(|w| {
                w.replace("{id}", &id.to_string())
                    .replace("{signal}", signal)
            })
            .collect();
        let (code, out, err) = self.run_on(&self.ctl, &argv, COMMAND_LIMIT)?;
        check(
            code == Some(0),
            format!("the kill command for job {id} succeeds"),
            format!("exit {code:?}: {out}{err}"),
        )
    }

    /// The hosts of the cluster, by name.
    pub fn hosts(&self) -> Vec<String> {
        self.cluster
            .hosts()
            .iter()
            .map(|h| h.name.clone())
            .collect()
    }
}
