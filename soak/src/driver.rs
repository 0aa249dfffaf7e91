//! The soak's driver: an elastic DVM on harness hosts, the shared state the workload,
//! nemesis and observer threads work from, and running one command on a host with a
//! deadline. It knows the runtime only by its command lines and their JSON.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dvmlab_harness::{BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};

use crate::history::Writer;

/// The soak's knobs.
#[derive(Debug, Clone)]
pub struct Config {
    pub nodes: usize,
    pub spares: usize,
    pub radix: u32,
    pub duration: Duration,
    pub seed: u64,
    pub backend: BackendKind,
    /// Where the history, report, charts and logs go.
    pub out: PathBuf,
    /// A defect to give the runtime on purpose (`dvmlab_test_elastic_fault`), to show the
    /// checker catching it.
    pub runtime_fault: Option<String>,
}

/// What the threads share.
pub struct Ctx {
    pub cluster: Mutex<Cluster>,
    pub hist: Writer,
    /// The runtime's binaries (prted, pctl, prun, pevent, palloc).
    pub bins: PathBuf,
    pub ctl: String,
    pub initial: Vec<String>,
    pub spares: Vec<String>,
    /// Set in every job's environment (`DVMLAB_SOAK`), so that a job process left behind
    /// is found by it.
    pub run_tag: String,
    pub seed: u64,
    /// When the workload and nemesis stop and the final heal begins.
    pub deadline: Instant,
    pub stop: AtomicBool,
    next_op: AtomicU64,
    pub world: Mutex<World>,
}

/// What the workload and nemesis believe, to choose targets that make sense (never what
/// the checker judges by).
#[derive(Debug, Default)]
pub struct World {
    /// Hosts in the DVM, the controller apart, as the last status read showed them joined.
    pub joined: BTreeSet<String>,
    /// Hosts a grow or shrink of the workload, or a fault of the nemesis, is working on.
    pub busy: BTreeSet<String>,
    /// Hosts whose daemon a grow launched (the nemesis kills only daemons it can start
    /// again the way they were started).
    pub launched: BTreeSet<String>,
    /// Each job tag's id and state, as the last jobs read showed them.
    pub jobs: HashMap<String, (u64, String)>,
    /// Hosts running processes of a live job, as the last jobs read showed.
    pub running_on: BTreeSet<String>,
}

impl World {
    /// Joined hosts nobody is working on.
    pub fn free_joined(&self) -> Vec<String> {
        self.joined
            .iter()
            .filter(|h| !self.busy.contains(*h))
            .cloned()
            .collect()
    }

    /// Hosts of the soak's spares and `DVMNodes` that are out of the DVM and that nobody is
    /// working on: what a grow may take.
    pub fn free_outside(&self, ctx: &Ctx) -> Vec<String> {
        ctx.spares
            .iter()
            .chain(&ctx.initial)
            .filter(|h| !self.joined.contains(*h) && !self.busy.contains(*h))
            .cloned()
            .collect()
    }
}

/// The soak's daemon command line.
fn daemon_argv(bins: &Path, agent: &Path, fault: Option<&str>) -> Vec<String> {
    let mut argv = vec![
        bins.join("prted").display().to_string(),
        "--bootstrap".into(),
    ];
    for (k, v) in [
        ("prte_elastic_mode", "1"),
        ("plm_ssh_agent", &agent.display().to_string()),
        ("dvmlab_launch_timeout", "20"),
        ("state_base_verbose", "1"),
        ("odls_base_verbose", "1"),
    ] {
        argv.extend(["--prtemca".into(), k.into(), v.to_string()]);
    }
    if let Some(f) = fault {
        argv.extend([
            "--prtemca".into(),
            "dvmlab_test_elastic_fault".into(),
            f.to_string(),
        ]);
    }
    argv
}

impl Ctx {
    /// Builds the cluster (`ctl`, `n01…`, spares `s01…`), starts the DVM's daemons and
    /// waits for it to form.
    pub fn start(cfg: &Config, hist: Writer) -> Result<Ctx, String> {
        let (bins, _) = dvmlab_harness::agent::build_dir()?;
        for b in [
            "prted",
            "pctl",
            "prun",
            "pevent",
            "palloc",
            "dvmlab-harness",
        ] {
            if !bins.join(b).exists() {
                return Err(format!(
                    "{} is missing: build the runtime's and harness's binaries first (make soak does)",
                    bins.join(b).display()
                ));
            }
        }
        let ctl = "ctl".to_string();
        let initial: Vec<String> = (1..=cfg.nodes).map(|i| format!("n{i:02}")).collect();
        let spares: Vec<String> = (1..=cfg.spares).map(|i| format!("s{i:02}")).collect();
        let mut hosts = vec![ctl.clone()];
        hosts.extend(initial.iter().cloned());
        hosts.extend(spares.iter().cloned());
        let conf = PrteConf::new()
            .set("DVMNodes", format!("n[2:1-{}]", cfg.nodes))
            .set("DVMControllerHost", &ctl)
            .set("DVMRadix", cfg.radix)
            .set("PRTEDLogProcState", "true");
        let mut spec = ClusterSpec::new("soak", &hosts, Vec::new());
        spec.backend = cfg.backend;
        spec.ip = IpMode::V4;
        spec.conf = conf.render();
        spec.env
            .push(("PRTE_MCA_dvmlab_dvm_key_file".into(), "{key}".into()));
        let mut cluster = Cluster::new(spec)?;
        let agent = cluster.write_agent(&bins.join("dvmlab-harness"))?;
        let agent = dvmlab_harness::agent::write_failable(cluster.run_dir(), &agent)?;
        cluster.set_daemon(daemon_argv(&bins, &agent, cfg.runtime_fault.as_deref()));
        let mut first = vec![ctl.clone()];
        first.extend(initial.iter().cloned());
        cluster.start_many(&first)?;
        let ctx = Ctx {
            cluster: Mutex::new(cluster),
            hist,
            bins,
            ctl,
            initial,
            spares,
            run_tag: format!("soak-{}-{}", std::process::id(), cfg.seed),
            seed: cfg.seed,
            deadline: Instant::now(),
            stop: AtomicBool::new(false),
            next_op: AtomicU64::new(1),
            world: Mutex::new(World::default()),
        };
        dvmlab_harness::wait_until(Duration::from_secs(120), Duration::from_millis(200), || {
            match ctx.status() {
                Some(s) if s["formed"] == true => Ok(()),
                s => Err(format!("the DVM has not formed: {s:?}")),
            }
        })?;
        Ok(Ctx {
            deadline: Instant::now() + cfg.duration,
            ..ctx
        })
    }

    pub fn op_id(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn bin(&self, name: &str) -> String {
        self.bins.join(name).display().to_string()
    }

    /// The command `argv` on `host`, its output piped.
    pub fn command(&self, host: &str, argv: &[String]) -> Result<Command, String> {
        let cluster = self.cluster.lock().map_err(|_| "cluster lock poisoned")?;
        let mut cmd = cluster.command(host, argv)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        Ok(cmd)
    }

    /// Runs `argv` on `host` for at most `within`: its exit code (`None` if it had to be
    /// killed, or died of a signal) and its output lines.
    pub fn run(&self, host: &str, argv: &[String], within: Duration) -> Outcome {
        match self.command(host, argv) {
            Ok(cmd) => run_command(cmd, within, |_| {}),
            Err(e) => Outcome {
                exit: None,
                out: Vec::new(),
                err: vec![e],
            },
        }
    }

    /// `pctl status --json` on the controller's host.
    pub fn status(&self) -> Option<serde_json::Value> {
        self.pctl_json("status")
    }

    /// `pctl jobs --json` on the controller's host.
    pub fn jobs(&self) -> Option<Vec<serde_json::Value>> {
        self.pctl_json("jobs")
    }

    /// `pctl WHAT --json` on the controller's host, parsed; `None` if it failed.
    fn pctl_json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Option<T> {
        let argv = [
            self.bin("pctl"),
            what.into(),
            "--json".into(),
            "--timeout".into(),
            "3".into(),
        ];
        let o = self.run(&self.ctl, &argv, Duration::from_secs(10));
        (o.exit == Some(0))
            .then(|| serde_json::from_str(&o.out.join("\n")).ok())
            .flatten()
    }
}

/// What a command did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub exit: Option<i32>,
    pub out: Vec<String>,
    pub err: Vec<String>,
}

/// Runs `cmd` (output piped), calling `on_line` with each stdout line as it comes, for at
/// most `within` (then its process group is killed).
pub fn run_command(mut cmd: Command, within: Duration, on_line: impl FnMut(&str)) -> Outcome {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome {
                exit: None,
                out: Vec::new(),
                err: vec![format!("spawn {cmd:?}: {e}")],
            }
        }
    };
    let pid = child.id() as i32;
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + within;
    let stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out_reader = std::thread::spawn(move || {
        use std::io::BufRead;
        if let Some(o) = stdout {
            for line in std::io::BufReader::new(o).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    let mut out = Vec::new();
    let mut on_line = on_line;
    let mut killed = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                on_line(&line);
                out.push(line);
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() >= deadline && !killed {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed = true;
        }
    }
    let _ = out_reader.join();
    let status = child.wait().ok();
    let err = err_reader.join().unwrap_or_default();
    Outcome {
        exit: if killed {
            None
        } else {
            status.and_then(|s| s.code())
        },
        out,
        err: err
            .lines()
            .map(str::to_string)
            .chain(killed.then(|| crate::history::NEVER_RETURNED.to_string()))
            .collect(),
    }
}
