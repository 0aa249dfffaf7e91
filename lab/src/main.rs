//! `lab`: a cluster of the runtime in Docker containers, to look at, break and run jobs on.

mod docker;
mod export;
mod image;
mod netns;
mod partition;
mod plan;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use docker::{DockerLab, Stream};
use plan::{IpVersion, Plan, CONTROLLER};

/// A cluster of the runtime in Docker containers: a controller `ctl` and nodes node01…,
/// each running the identical `prted --bootstrap` with one prte.conf mounted read-only, on
/// a dual-stack network of their own (10.210.0.0/16, fd00:210::/64). Without a Docker
/// engine (or with `up --backend netns`) the same lab runs on netns hosts, kept by a
/// background process, and every command below works on it the same way.
///
///   lab image                 build the image (FROM scratch, static binaries)
///   lab up --nodes 32         start the lab and wait for `DVM ready`
///   lab status [--json]       the DVM as the controller sees it
///   lab run -- hostname       a job on every node
///   lab kill node07           break things: kill | freeze | thaw | restart NODE,
///   lab partition A B         partition A B / heal, late-boot NODE
///   lab logs node07           what a daemon wrote
///   lab down                  remove every container, the network and the image
///
/// Exit status: 0 on success; 1 when the lab or Docker refuses; 2 for a usage error; a job's
/// own status for `run`.
#[derive(Parser, Debug)]
#[command(name = "lab", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Build the lab image from static runtime binaries and a static busybox.
    Image {
        /// Directory with statically linked prted, pctl and prun (`make lab-bins`).
        #[arg(long, default_value = "target/static/x86_64-unknown-linux-gnu/release")]
        bin_dir: PathBuf,
        /// A statically linked busybox (Debian: busybox-static).
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
    },
    /// Start the lab and wait until the DVM is ready; print its status table.
    Up {
        #[command(flatten)]
        plan: PlanArgs,
        /// Where the lab runs: Docker containers, netns hosts, or (auto) containers when a
        /// Docker engine answers, else netns hosts.
        #[arg(long, value_enum, default_value_t = Backend::Auto)]
        backend: Backend,
        /// netns hosts: directory of prted, pctl and prun (default: this program's).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Nodes to create but not start, for `late-boot` (comma separated).
        #[arg(long, value_delimiter = ',')]
        hold: Vec<String>,
        /// Seconds to wait for the DVM.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Remove every container, the network and the image tag the lab made.
    Down,
    /// The DVM's status, from the controller (`pctl status`), and each container's state.
    Status {
        /// pctl's JSON status, as documented in runtime/README.md.
        #[arg(long)]
        json: bool,
    },
    /// Run a job on the lab (`prun` on the controller): output and exit status are the job's.
    Run {
        /// prun's options and the command, after `--`.
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// SIGKILL a node's daemon: its container stops, as a crashed node.
    Kill { node: String },
    /// Freeze every process of a node (no answer, no FIN).
    Freeze { node: String },
    /// Thaw a frozen node.
    Thaw { node: String },
    /// Stop a node (SIGTERM) and start it again; starts a killed one.
    Restart { node: String },
    /// Start a node held back by `up --hold`.
    LateBoot { node: String },
    /// Cut two sets of hosts (comma separated) from each other, both ways.
    Partition { a: String, b: String },
    /// Remove every partition.
    Heal,
    /// Write the same cluster for Kubernetes (a StatefulSet per role behind a headless
    /// Service, prte.conf in a ConfigMap) or compose (with its prte.conf), into --out.
    Export {
        #[arg(long, required_unless_present = "compose", conflicts_with = "compose")]
        k8s: bool,
        #[arg(long)]
        compose: bool,
        #[command(flatten)]
        plan: PlanArgs,
        /// Kubernetes namespace the pods' DNS search list names.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Directory to write into.
        #[arg(long, short, default_value = "target/lab-export")]
        out: PathBuf,
    },
    /// (internal) Keep a netns lab: started in the background by `up`.
    #[command(hide = true)]
    Keep {
        #[command(flatten)]
        plan: PlanArgs,
        #[arg(long, value_delimiter = ',')]
        hold: Vec<String>,
        #[arg(long)]
        bin_dir: PathBuf,
    },
    /// Print what a host's daemon wrote.
    Logs {
        host: String,
        /// Keep printing as it writes.
        #[arg(long, short)]
        follow: bool,
    },
}

/// Where `up` puts the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Backend {
    Auto,
    Docker,
    Netns,
}

/// The size and shape of a lab.
#[derive(clap::Args, Debug)]
struct PlanArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 32)]
    nodes: usize,
    /// DVMRadix of the routing tree.
    #[arg(long, default_value_t = 64)]
    radix: u32,
    /// IP version the daemons use: 4 or 6 (the network is dual-stack either way).
    #[arg(long, default_value = "4")]
    ip: String,
}

impl PlanArgs {
    fn plan(&self) -> Result<Plan, Failure> {
        let ip = IpVersion::parse(&self.ip).map_err(|e| Failure(2, e))?;
        Plan::new(self.nodes, self.radix, ip).map_err(|e| Failure(2, e))
    }
}

/// An error and the exit status it calls for.
struct Failure(u8, String);

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure(1, s)
    }
}

impl From<&str> for Failure {
    fn from(s: &str) -> Failure {
        Failure(1, s.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lab: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(Failure(code, msg)) => {
            eprintln!("lab: {msg}");
            ExitCode::from(code)
        }
    }
}

async fn connect() -> Result<DockerLab, Failure> {
    DockerLab::connect().await.map_err(|e| {
        Failure(
            1,
            format!("{e}\n(the lab needs a Docker engine; on netns hosts use `make demo`)"),
        )
    })
}

/// The plan of the lab that is up, or an error saying there is none.
async fn current(lab: &DockerLab) -> Result<Plan, Failure> {
    lab.plan()
        .await?
        .ok_or_else(|| Failure(1, "no lab is up (`lab up` or `make lab`)".into()))
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    if netns::Keeper::find().is_some() {
        if let Some(code) = on_netns(&cli.command).await? {
            return Ok(code);
        }
    }
    match cli.command {
        Cmd::Image { bin_dir, busybox } => {
            let ctx = image::context(&image::Sources { bin_dir, busybox })?;
            let lab = connect().await?;
            let t = Instant::now();
            lab.build_image(ctx).await?;
            dvmlab_host::outln!(
                "built {} in {:.1} s",
                image::IMAGE,
                t.elapsed().as_secs_f64()
            );
            Ok(0)
        }
        Cmd::Keep {
            plan,
            hold,
            bin_dir,
        } => {
            netns::keep(&plan.plan()?, &hold, &bin_dir)?;
            Ok(0)
        }
        Cmd::Up {
            plan,
            backend,
            bin_dir,
            hold,
            timeout,
        } => {
            let plan = plan.plan()?;
            let lab = match backend {
                Backend::Netns => None,
                Backend::Docker => Some(connect().await?),
                Backend::Auto => match DockerLab::connect().await {
                    Ok(l) => Some(l),
                    Err(e) => {
                        eprintln!(
                            "lab: no Docker engine ({e}): the lab runs on netns hosts instead"
                        );
                        None
                    }
                },
            };
            let Some(lab) = lab else {
                return netns_up(&plan, &hold, bin_dir, Duration::from_secs(timeout)).await;
            };
            if !lab.image_exists().await {
                return Err(Failure(
                    1,
                    format!("no image {} (`make lab` builds it)", image::IMAGE),
                ));
            }
            up(&lab, &plan, &hold, Duration::from_secs(timeout)).await
        }
        Cmd::Down => {
            let lab = connect().await?;
            let healed = partition::heal().unwrap_or(false);
            let removed = lab.down().await?;
            if healed {
                dvmlab_host::outln!("removed partition rules");
            }
            if removed.is_empty() {
                dvmlab_host::outln!("no lab was up");
            }
            for r in removed {
                dvmlab_host::outln!("removed {r}");
            }
            Ok(0)
        }
        Cmd::Status { json } => {
            let lab = connect().await?;
            let plan = current(&lab).await?;
            let mut argv = vec!["pctl".to_string(), "status".to_string()];
            if json {
                argv.push("--json".into());
            }
            let o = lab.exec(CONTROLLER, &argv).await?;
            dvmlab_host::stdout::bytes(o.stdout.as_bytes());
            eprint!("{}", o.stderr);
            if !json {
                let mut down = Vec::new();
                for h in plan.hosts() {
                    if !lab.running(&h.name).await? {
                        down.push(h.name);
                    }
                }
                if !down.is_empty() {
                    dvmlab_host::outln!("containers not running: {}", down.join(", "));
                }
            }
            Ok(if o.code == 0 { 0 } else { 1 })
        }
        Cmd::Run { argv } => {
            let lab = connect().await?;
            current(&lab).await?;
            let mut full = vec!["prun".to_string()];
            full.extend(argv);
            let code = lab
                .exec_with(CONTROLLER, &full, |s, bytes| {
                    use std::io::Write;
                    match s {
                        Stream::Out => dvmlab_host::stdout::bytes(bytes),
                        Stream::Err => {
                            let _ = std::io::stderr().write_all(bytes);
                        }
                    }
                })
                .await?;
            Ok(u8::try_from(code).unwrap_or(1))
        }
        Cmd::Kill { node } => act(&node, "killed", |l, n| Box::pin(l.kill(n))).await,
        Cmd::Freeze { node } => act(&node, "frozen", |l, n| Box::pin(l.freeze(n))).await,
        Cmd::Thaw { node } => act(&node, "thawed", |l, n| Box::pin(l.thaw(n))).await,
        Cmd::Restart { node } => {
            let lab = connect().await?;
            current(&lab).await?.host(&node)?;
            if lab.running(&node).await? {
                lab.restart(&node).await?;
            } else {
                lab.start(&node).await?;
            }
            dvmlab_host::outln!("{node}: restarted");
            Ok(0)
        }
        Cmd::LateBoot { node } => {
            let lab = connect().await?;
            current(&lab).await?.host(&node)?;
            if lab.running(&node).await? {
                return Err(Failure(1, format!("{node} is already running")));
            }
            lab.start(&node).await?;
            dvmlab_host::outln!("{node}: booted");
            Ok(0)
        }
        Cmd::Partition { a, b } => {
            let lab = connect().await?;
            let plan = current(&lab).await?;
            let side = |s: &str| -> Result<Vec<plan::Host>, Failure> {
                s.split(',')
                    .filter(|n| !n.is_empty())
                    .map(|n| plan.host(n).map_err(|e| Failure(2, e)))
                    .collect()
            };
            let (sa, sb) = (side(&a)?, side(&b)?);
            if sa.is_empty() || sb.is_empty() {
                return Err(Failure(2, "partition A B: both sides need a host".into()));
            }
            partition::partition(&sa, &sb)?;
            dvmlab_host::outln!("partitioned {a} from {b}");
            Ok(0)
        }
        Cmd::Heal => {
            if partition::heal()? {
                dvmlab_host::outln!("healed");
            } else {
                dvmlab_host::outln!("no partition");
            }
            Ok(0)
        }
        Cmd::Export {
            k8s,
            compose: _,
            plan,
            namespace,
            out,
        } => {
            let plan = plan.plan()?;
            let files = if k8s {
                vec![("dvmlab-lab.k8s.yaml", export::k8s(&plan, &namespace)?)]
            } else {
                vec![
                    ("compose.yaml", export::compose(&plan)?),
                    ("prte.conf", plan.prte_conf()),
                ]
            };
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            for (name, text) in files {
                let path = out.join(name);
                std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
                dvmlab_host::outln!("wrote {}", path.display());
            }
            Ok(0)
        }
        Cmd::Logs { host, follow } => {
            let lab = connect().await?;
            current(&lab).await?.host(&host)?;
            lab.logs(&host, follow).await?;
            Ok(0)
        }
    }
}

/// A command on the netns lab that is up; `None` for commands that do not act on a lab.
async fn on_netns(cmd: &Cmd) -> Result<Option<u8>, Failure> {
    let act = |op: &str, node: &str, what: &str| -> Result<Option<u8>, Failure> {
        netns::ask(serde_json::json!({"op": op, "host": node}))?;
        dvmlab_host::outln!("{node}: {what}");
        Ok(Some(0))
    };
    match cmd {
        Cmd::Image { .. } | Cmd::Export { .. } | Cmd::Keep { .. } => Ok(None),
        Cmd::Up { .. } => Err(Failure(
            1,
            "a lab is already up on netns hosts; `lab down` first".into(),
        )),
        Cmd::Down => {
            let n = hosts_state()?.len();
            let v = netns::ask(serde_json::json!({"op": "down"}))?;
            let pid = v["pid"].as_u64().unwrap_or(0) as u32;
            netns::wait_gone(pid)?;
            dvmlab_host::outln!("removed the netns lab ({n} hosts, their namespaces and logs)");
            Ok(Some(0))
        }
        Cmd::Status { json } => {
            let mut argv = vec!["pctl".to_string(), "status".to_string()];
            if *json {
                argv.push("--json".into());
            }
            let code = netns::Keeper::find()
                .ok_or("the netns lab went away")?
                .exec(CONTROLLER, &argv)?;
            if !json {
                let down: Vec<String> = hosts_state()?
                    .into_iter()
                    .filter(|(_, s)| s != "running")
                    .map(|(h, s)| format!("{h} ({s})"))
                    .collect();
                if !down.is_empty() {
                    dvmlab_host::outln!("daemons not running: {}", down.join(", "));
                }
            }
            Ok(Some(if code == 0 { 0 } else { 1 }))
        }
        Cmd::Run { argv } => {
            let mut full = vec!["prun".to_string()];
            full.extend(argv.iter().cloned());
            let code = netns::Keeper::find()
                .ok_or("the netns lab went away")?
                .exec(CONTROLLER, &full)?;
            Ok(Some(u8::try_from(code).unwrap_or(1)))
        }
        Cmd::Kill { node } => act("kill", node, "killed"),
        Cmd::Freeze { node } => act("freeze", node, "frozen"),
        Cmd::Thaw { node } => act("thaw", node, "thawed"),
        Cmd::Restart { node } => act("restart", node, "restarted"),
        Cmd::LateBoot { node } => act("late-boot", node, "booted"),
        Cmd::Partition { a, b } => {
            let side = |s: &str| -> Vec<String> {
                s.split(',')
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect()
            };
            if side(a).is_empty() || side(b).is_empty() {
                return Err(Failure(2, "partition A B: both sides need a host".into()));
            }
            netns::ask(serde_json::json!({"op": "partition", "a": side(a), "b": side(b)}))?;
            dvmlab_host::outln!("partitioned {a} from {b}");
            Ok(Some(0))
        }
        Cmd::Heal => {
            netns::ask(serde_json::json!({"op": "heal"}))?;
            dvmlab_host::outln!("healed");
            Ok(Some(0))
        }
        Cmd::Logs { host, follow } => {
            let v = netns::ask(serde_json::json!({"op": "hosts"}))?;
            let path = v["hosts"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|h| h["host"].as_str() == Some(host.as_str()))
                .and_then(|h| h["log"].as_str().map(PathBuf::from))
                .ok_or_else(|| Failure(1, format!("no host {host} in this lab")))?;
            netns::print_log(&path, *follow)?;
            Ok(Some(0))
        }
    }
}

/// Every host of the netns lab with its daemon's state.
fn hosts_state() -> Result<Vec<(String, String)>, String> {
    let v = netns::ask(serde_json::json!({"op": "hosts"}))?;
    Ok(v["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["host"].as_str().unwrap_or_default().to_string(),
                h["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// `up` on netns hosts: a keeper in the background, then the same wait and table.
async fn netns_up(
    plan: &Plan,
    hold: &[String],
    bin_dir: Option<PathBuf>,
    timeout: Duration,
) -> Result<u8, Failure> {
    if !netns::available() {
        return Err(Failure(
            1,
            "the lab needs a Docker engine or, without one, root for network namespaces".into(),
        ));
    }
    let bin = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(PathBuf::from))
            .ok_or("cannot find this program's directory")?,
    };
    let t = Instant::now();
    eprintln!(
        "lab: starting {} hosts on netns hosts",
        plan.hosts().len() - hold.len()
    );
    netns::spawn_keeper(plan, hold, &bin)?;
    let expect = plan.hosts().len() - hold.len();
    let argv = ["pctl", "status", "--json"].map(String::from);
    loop {
        let last;
        match netns::output(CONTROLLER, &argv) {
            Ok((0, out, _)) => match serde_json::from_str::<serde_json::Value>(&out) {
                Ok(s) if s["joined"].as_u64().unwrap_or(0) as usize >= expect => break,
                Ok(s) => last = format!("{} of {expect} daemons joined", s["joined"]),
                Err(e) => last = format!("status is not JSON: {e}"),
            },
            Ok((_, _, err)) => last = err.trim().to_string(),
            Err(e) => last = e,
        }
        if t.elapsed() > timeout {
            return Err(Failure(
                1,
                format!("the DVM did not form within {timeout:?}: {last} (see `lab logs ctl`)"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dvmlab_host::outln!(
        "lab up on netns hosts: {expect} of {} daemons joined in {:.1} s{}",
        plan.hosts().len(),
        t.elapsed().as_secs_f64(),
        if hold.is_empty() {
            String::new()
        } else {
            format!("; held for late-boot: {}", hold.join(", "))
        }
    );
    let (_, table, _) = netns::output(CONTROLLER, &["pctl".to_string(), "status".to_string()])?;
    dvmlab_host::stdout::bytes(table.as_bytes());
    Ok(0)
}

type Act<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;

/// One fault on one node of the lab that is up.
async fn act(
    node: &str,
    done: &str,
    f: impl for<'a> FnOnce(&'a DockerLab, &'a str) -> Act<'a>,
) -> Result<u8, Failure> {
    let lab = connect().await?;
    current(&lab).await?.host(node)?;
    f(&lab, node).await?;
    dvmlab_host::outln!("{node}: {done}");
    Ok(0)
}

async fn up(
    lab: &DockerLab,
    plan: &Plan,
    hold: &[String],
    timeout: Duration,
) -> Result<u8, Failure> {
    let t = Instant::now();
    let hosts = plan.hosts().len() - hold.len();
    let bar = ProgressBar::new(hosts as u64 * 2);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:40} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("starting containers");
    lab.create(plan, hold, |h| {
        bar.inc(1);
        bar.set_message(format!("started {h}"));
    })
    .await?;
    bar.set_message("waiting for DVM ready");
    let expect = hosts;
    let status = lab
        .wait_ready(expect, timeout, |joined| {
            bar.set_position((hosts + joined) as u64);
        })
        .await;
    bar.finish_and_clear();
    let status = status?;
    dvmlab_host::outln!(
        "lab up: {} of {} daemons joined in {:.1} s (formed: {}){}",
        status["joined"],
        plan.hosts().len(),
        t.elapsed().as_secs_f64(),
        status["formed"],
        if hold.is_empty() {
            String::new()
        } else {
            format!("; held for late-boot: {}", hold.join(", "))
        }
    );
    let table = lab
        .exec(CONTROLLER, &["pctl".to_string(), "status".to_string()])
        .await?;
    dvmlab_host::stdout::bytes(table.stdout.as_bytes());
    Ok(0)
}
