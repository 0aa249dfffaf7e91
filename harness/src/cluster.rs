//! A cluster of hosts on this machine, each able to run the daemon under test, and the faults
//! a test can inject into it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::addr::{self, Block, BlockKind};
use crate::docker::{DockerPlan, DockerWorld};
use crate::netns::NetnsWorld;
use crate::process::{expand, Placeholders, DEFAULT_IDENTITY_ENV};
use crate::{gc, procs, rundir, wait_until, PREFIX};

/// Which backend hosts run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Netns,
    Process,
    Docker,
}

impl BackendKind {
    /// `DVMLAB_BACKEND` (`netns`, `process` or `docker`) if set, else netns when this process
    /// may create namespaces, else process.
    pub fn from_env() -> Result<BackendKind, String> {
        match std::env::var("DVMLAB_BACKEND").ok().as_deref() {
            Some("netns") => Ok(BackendKind::Netns),
            Some("process") => Ok(BackendKind::Process),
            Some("docker") => Ok(BackendKind::Docker),
            Some(other) => Err(format!(
                "DVMLAB_BACKEND={other}: expected netns, process or docker"
            )),
            None if crate::netns_available() => Ok(BackendKind::Netns),
            None => Ok(BackendKind::Process),
        }
    }
}

/// Which address families hosts get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpMode {
    V4,
    V6,
    Dual,
}

/// What [`Cluster::exec_within_bytes`] returns: the exit status (`None` if it was killed for
/// overrunning), stdout and stderr.
pub type ExecBytes = (Option<ExitStatus>, Vec<u8>, Vec<u8>);

/// What to build.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Names the run in logs.
    pub label: String,
    pub hosts: Vec<String>,
    pub ip: IpMode,
    pub backend: BackendKind,
    /// The `prte.conf` every host gets (see [`Cluster::set_host_conf`] for exceptions).
    pub conf: String,
    /// Where the configuration file is, relative to `/etc` (default `prte.conf`).
    pub conf_file: String,
    /// The daemon command line, identical on every host.
    pub daemon: Vec<String>,
    /// Extra environment for every process started on a host; `{key}` in a value is the
    /// path of [`ClusterSpec::key_file`] as the host sees it.
    pub env: Vec<(String, String)>,
    /// Process backend: the identity environment (see [`DEFAULT_IDENTITY_ENV`]).
    pub identity_env: Vec<(String, String)>,
    /// Lines appended to every host's hosts file.
    pub extra_hosts_lines: Vec<String>,
    /// netns and docker backends: hosts whose kernel IPv6 is switched off.
    pub no_ipv6: Vec<String>,
    /// When set, hosts files name every host `name.<domain>` first, with the short name as an
    /// alias (`10.200.0.4 n01.lab.example n01`).
    pub domain: Option<String>,
    /// netns and docker backends: every host also sits on a second network (`eth1`;
    /// 10.201.0.0/16 and/or fd00:201::/64 on netns), and its name resolves to both of its
    /// addresses.
    pub dual_homed: bool,
    /// docker backend: directories of this machine the hosts see, read-only, at the same
    /// path (the directories of the daemon command's absolute paths, the current directory,
    /// `/usr` and the run directory are always there).
    pub mounts: Vec<PathBuf>,
    /// A file (relative to `/etc`, default `dvm.key`) holding a secret made fresh for this
    /// cluster: 64 random hexadecimal digits, mode 0600, the same on every host (the DVM
    /// key). `None`: no such file.
    pub key_file: Option<String>,
}

impl ClusterSpec {
    pub fn new(label: &str, hosts: &[String], daemon: Vec<String>) -> ClusterSpec {
        ClusterSpec {
            label: label.to_string(),
            hosts: hosts.to_vec(),
            ip: IpMode::V4,
            backend: BackendKind::Process,
            conf: String::new(),
            conf_file: "prte.conf".to_string(),
            daemon,
            env: Vec::new(),
            identity_env: DEFAULT_IDENTITY_ENV
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            extra_hosts_lines: Vec::new(),
            no_ipv6: Vec::new(),
            dual_homed: false,
            domain: None,
            mounts: Vec::new(),
            key_file: Some("dvm.key".to_string()),
        }
    }
}

/// One host of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    pub name: String,
    pub index: usize,
    pub v4: Option<IpAddr>,
    pub v6: Option<IpAddr>,
    /// Addresses on the second network (`eth1`) of a dual-homed cluster.
    pub second: Vec<IpAddr>,
}

pub(crate) enum World {
    Netns(NetnsWorld),
    /// The block is held for its lifetime: dropping it releases the reservation.
    Process {
        _block: Block,
    },
    Docker(Box<DockerWorld>),
}

static RUNS: AtomicU32 = AtomicU32::new(0);

/// Waits for `child`, which leads its own process group, to exit, for at most `within`: a
/// blocking wait on a helper thread, whose answer comes the moment the child exits. (Polled
/// every 5 ms, it added up to 5 ms to every command the benches timed, and none to the
/// floors they were compared with.) Past `within`, the group is killed and reaped: `None`.
fn wait_within(mut child: Child, within: Duration) -> std::io::Result<Option<ExitStatus>> {
    let group = Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::Builder::new()
        .name("exec-wait".into())
        .spawn(move || {
            let _ = tx.send(child.wait());
        })
        .inspect_err(|_| {
            // Nobody could wait for it: it must not run on unseen.
            let _ = killpg(group, Signal::SIGKILL);
        })?;
    let status = match rx.recv_timeout(within) {
        Ok(st) => st.map(Some),
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            Ok(None)
        }
    };
    let _ = waiter.join();
    status
}

/// Makes `cmd` lead its own process group (so a signal reaches everything it starts) and
/// die with this process.
fn own_group_dying_with_us(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died before the death signal was armed.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("parent exited during spawn"));
            }
            Ok(())
        });
    }
}

/// A running cluster. Everything it created is removed on drop; if the thread is panicking
/// (a failed test), the tail of every host's log is printed first and the run directory kept.
pub struct Cluster {
    pub(crate) spec: ClusterSpec,
    run: String,
    dir: PathBuf,
    hosts: Vec<HostInfo>,
    pub(crate) world: Option<World>,
    procs: HashMap<String, Child>,
    pub(crate) faults: crate::faults::Faults,
    keep: bool,
    /// Whether the run directory is a tmpfs of its own ([`rundir`]).
    tmpfs: bool,
}

impl Cluster {
    /// Creates the hosts (namespaces or loopback addresses), their `/etc` files and the run
    /// directory. No daemon is started yet.
    pub fn new(spec: ClusterSpec) -> Result<Cluster, String> {
        let run = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let dir = gc::runs_dir().join(&run);
        // Docker's daemon may not see a mount made here: its hosts keep a plain directory.
        let tmpfs = rundir::create(&dir, spec.backend != BackendKind::Docker)?;
        Cluster::build(spec, run, dir.clone(), tmpfs).inspect_err(|_| rundir::remove(&dir, tmpfs))
    }

    fn build(spec: ClusterSpec, run: String, dir: PathBuf, tmpfs: bool) -> Result<Cluster, String> {
        let plan = |addrs: &dyn Fn(usize) -> (Option<IpAddr>, Option<IpAddr>)| -> Vec<HostInfo> {
            spec.hosts
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let (v4, v6) = addrs(i);
                    let second = if spec.dual_homed {
                        [
                            v4.map(|_| IpAddr::V4(addr::netns_second_v4(i))),
                            v6.map(|_| IpAddr::V6(addr::netns_second_v6(i))),
                        ]
                        .into_iter()
                        .flatten()
                        .collect()
                    } else {
                        Vec::new()
                    };
                    HostInfo {
                        name: n.clone(),
                        index: i,
                        v4,
                        v6,
                        second,
                    }
                })
                .collect()
        };
        let v4 = spec.ip != IpMode::V6;
        let v6 = spec.ip != IpMode::V4;
        let (block, hosts) = match spec.backend {
            BackendKind::Process => {
                if spec.dual_homed {
                    return Err("dual-homed hosts need the netns or docker backend".into());
                }
                let block = Block::reserve(BlockKind::Loopback).map_err(|e| e.to_string())?;
                let b = block.block;
                (Some(block), plan(&|i| (Some(addr::loopback(b, i)), None)))
            }
            BackendKind::Netns => {
                let hosts = plan(&|i| {
                    (
                        v4.then(|| IpAddr::V4(addr::netns_v4(i))),
                        v6.then(|| IpAddr::V6(addr::netns_v6(i))),
                    )
                });
                (None, hosts)
            }
            BackendKind::Docker => {
                // Networks the engine has that no lock stands for (another tool's, or one the
                // engine failed to remove) rule their blocks out.
                let used = crate::docker::subnets_in_use()?;
                let taken = |b: u8| {
                    [false, true].iter().any(|&second| {
                        let (s4, s6) = addr::docker_subnets(b, second);
                        used.contains(&s4) || used.contains(&s6)
                    })
                };
                let block = Block::reserve_except(BlockKind::Docker, &taken)
                    .map_err(|e| format!("reserving docker subnets: {e}"))?;
                let b = block.block;
                let mut hosts = plan(&|i| {
                    (
                        v4.then(|| IpAddr::V4(addr::docker_v4(b, i))),
                        v6.then(|| IpAddr::V6(addr::docker_v6(b, i))),
                    )
                });
                for h in hosts.iter_mut().filter(|_| spec.dual_homed) {
                    h.second = [
                        v4.then(|| IpAddr::V4(addr::docker_second_v4(b, h.index))),
                        v6.then(|| IpAddr::V6(addr::docker_second_v6(b, h.index))),
                    ]
                    .into_iter()
                    .flatten()
                    .collect();
                }
                (Some(block), hosts)
            }
        };
        let mut c = Cluster {
            spec,
            run,
            dir,
            hosts,
            world: None,
            procs: HashMap::new(),
            faults: Default::default(),
            keep: false,
            tmpfs,
        };
        c.write_files()
            .map_err(|e| format!("writing host files: {e}"))?;
        let world = match (c.spec.backend, block) {
            (BackendKind::Process, Some(block)) => World::Process { _block: block },
            (BackendKind::Docker, Some(block)) => {
                World::Docker(Box::new(DockerWorld::create(block, &c.docker_plan()?)?))
            }
            _ => {
                let no_v6: Vec<usize> = c
                    .hosts
                    .iter()
                    .filter(|h| c.spec.no_ipv6.contains(&h.name))
                    .map(|h| h.index)
                    .collect();
                World::Netns(
                    NetnsWorld::create(&c.run, &c.hosts, &no_v6)
                        .map_err(|e| format!("netns setup: {e}"))?,
                )
            }
        };
        c.world = Some(world);
        if c.spec.backend == BackendKind::Docker {
            // Off once the container runs and holds its addresses, as on a host whose
            // administrator turned IPv6 off.
            for h in c.spec.no_ipv6.clone() {
                let argv = ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"];
                let out = c.exec(&h, &argv.map(String::from))?;
                if !out.status.success() {
                    return Err(format!(
                        "switching IPv6 off on {h}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
            }
        }
        Ok(c)
    }

    fn docker_plan(&self) -> Result<DockerPlan<'_>, String> {
        let mut mounts = self.spec.mounts.clone();
        mounts.extend(
            self.spec
                .daemon
                .iter()
                .map(Path::new)
                .filter(|p| p.is_absolute())
                .filter_map(|p| p.parent().map(Path::to_path_buf)),
        );
        mounts.extend(std::env::current_dir().ok().filter(|d| d != Path::new("/")));
        Ok(DockerPlan {
            run: &self.run,
            hosts: &self.hosts,
            v6: self.spec.ip != IpMode::V4,
            dual_homed: self.spec.dual_homed,
            domain: self.spec.domain.as_deref(),
            hosts_lines: self.docker_hosts_entries()?,
            etc_dirs: self.hosts.iter().map(|h| self.etc_dir(&h.name)).collect(),
            run_dir: &self.dir,
            mounts,
        })
    }

    /// The hosts entries Docker writes for every host: the cluster's, then the spec's extra
    /// lines (`address names...`).
    fn docker_hosts_entries(&self) -> Result<Vec<(IpAddr, String)>, String> {
        let mut v = self.hosts_entries();
        for l in &self.spec.extra_hosts_lines {
            let (a, names) = l
                .trim()
                .split_once(char::is_whitespace)
                .ok_or_else(|| format!("extra hosts line {l:?}: expected `address name...`"))?;
            let a: IpAddr = a
                .parse()
                .map_err(|e| format!("extra hosts line {l:?}: {a}: {e}"))?;
            v.push((a, names.trim().to_string()));
        }
        Ok(v)
    }

    /// The subnet of the cluster's first network (`second`: of its second network) in one
    /// address family, as CIDR text: what a configuration's DVMNetworks names.
    pub fn subnet(&self, second: bool, v6: bool) -> Option<String> {
        match (self.world.as_ref()?, second, v6) {
            (World::Netns(_), false, false) => Some("10.200.0.0/16".into()),
            (World::Netns(_), false, true) => Some("fd00:200::/64".into()),
            (World::Netns(_), true, false) => Some("10.201.0.0/16".into()),
            (World::Netns(_), true, true) => Some("fd00:201::/64".into()),
            (World::Docker(w), second, v6) => {
                let (s4, s6) = addr::docker_subnets(w.block(), second);
                Some(if v6 { s6 } else { s4 })
            }
            (World::Process { _block }, false, false) => {
                Some(format!("127.{}.0.0/16", _block.block))
            }
            _ => None,
        }
    }

    /// The hosts file's entries past the localhost lines: `(address, names)`.
    fn hosts_entries(&self) -> Vec<(IpAddr, String)> {
        let mut v = Vec::new();
        for h in &self.hosts {
            let names = match &self.spec.domain {
                Some(d) => format!("{}.{d} {}", h.name, h.name),
                None => h.name.clone(),
            };
            for a in [h.v4, h.v6]
                .into_iter()
                .flatten()
                .chain(h.second.iter().copied())
            {
                v.push((a, names.clone()));
            }
        }
        v
    }

    fn hosts_text(&self) -> String {
        let mut s = String::from("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n");
        for (a, names) in self.hosts_entries() {
            let _ = writeln!(s, "{a} {names}");
        }
        for l in &self.spec.extra_hosts_lines {
            let _ = writeln!(s, "{l}");
        }
        s
    }

    fn write_files(&self) -> std::io::Result<()> {
        fs::write(self.dir.join("hosts"), self.hosts_text())?;
        let key: String = rand::random::<[u8; 32]>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        for h in &self.hosts {
            let etc = self.etc_dir(&h.name);
            fs::create_dir_all(&etc)?;
            fs::create_dir_all(self.tmp_dir(&h.name))?;
            fs::write(etc.join("hosts"), self.hosts_text())?;
            self.set_host_conf(&h.name, &self.spec.conf)?;
            if let Some(k) = &self.spec.key_file {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(etc.join(k))?
                    .write_all(format!("{key}\n").as_bytes())?;
            }
        }
        Ok(())
    }

    /// Where this host's key file ([`ClusterSpec::key_file`]) is, as the host sees it.
    pub fn key_path(&self, host: &str) -> Option<PathBuf> {
        let k = self.spec.key_file.as_ref()?;
        Some(match self.spec.backend {
            BackendKind::Netns | BackendKind::Docker => Path::new("/etc").join(k),
            BackendKind::Process => self.etc_dir(host).join(k),
        })
    }

    /// The directory whose files appear in the host's `/etc` (netns) or are passed to it
    /// (process).
    pub fn etc_dir(&self, host: &str) -> PathBuf {
        self.dir.join("etc").join(host)
    }

    /// The host's temporary directory (its `TMPDIR`).
    pub fn tmp_dir(&self, host: &str) -> PathBuf {
        self.dir.join("tmp").join(host)
    }

    /// Where this host's `prte.conf` is, as the host sees it.
    pub fn conf_path(&self, host: &str) -> PathBuf {
        match self.spec.backend {
            BackendKind::Netns | BackendKind::Docker => {
                Path::new("/etc").join(&self.spec.conf_file)
            }
            BackendKind::Process => self.etc_dir(host).join(&self.spec.conf_file),
        }
    }

    /// Gives one host a different `prte.conf` (for processes started after this call).
    pub fn set_host_conf(&self, host: &str, text: &str) -> std::io::Result<()> {
        let path = self.etc_dir(host).join(&self.spec.conf_file);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, text)
    }

    /// Removes `host`'s configuration file (for processes started after this call).
    pub fn remove_host_conf(&self, host: &str) -> std::io::Result<()> {
        fs::remove_file(self.etc_dir(host).join(&self.spec.conf_file))
    }

    /// Gives every host a new `prte.conf` (for processes started after this call).
    pub fn set_conf(&mut self, text: &str) -> std::io::Result<()> {
        self.spec.conf = text.to_string();
        for h in self.spec.hosts.clone() {
            self.set_host_conf(&h, text)?;
        }
        Ok(())
    }

    pub fn run_dir(&self) -> &Path {
        &self.dir
    }

    pub fn hosts(&self) -> &[HostInfo] {
        &self.hosts
    }

    pub fn host(&self, name: &str) -> Result<&HostInfo, String> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| format!("no host {name} in cluster {}", self.spec.label))
    }

    /// The environment every process on `host` starts with (nothing else of this
    /// process's environment goes through).
    pub fn host_env(&self, host: &str) -> Result<Vec<(String, String)>, String> {
        let h = self.host(host)?;
        let mut env = Vec::new();
        for k in ["PATH", "HOME", "RUST_BACKTRACE", "DVMLAB_LOG"] {
            if let Ok(v) = std::env::var(k) {
                env.push((k.to_string(), v));
            }
        }
        // Every host has a /tmp of its own, as real hosts do.
        env.push((
            "TMPDIR".to_string(),
            self.tmp_dir(host).to_string_lossy().into_owned(),
        ));
        let hosts_file = self.dir.join("hosts");
        let conf = self.conf_path(host);
        let key = self.key_path(host).unwrap_or_default();
        let places = Placeholders {
            host: &h.name,
            hosts_file: &hosts_file.to_string_lossy(),
            conf: &conf.to_string_lossy(),
            key: &key.to_string_lossy(),
        };
        env.extend(
            self.spec
                .env
                .iter()
                .map(|(k, v)| (k.clone(), expand(v, &places))),
        );
        if let Some(World::Process { .. }) = self.world.as_ref() {
            env.extend(
                self.spec
                    .identity_env
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v, &places))),
            );
        }
        Ok(env)
    }

    /// A command that runs `argv` on `host`.
    pub fn command(&self, host: &str, argv: &[String]) -> Result<Command, String> {
        let h = self.host(host)?.clone();
        let (prog, args) = argv.split_first().ok_or("empty command line")?;
        let mut cmd = Command::new(prog);
        cmd.args(args).env_clear().envs(self.host_env(host)?);
        match self.world.as_ref() {
            Some(World::Netns(w)) => w
                .enter(&mut cmd, h.index, &h.name, &self.etc_dir(&h.name))
                .map_err(|e| format!("entering host {host}: {e}"))?,
            Some(World::Docker(w)) => {
                let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
                w.enter(&mut cmd, h.index, &cwd, &self.etc_dir(&h.name))
                    .map_err(|e| format!("entering host {host}: {e}"))?
            }
            Some(World::Process { .. }) => {}
            None => return Err("cluster already torn down".into()),
        }
        Ok(cmd)
    }

    /// Writes this cluster's launch agent (`RUN_DIR/agent HOST COMMAND ARGS…` runs COMMAND
    /// on HOST, as `ssh` would on real machines: an elastic DVM's `plm_ssh_agent`) and
    /// returns its path. Every backend has one. `harness` is the `dvmlab-harness` program, which does the entering.
    pub fn write_agent(&self, harness: &Path) -> Result<PathBuf, String> {
        let mut hosts = Vec::new();
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        for h in &self.hosts {
            let (netns, container) = match self.world.as_ref() {
                Some(World::Netns(w)) => (Some(w.netns(h.index).to_string()), None),
                Some(World::Process { .. }) => (None, None),
                Some(World::Docker(w)) => (None, Some((w.pid(h.index), cwd.clone()))),
                None => return Err("cluster already torn down".into()),
            };
            hosts.push(crate::agent::AgentHost {
                name: h.name.clone(),
                netns,
                container,
                etc_dir: self.etc_dir(&h.name),
                env: self.host_env(&h.name)?,
                log: Some(self.log_path(&h.name)),
            });
        }
        crate::agent::write(&self.dir, harness, &hosts)
    }

    fn log_path(&self, host: &str) -> PathBuf {
        self.dir.join(format!("{host}.log"))
    }

    /// Starts the daemon on `host`, its output appended to the host's log.
    pub fn start(&mut self, host: &str) -> Result<(), String> {
        if self.is_running(host) {
            return Err(format!("{host} is already running"));
        }
        let mut cmd = self.command(host, &self.spec.daemon.clone())?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(host))
            .map_err(|e| format!("log for {host}: {e}"))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(err);
        own_group_dying_with_us(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {:?} on {host}: {e}", self.spec.daemon))?;
        self.procs.insert(host.to_string(), child);
        Ok(())
    }

    /// Starts the daemon on each of `hosts`.
    pub fn start_many<S: AsRef<str>>(&mut self, hosts: &[S]) -> Result<(), String> {
        for h in hosts {
            self.start(h.as_ref())?;
        }
        Ok(())
    }

    /// Starts the daemon on every host.
    pub fn start_all(&mut self) -> Result<(), String> {
        let all = self.spec.hosts.clone();
        self.start_many(&all)
    }

    /// Whether the daemon on `host` was started and has not exited.
    pub fn is_running(&mut self, host: &str) -> bool {
        self.procs
            .get_mut(host)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The daemon's pid on `host`, if started.
    pub fn pid(&self, host: &str) -> Option<u32> {
        self.procs.get(host).map(|c| c.id())
    }

    /// The daemon the DVM itself started on `host` through the launch agent (a grow), not
    /// this cluster: a process-group leader running the daemon's program in the host's
    /// network namespace, other than the cluster's own daemon there. Netns and docker hosts
    /// only (process hosts share one namespace).
    pub fn launched_pid(&self, host: &str) -> Result<Option<u32>, String> {
        let i = self.host(host)?.index;
        let ns = match self.world.as_ref() {
            Some(World::Netns(w)) => PathBuf::from("/run/netns").join(w.netns(i)),
            Some(World::Docker(w)) => PathBuf::from(format!("/proc/{}/ns/net", w.pid(i))),
            _ => return Err("finding a launched daemon needs the netns or docker backend".into()),
        };
        let program = self
            .spec
            .daemon
            .first()
            .and_then(|p| Path::new(p).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for pid in procs::pids_in_netns(&ns).map_err(|e| format!("{host}: {e}"))? {
            let Some(st) = procs::stat(pid) else {
                continue;
            };
            // The kernel keeps 15 bytes of a command's name.
            let named = !st.comm.is_empty() && program.starts_with(&st.comm);
            if st.leads(pid) && named && st.state != 'Z' && self.pid(host) != Some(pid) {
                return Ok(Some(pid));
            }
        }
        Ok(None)
    }

    /// The daemon on `host`. One the DVM launched there is the newer (the cluster's own may
    /// still be on its way out after a shrink); one this cluster started that exited is
    /// still the answer when nothing else runs there, so that signalling it says so.
    fn daemon_pid(&mut self, host: &str) -> Result<u32, String> {
        let launched = match self.world.as_ref() {
            Some(World::Netns(_) | World::Docker(_)) => self.launched_pid(host)?,
            _ => None,
        };
        match (launched, self.pid(host)) {
            (Some(pid), _) | (None, Some(pid)) => Ok(pid),
            (None, None) => Err(format!("{host} was not started")),
        }
    }

    /// The daemon on `host` as the kernel shows it (one the DVM launched there counts, as
    /// for every fault): `running`, `frozen`, `exited` or `not started`.
    pub fn daemon_state(&mut self, host: &str) -> &'static str {
        let Ok(pid) = self.daemon_pid(host) else {
            return "not started";
        };
        if self.pid(host) == Some(pid) && !self.is_running(host) {
            return "exited";
        }
        match procs::stat(pid) {
            Some(st) if st.state == 'T' => "frozen",
            Some(st) if st.state != 'Z' => "running",
            _ => "exited",
        }
    }

    /// Sends `sig` to the daemon's process group on `host` (one this cluster started, or
    /// else one the DVM launched there).
    pub fn signal(&mut self, host: &str, sig: Signal) -> Result<(), String> {
        let pid = self.daemon_pid(host)?;
        killpg(Pid::from_raw(pid as i32), sig).map_err(|e| format!("{sig} to {host}: {e}"))
    }

    /// SIGTERM, and wait for the daemon to exit; returns its status.
    pub fn stop(&mut self, host: &str) -> Result<ExitStatus, String> {
        self.signal(host, Signal::SIGTERM)?;
        self.wait_exit(host, Duration::from_secs(10))
    }

    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self, host: &str) -> Result<(), String> {
        let pid = self.daemon_pid(host)?;
        self.signal(host, Signal::SIGKILL)?;
        if self.pid(host) == Some(pid) {
            return self.wait_exit(host, Duration::from_secs(10)).map(|_| ());
        }
        // A daemon the DVM launched is its controller's child to reap.
        wait_until(
            Duration::from_secs(10),
            Duration::from_millis(5),
            || match procs::stat(pid) {
                Some(st) if st.state != 'Z' => Err(format!("{host} (pid {pid}) still runs")),
                _ => Ok(()),
            },
        )
        .map_err(|e| format!("fault not verified: {e}"))
    }

    /// Stops the daemon on `host` dead (SIGSTOP to its process group): no FIN, no answer,
    /// while its kernel still accepts connections. Returns once the kernel shows it stopped.
    pub fn freeze(&mut self, host: &str) -> Result<(), String> {
        let pid = self.daemon_pid(host)?;
        if self.pid(host) == Some(pid) && !self.is_running(host) {
            return Err(format!("the daemon on {host} has exited"));
        }
        self.signal(host, Signal::SIGSTOP)?;
        self.wait_stopped(host, true)
    }

    /// Lets a frozen daemon run again; returns once the kernel shows it running.
    pub fn thaw(&mut self, host: &str) -> Result<(), String> {
        self.signal(host, Signal::SIGCONT)?;
        self.wait_stopped(host, false)
    }

    fn wait_stopped(&mut self, host: &str, stopped: bool) -> Result<(), String> {
        let pid = self.daemon_pid(host)?;
        if self.pid(host) == Some(pid) {
            if let Some(Ok(Some(st))) = self.procs.get_mut(host).map(|c| c.try_wait()) {
                return Err(format!("the daemon on {host} has exited ({st})"));
            }
        }
        wait_until(Duration::from_secs(5), Duration::from_millis(5), || {
            let state = procs::stat(pid)
                .ok_or_else(|| format!("{host} (pid {pid}) is gone"))?
                .state;
            if (state == 'T') == stopped {
                Ok(())
            } else {
                Err(format!("{host} (pid {pid}) is in state {state}"))
            }
        })
        .map_err(|e| format!("fault not verified: {e}"))
    }

    /// Cuts `host` off the network (its links go down on netns; it is disconnected from
    /// its networks on docker); `true` reconnects it.
    pub fn set_connected(&mut self, host: &str, connected: bool) -> Result<(), String> {
        let i = self.host(host)?.index;
        match self.world.as_ref() {
            Some(World::Netns(w)) => w
                .set_link(i, connected, self.spec.dual_homed)
                .map_err(|e| e.to_string()),
            Some(World::Docker(w)) => w.set_connected(i, connected),
            _ => Err("cutting a host off needs the netns or docker backend".into()),
        }
    }

    /// Waits for the daemon on `host` to exit and returns its status.
    pub fn wait_exit(&mut self, host: &str, within: Duration) -> Result<ExitStatus, String> {
        let child = self
            .procs
            .get_mut(host)
            .ok_or_else(|| format!("{host} was not started"))?;
        wait_until(within, Duration::from_millis(10), || {
            match child.try_wait() {
                Ok(Some(st)) => Ok(st),
                Ok(None) => Err(format!("{host} still running")),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    /// Runs `argv` on `host` to completion and returns its output.
    pub fn exec(&self, host: &str, argv: &[String]) -> Result<Output, String> {
        self.command(host, argv)?
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {argv:?} on {host}: {e}"))
    }

    /// Runs `argv` on `host`; kills it if it has not exited `within` (then the status is
    /// `None`). Output is returned either way (as text, invalid UTF-8 replaced).
    pub fn exec_within(
        &self,
        host: &str,
        argv: &[String],
        within: Duration,
    ) -> Result<(Option<ExitStatus>, String, String), String> {
        let (st, out, err) = self.exec_within_bytes(host, argv, within)?;
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok((st, text(out), text(err)))
    }

    /// [`Cluster::exec_within`], with stdout and stderr as the bytes written.
    pub fn exec_within_bytes(
        &self,
        host: &str,
        argv: &[String],
        within: Duration,
    ) -> Result<ExecBytes, String> {
        static EXECS: AtomicU32 = AtomicU32::new(0);
        let n = EXECS.fetch_add(1, Ordering::Relaxed);
        let out_path = self.dir.join(format!("exec-{n}.out"));
        let err_path = self.dir.join(format!("exec-{n}.err"));
        let file = |p: &Path| fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut cmd = self.command(host, argv)?;
        own_group_dying_with_us(&mut cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file(&out_path)?)
            .stderr(file(&err_path)?)
            .spawn()
            .map_err(|e| format!("running {argv:?} on {host}: {e}"))?;
        let status = wait_within(child, within)
            .map_err(|e| format!("waiting for {argv:?} on {host}: {e}"))?;
        let read = |p: &Path| fs::read(p).unwrap_or_default();
        Ok((status, read(&out_path), read(&err_path)))
    }

    /// The log of `host` so far.
    pub fn log(&self, host: &str) -> String {
        fs::read_to_string(self.log_path(host)).unwrap_or_default()
    }

    /// The last `lines` lines of every host's log that has one.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut s = format!(
            "==== cluster {} ({:?}, run dir {}) ====\n",
            self.spec.label,
            self.spec.backend,
            self.dir.display()
        );
        for h in &self.hosts {
            let text = self.log(&h.name);
            if text.is_empty() {
                continue;
            }
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            let _ = writeln!(
                s,
                "---- {} ({} lines, last {}) ----",
                h.name,
                all.len(),
                all.len() - from
            );
            for l in &all[from..] {
                let _ = writeln!(s, "{l}");
            }
        }
        s
    }

    fn teardown(&mut self) {
        // Relays first: they live in the switch namespace that goes next.
        self.faults = Default::default();
        for (_, mut c) in self.procs.drain() {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.kill();
            let _ = c.wait();
        }
        self.world = None;
    }

    /// Tears everything down now (also done on drop).
    pub fn destroy(mut self) {
        self.teardown();
    }

    /// Keeps the run directory (logs, configuration files) when the cluster is torn down:
    /// for a test that failed without panicking. Whoever keeps it removes it with
    /// [`rundir::remove_kept`] (it may be a tmpfs mount), or `dvmlab-harness gc` does.
    pub fn keep_run_dir(&mut self) {
        self.keep = true;
    }

    /// The daemon command every later start runs (one that names the run directory, which
    /// exists only once the cluster does).
    pub fn set_daemon(&mut self, argv: Vec<String>) {
        self.spec.daemon = argv;
    }

    /// The daemon command a start runs.
    pub fn daemon(&self) -> &[String] {
        &self.spec.daemon
    }

    /// The log file of `host` (it exists once the daemon was started there).
    pub fn log_file(&self, host: &str) -> PathBuf {
        self.log_path(host)
    }

    /// The run's name (the prefix of its namespaces).
    pub fn run_name(&self) -> &str {
        &self.run
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            eprintln!("{}", self.logs_tail(40));
        }
        self.teardown();
        if failed {
            let tmpfs = if self.tmpfs {
                " (a tmpfs: whoever kept it, or `dvmlab-harness gc`, unmounts and removes it)"
            } else {
                ""
            };
            eprintln!("run directory kept: {}{tmpfs}", self.dir.display());
        } else if !self.keep {
            rundir::remove(&self.dir, self.tmpfs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_own_group(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_command_that_ends_in_time_gives_its_status() {
        let st = wait_within(in_own_group("exit 3"), Duration::from_secs(30)).unwrap();
        assert_eq!(st.and_then(|s| s.code()), Some(3));
    }

    #[test]
    fn a_command_past_its_time_is_killed_with_its_group_and_gives_none() {
        let child = in_own_group("sleep 120 & wait");
        let group = child.id() as i32;
        let t = std::time::Instant::now();
        let st = wait_within(child, Duration::from_millis(300)).unwrap();
        assert_eq!(st, None);
        // Not a speed check: without the kill it would wait the sleep out.
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the group was not killed"
        );
        // The group is gone: signal 0 to it finds nobody (its leader was reaped).
        wait_until(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || match killpg(Pid::from_raw(group), None) {
                Err(nix::errno::Errno::ESRCH) => Ok(()),
                other => Err(format!("group {group} still there: {other:?}")),
            },
        )
        .unwrap();
    }
}
