//! `lab`: a cluster of the runtime in Docker containers, to look at, break and run jobs on.

mod export;
mod image;
mod keeper;
mod plan;
mod swarm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use dvmlab_harness::BackendKind;
use indicatif::{ProgressBar, ProgressStyle};

use keeper::NO_LAB;
use plan::{IpVersion, Plan, CONTROLLER};

/// A cluster of the runtime in Docker containers: a controller `ctl` and nodes node01…,
/// each running the identical `prted --bootstrap` with one prte.conf, on dual-stack networks
/// of their own. The hosts are the harness's (its docker backend; without a Docker engine,
/// or with `up --backend netns`, its netns backend), kept by a background process that every
/// command below talks to, so they work the same way on both.
///
///   lab up --nodes 32         start the lab and wait for every daemon to join
///   lab status [--json]       the DVM as the controller sees it, campaigns, parked jobs
///   lab run -- hostname       a job on every node
///   lab up --spares 4         ... with spare hosts the (elastic) DVM can grow onto:
///   lab grow 2                daemons on the next two spares (pctl grow)
///   lab shrink node03         take daemons out (pctl shrink)
///   lab alloc new --host spare01   an allocation request (palloc): both phases
///   lab kill node07           break things: kill | freeze | thaw | restart NODE,
///   lab partition A B         partition A B / heal, late-boot NODE
///   lab logs node07           what a daemon wrote
///   lab down                  remove every container, network and namespace the lab made
///   lab export --k8s          the same cluster for another orchestrator (--compose, --swarm)
///   lab image                 the FROM-scratch image the exports run (static binaries)
///   lab up --swarm            the lab as a stack on Docker's swarm mode (the image above);
///                             the same commands then act on its tasks; lab down removes it
///   lab image --push REG      the image for a swarm of several machines
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
    /// Build the image the exports run, from static runtime binaries and a static busybox.
    Image {
        /// Directory with statically linked prted, pctl and prun (`make lab-bins`).
        #[arg(long, default_value = "target/static/x86_64-unknown-linux-gnu/release")]
        bin_dir: PathBuf,
        /// A statically linked busybox (Debian: busybox-static).
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
        /// Remove the image instead.
        #[arg(long)]
        remove: bool,
        /// Push the built image to this registry (host[:port]) as REGISTRY/TAG, for a swarm
        /// of several machines; `lab up --swarm --image` that name.
        #[arg(long, value_name = "REGISTRY", conflicts_with = "remove")]
        push: Option<String>,
        /// The image's name and tag.
        #[arg(long, default_value = image::IMAGE)]
        tag: String,
    },
    /// Start the lab and wait until the DVM is ready; print its status table.
    Up {
        #[command(flatten)]
        plan: PlanArgs,
        /// Where the lab runs: Docker containers, netns hosts, or (auto) containers when a
        /// Docker engine answers, else netns hosts.
        #[arg(long, value_enum, default_value_t = Backend::Auto)]
        backend: Backend,
        /// Directory of prted, pctl and prun (default: this program's).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Nodes to create but not start, for `late-boot` (comma separated).
        #[arg(long, value_delimiter = ',')]
        hold: Vec<String>,
        /// Spare hosts spare01…: created, not in DVMNodes, for `lab grow` and `lab alloc`.
        #[arg(long, default_value_t = 0)]
        spares: usize,
        /// Seconds to wait for the DVM.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Deploy the lab as a stack on this engine's swarm (a manager's): one service per
        /// host on an overlay network, prte.conf a config, the key a secret. Runs --image.
        #[arg(long, conflicts_with_all = ["backend", "bin_dir"])]
        swarm: bool,
        /// The image the swarm's tasks run (`make lab-image` builds the default here).
        #[arg(long, default_value = image::IMAGE, requires = "swarm")]
        image: String,
        /// The swarm stack's name (its services are STACK_ctl, STACK_node01, ...).
        #[arg(long, default_value = swarm::STACK, requires = "swarm")]
        stack: String,
    },
    /// Remove every host the lab made (containers, networks, namespaces, or the swarm
    /// stack), its partition rules and logs, and stop its keeper.
    Down {
        /// Only a swarm lab (`up --swarm`).
        #[arg(long)]
        swarm: bool,
    },
    /// The DVM's status, from the controller (`pctl status`), and each daemon's state.
    Status {
        /// pctl's JSON status, as documented in runtime/README.md.
        #[arg(long)]
        json: bool,
    },
    /// Grow the DVM onto spares (`pctl grow --wait` on the controller): daemons started
    /// there by the controller's launch agent; returns once they are wired in.
    Grow {
        /// How many of the spares not in the DVM to take, in order.
        #[arg(default_value_t = 1, conflicts_with = "host")]
        count: usize,
        /// These hosts instead (comma separated).
        #[arg(long, value_delimiter = ',')]
        host: Vec<String>,
    },
    /// Shrink the DVM (`pctl shrink --wait`): the daemons on these hosts leave; returns
    /// once they are gone.
    Shrink {
        #[arg(required = true, value_delimiter = ',')]
        nodes: Vec<String>,
    },
    /// An allocation request as a tool makes it (`palloc` on the controller): `new` or
    /// `extend` with `--host`, `release` with `--host` or `--alloc-id`; prints the answer,
    /// then the terminal event (exit 0 only on PMIX_DVM_IS_READY). `--json` for JSON lines.
    Alloc {
        /// palloc's directive and options.
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// Run a job on the lab (`prun` on the controller): output and exit status are the job's.
    Run {
        /// prun's options and the command, after `--`.
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// SIGKILL a node's daemon, as a crashed node.
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
    /// Service, prte.conf in a ConfigMap), compose (with its prte.conf) or a swarm stack
    /// (`docker stack deploy -c stack.yml NAME` in --out), into --out.
    Export {
        #[arg(long, required_unless_present_any = ["compose", "swarm"], conflicts_with_all = ["compose", "swarm"])]
        k8s: bool,
        #[arg(long, conflicts_with = "swarm")]
        compose: bool,
        #[arg(long)]
        swarm: bool,
        /// The image the swarm stack's tasks run.
        #[arg(long, default_value = image::IMAGE)]
        image: String,
        /// Spare hosts spare01… in the swarm stack, for the DVM to grow onto.
        #[arg(long, default_value_t = 0, requires = "swarm")]
        spares: usize,
        #[command(flatten)]
        plan: PlanArgs,
        /// Kubernetes namespace the pods' DNS search list names.
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Directory to write into.
        #[arg(long, short, default_value = "target/lab-export")]
        out: PathBuf,
    },
    /// (internal) Keep a lab: started in the background by `up`.
    #[command(hide = true)]
    Keep {
        #[command(flatten)]
        plan: PlanArgs,
        #[arg(long, value_delimiter = ',')]
        hold: Vec<String>,
        #[arg(long, default_value_t = 0)]
        spares: usize,
        #[arg(long)]
        bin_dir: PathBuf,
        #[arg(long, value_enum)]
        backend: Backend,
    },
    /// (internal) The launch agent the keeper writes for the controller: run COMMAND on
    /// HOST of the lab, as `ssh HOST COMMAND` would.
    #[command(hide = true)]
    Agent(dvmlab_harness::agent::AgentArgs),
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

impl Backend {
    /// The harness backend: `auto` is docker when an engine answers, else netns. Both need
    /// root (processes enter the hosts' namespaces).
    fn kind(self) -> Result<BackendKind, Failure> {
        if !dvmlab_harness::netns_available() {
            return Err(Failure(
                1,
                "the lab needs root: its processes enter the hosts' namespaces".into(),
            ));
        }
        Ok(match self {
            Backend::Docker => {
                dvmlab_harness::docker::Engine::connect().map_err(|e| {
                    Failure(
                        1,
                        format!("{e}\n(without Docker: `lab up --backend netns`)"),
                    )
                })?;
                BackendKind::Docker
            }
            Backend::Netns => BackendKind::Netns,
            Backend::Auto => match dvmlab_harness::docker::Engine::connect() {
                Ok(_) => BackendKind::Docker,
                Err(e) => {
                    eprintln!("lab: no Docker engine ({e}): the lab runs on netns hosts instead");
                    BackendKind::Netns
                }
            },
        })
    }
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
    match run(Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(Failure(code, msg)) => {
            eprintln!("lab: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run(cli: Cli) -> Result<u8, Failure> {
    let act = |op: &str, node: &str, what: &str| -> Result<u8, Failure> {
        let what = match which()? {
            Lab::Swarm(l) => l.act(op, node)?,
            Lab::Keeper => {
                keeper::ask(serde_json::json!({"op": op, "host": node}))?;
                what.to_string()
            }
        };
        dvmlab_host::outln!("{node}: {what}");
        Ok(0)
    };
    match cli.command {
        Cmd::Image {
            bin_dir,
            busybox,
            remove,
            push,
            tag,
        } => {
            let engine = dvmlab_harness::docker::Engine::connect()?;
            if remove {
                if engine.remove_image(&tag)? {
                    dvmlab_host::outln!("removed image {tag}");
                } else {
                    dvmlab_host::outln!("no image {tag}");
                }
                return Ok(0);
            }
            let ctx = image::context(&image::Sources { bin_dir, busybox })?;
            let t = Instant::now();
            engine.build_image(&tag, ctx)?;
            dvmlab_host::outln!("built {tag} in {:.1} s", t.elapsed().as_secs_f64());
            if let Some(registry) = push {
                let name = swarm::push(&tag, &registry)?;
                dvmlab_host::outln!(
                    "pushed {name}: `lab up --swarm --image {name}` on a manager of the swarm"
                );
            }
            Ok(0)
        }
        Cmd::Keep {
            plan,
            hold,
            spares,
            bin_dir,
            backend,
        } => {
            let plan = plan.plan()?.with_spares(spares)?;
            keeper::keep(&plan, &hold, &bin_dir, backend.kind()?)?;
            Ok(0)
        }
        Cmd::Agent(args) => Err(Failure(127, format!("agent: {}", args.exec()))),
        Cmd::Up {
            plan,
            backend,
            bin_dir,
            hold,
            spares,
            timeout,
            swarm,
            image,
            stack,
        } => {
            if let Some(l) = swarm::Lab::find()? {
                return Err(Failure(
                    1,
                    format!(
                        "a lab is already up (swarm stack {}); `lab down` first",
                        l.stack
                    ),
                ));
            }
            if keeper::Keeper::find().is_some() {
                let about = keeper::ask(serde_json::json!({"op": "about"}))?;
                return Err(Failure(
                    1,
                    format!(
                        "a lab is already up (on {}); `lab down` first",
                        about["backend"].as_str().unwrap_or("?")
                    ),
                ));
            }
            let plan = plan
                .plan()?
                .with_spares(spares)
                .map_err(|e| Failure(2, e))?;
            if swarm {
                return up_swarm(&plan, &hold, &image, &stack, Duration::from_secs(timeout));
            }
            up(
                &plan,
                &hold,
                bin_dir,
                backend.kind()?,
                Duration::from_secs(timeout),
            )
        }
        Cmd::Down { swarm } => {
            if let Some(l) = swarm::Lab::find()? {
                let stack = l.stack.clone();
                let n = l.remove()?;
                dvmlab_host::outln!(
                    "removed the lab: swarm stack {stack} ({n} services, their tasks, config, secret and network)"
                );
                return Ok(0);
            }
            if swarm {
                dvmlab_host::outln!("no swarm lab was up");
                return Ok(0);
            }
            let Some(k) = keeper::Keeper::find() else {
                dvmlab_host::outln!("no lab was up");
                return Ok(0);
            };
            let about = k.ask(&serde_json::json!({"op": "about"}), &[])?;
            let n = hosts()?.len();
            let v = keeper::ask(serde_json::json!({"op": "down"}))?;
            let pid = v["pid"].as_u64().unwrap_or(0) as u32;
            keeper::wait_gone(pid)?;
            dvmlab_host::outln!(
                "removed the lab: {n} hosts on {} (run {}), their {} and logs",
                about["backend"].as_str().unwrap_or("?"),
                about["run"].as_str().unwrap_or("?"),
                if about["backend"] == "docker" {
                    "containers, networks, partition rules"
                } else {
                    "namespaces, bridge, partition rules"
                }
            );
            Ok(0)
        }
        Cmd::Status { json } => {
            let mut argv = vec!["pctl".to_string(), "status".to_string()];
            if json {
                argv.push("--json".into());
            }
            let code = exec_on(CONTROLLER, &argv)?;
            if !json && code == 0 {
                print_lab_state()?;
            }
            Ok(if code == 0 { 0 } else { 1 })
        }
        Cmd::Grow { count, host } => {
            let hosts = if host.is_empty() {
                free_spares(count)?
            } else {
                host
            };
            let argv = ["pctl", "grow", "--add-host", &hosts.join(","), "--wait"];
            on_controller(&argv)
        }
        Cmd::Shrink { nodes } => on_controller(&["pctl", "shrink", &nodes.join(","), "--wait"]),
        Cmd::Alloc { argv } => {
            let mut full = vec!["palloc"];
            full.extend(argv.iter().map(String::as_str));
            on_controller(&full)
        }
        Cmd::Run { argv } => {
            let mut full = vec!["prun".to_string()];
            full.extend(argv);
            let code = exec_on(CONTROLLER, &full)?;
            Ok(u8::try_from(code).unwrap_or(1))
        }
        Cmd::Kill { node } => act("kill", &node, "killed"),
        Cmd::Freeze { node } => act("freeze", &node, "frozen"),
        Cmd::Thaw { node } => act("thaw", &node, "thawed"),
        Cmd::Restart { node } => act("restart", &node, "restarted"),
        Cmd::LateBoot { node } => act("late-boot", &node, "booted"),
        Cmd::Partition { a, b } => {
            let side = |s: &str| -> Vec<String> {
                s.split(',')
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect()
            };
            if side(&a).is_empty() || side(&b).is_empty() {
                return Err(Failure(2, "partition A B: both sides need a host".into()));
            }
            match which()? {
                Lab::Swarm(l) => l.partition(&side(&a), &side(&b))?,
                Lab::Keeper => {
                    keeper::ask(
                        serde_json::json!({"op": "partition", "a": side(&a), "b": side(&b)}),
                    )?;
                }
            }
            dvmlab_host::outln!("partitioned {a} from {b}");
            Ok(0)
        }
        Cmd::Heal => {
            match which()? {
                Lab::Swarm(l) => l.heal()?,
                Lab::Keeper => {
                    keeper::ask(serde_json::json!({"op": "heal"}))?;
                }
            }
            dvmlab_host::outln!("healed");
            Ok(0)
        }
        Cmd::Export {
            k8s,
            compose: _,
            swarm,
            image,
            spares,
            plan,
            namespace,
            out,
        } => {
            let plan = plan
                .plan()?
                .with_spares(spares)
                .map_err(|e| Failure(2, e))?;
            if swarm && plan.ip != IpVersion::V4 {
                return Err(Failure(2, SWARM_V4.into()));
            }
            let files = if k8s {
                vec![("dvmlab-lab.k8s.yaml", export::k8s(&plan, &namespace)?)]
            } else if swarm {
                swarm::files(&plan, &image, &[])?
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
            // A re-export keeps the key a running cluster already has.
            let key = out.join(export::KEY_FILE);
            if key.exists() {
                dvmlab_host::keyfile::load(&key)?;
                dvmlab_host::outln!("kept the DVM key {}", key.display());
            } else {
                dvmlab_host::keyfile::generate(&key)?;
                dvmlab_host::outln!("wrote a new DVM key {}", key.display());
            }
            if swarm {
                dvmlab_host::outln!(
                    "deploy it on a swarm manager: cd {} && docker stack deploy --resolve-image never -c stack.yml {}",
                    out.display(),
                    swarm::STACK
                );
            }
            if k8s {
                dvmlab_host::outln!(
                    "make it the pods' Secret: kubectl create secret generic {} --from-file={}={}",
                    export::KEY_SECRET,
                    export::KEY_FILE,
                    key.display()
                );
            }
            Ok(0)
        }
        Cmd::Logs { host, follow } => {
            if let Lab::Swarm(l) = which()? {
                l.logs(&host, follow)?;
                return Ok(0);
            }
            let v = keeper::ask(serde_json::json!({"op": "hosts"}))?;
            let path = v["hosts"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|h| h["host"].as_str() == Some(host.as_str()))
                .and_then(|h| h["log"].as_str().map(PathBuf::from))
                .ok_or_else(|| Failure(1, format!("no host {host} in this lab")))?;
            keeper::print_log(&path, follow)?;
            Ok(0)
        }
    }
}

/// Which lab is up.
enum Lab {
    /// A keeper's: the harness's docker or netns hosts.
    Keeper,
    Swarm(swarm::Lab),
}

/// The lab that is up, or why none is.
fn which() -> Result<Lab, String> {
    if let Some(l) = swarm::Lab::find()? {
        return Ok(Lab::Swarm(l));
    }
    if keeper::Keeper::find().is_some() {
        return Ok(Lab::Keeper);
    }
    Err(NO_LAB.into())
}

/// Runs `argv` on `host` of the lab that is up, with this process's stdin, stdout and
/// stderr; its exit code.
fn exec_on(host: &str, argv: &[String]) -> Result<i64, String> {
    match which()? {
        Lab::Swarm(l) => l.exec(host, argv),
        Lab::Keeper => keeper::Keeper::find().ok_or(NO_LAB)?.exec(host, argv),
    }
}

/// Runs `argv` on `host` of the lab that is up; (exit code, stdout, stderr).
fn output_on(host: &str, argv: &[String]) -> Result<(i64, String, String), String> {
    match which()? {
        Lab::Swarm(l) => l.output(host, argv),
        Lab::Keeper => keeper::output(host, argv),
    }
}

/// Swarm's overlay networks here carry the lab in IPv4 only.
const SWARM_V4: &str = "the swarm lab runs IPv4 on its overlay network (--ip 4)";

/// Every host of the lab: name, its daemon's state, whether it is a spare. (A swarm
/// task's state is its container's: on a spare, that of the launch service.)
fn hosts() -> Result<Vec<(String, String, bool)>, String> {
    if let Lab::Swarm(l) = which()? {
        return Ok(l
            .plan
            .all_hosts()
            .into_iter()
            .map(|h| {
                let state = l.state(&h.name);
                let spare = l.plan.is_spare(&h.name);
                (h.name, state, spare)
            })
            .collect());
    }
    let v = keeper::ask(serde_json::json!({"op": "hosts"}))?;
    Ok(v["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            (
                h["host"].as_str().unwrap_or_default().to_string(),
                h["state"].as_str().unwrap_or_default().to_string(),
                h["spare"].as_bool().unwrap_or(false),
            )
        })
        .collect())
}

/// Runs a runtime tool on the controller with this process's terminal: its output and
/// exit status are the tool's.
fn on_controller(argv: &[&str]) -> Result<u8, Failure> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let code = exec_on(CONTROLLER, &argv)?;
    Ok(u8::try_from(code).unwrap_or(1))
}

/// The controller's JSON answer to `pctl ARGS --json`.
fn controller_json(args: &[&str]) -> Result<serde_json::Value, String> {
    let mut argv = vec!["pctl".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.push("--json".into());
    let (code, out, err) = output_on(CONTROLLER, &argv)?;
    if code != 0 {
        return Err(format!("pctl {}: {}", args.join(" "), err.trim()));
    }
    serde_json::from_str(&out).map_err(|e| format!("pctl {} is not JSON: {e}", args.join(" ")))
}

/// Hosts in the DVM's membership that have not departed.
fn members(status: &serde_json::Value) -> Vec<String> {
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["state"] != "departed")
        .filter_map(|m| m["host"].as_str().map(str::to_string))
        .collect()
}

/// Hosts whose every rank has departed (shrunk, or a failed grow undone).
fn departed(status: &serde_json::Value) -> Vec<String> {
    let inside = members(status);
    let mut gone: Vec<String> = status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["host"].as_str().map(str::to_string))
        .filter(|h| !inside.contains(h))
        .collect();
    // A host may have left under several ranks.
    gone.sort();
    gone.dedup();
    gone
}

/// The first `count` spares the DVM does not have.
fn free_spares(count: usize) -> Result<Vec<String>, Failure> {
    if count == 0 {
        return Err(Failure(2, "grow: a count of at least 1".into()));
    }

    let spares: Vec<String> = hosts()?
        .into_iter()
        .filter(|(_, _, spare)| *spare)
        .map(|(h, _, _)| h)
        .collect();
    let inside = members(&controller_json(&["status"])?);
    let free: Vec<String> = spares.into_iter().filter(|s| !inside.contains(s)).collect();
    if free.len() < count {
        return Err(Failure(
            1,
            format!(
                "grow {count}: only {} spare(s) free ({}); `lab up --spares K` makes K",
                free.len(),
                if free.is_empty() {
                    "none".to_string()
                } else {
                    free.join(", ")
                }
            ),
        ));
    }
    Ok(free.into_iter().take(count).collect())
}

/// Below the controller's table: what only the lab knows (daemons not running, spares
/// the DVM does not have) and the parked jobs.
fn print_lab_state() -> Result<(), String> {
    let status = controller_json(&["status"])?;
    let (inside, gone) = (members(&status), departed(&status));
    let (mut down, mut left, mut free) = (Vec::new(), Vec::new(), Vec::new());
    for (h, s, spare) in hosts()? {
        if spare && !inside.contains(&h) {
            free.push(h);
        } else if gone.contains(&h) {
            left.push(h);
        } else if s != "running" {
            // A spare's daemon is the DVM's: once it stops, nothing of the lab's is there.
            let s = if spare && s == "not started" {
                "gone"
            } else {
                &s
            };
            down.push(format!("{h} ({s})"));
        }
    }
    if !down.is_empty() {
        dvmlab_host::outln!("daemons not running: {}", down.join(", "));
    }
    if !left.is_empty() {
        dvmlab_host::outln!(
            "left the DVM (`lab grow --host` adds them again): {}",
            left.join(", ")
        );
    }
    if !free.is_empty() {
        dvmlab_host::outln!("spares not in the DVM: {}", free.join(", "));
    }
    // The runtime's contract: a job held for a campaign is in state 17, by this name.
    let jobs = controller_json(&["jobs"])?;
    let parked: Vec<String> = jobs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["state"] == "WAITING FOR DAEMON CAMPAIGN")
        .map(|j| {
            let argv: Vec<&str> = j["argv"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .collect();
            format!("job {} ({})", j["id"], argv.join(" "))
        })
        .collect();
    if !parked.is_empty() {
        dvmlab_host::outln!(
            "parked (WAITING FOR DAEMON CAMPAIGN): {}",
            parked.join(", ")
        );
    }
    Ok(())
}

/// `up`: a keeper in the background, then a wait for every started daemon to join, then
/// the controller's table.
fn up(
    plan: &Plan,
    hold: &[String],
    bin_dir: Option<PathBuf>,
    backend: BackendKind,
    timeout: Duration,
) -> Result<u8, Failure> {
    let bin = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(PathBuf::from))
            .ok_or("cannot find this program's directory")?,
    };
    let t = Instant::now();
    let expect = plan.hosts().len() - hold.len();
    let on = keeper::backend_name(backend);
    let bar = join_bar(expect, format!("starting {expect} hosts on {on}"));
    keeper::spawn_keeper(plan, hold, &bin, backend)?;
    bar.set_message("waiting for the daemons to join");
    wait_joined(&bar, expect, timeout, Duration::from_millis(100)).map_err(|e| {
        Failure(
            1,
            format!(
                "the DVM did not form: {e} (see `lab logs {CONTROLLER}`; `lab down` removes the lab)"
            ),
        )
    })?;
    let about = keeper::ask(serde_json::json!({"op": "about"}))?;
    let run = about["run"].as_str().unwrap_or("?");
    print_up(&format!("{on} (run {run})"), plan, hold, t)
}

/// How `up` ends, on any lab: where it is, how many daemons joined in how long, who was
/// held and which spares there are, then the controller's table.
fn print_up(on: &str, plan: &Plan, hold: &[String], t: Instant) -> Result<u8, Failure> {
    let all = plan.hosts().len();
    dvmlab_host::outln!(
        "lab up on {on}: {} of {all} daemons joined in {:.1} s{}",
        all - hold.len(),
        t.elapsed().as_secs_f64(),
        if hold.is_empty() {
            String::new()
        } else {
            format!("; held for late-boot: {}", hold.join(", "))
        }
    );
    if plan.spares > 0 {
        let names: Vec<String> = plan.spare_hosts().into_iter().map(|h| h.name).collect();
        dvmlab_host::outln!(
            "spares for `lab grow` and `lab alloc`: {}",
            names.join(", ")
        );
    }
    print_table()
}

/// `up`'s progress: daemons joined out of `expect`, saying `msg`.
fn join_bar(expect: usize, msg: String) -> ProgressBar {
    let bar = ProgressBar::new(expect as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:40} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(msg);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Waits until `expect` daemons have joined, reading the controller's status of the lab
/// that is up every `poll` and moving `bar`, which is cleared either way.
fn wait_joined(
    bar: &ProgressBar,
    expect: usize,
    timeout: Duration,
    poll: Duration,
) -> Result<(), String> {
    let argv = ["pctl", "status", "--json"].map(String::from);
    let joined = dvmlab_harness::wait_until(timeout, poll, || {
        let (code, out, err) = output_on(CONTROLLER, &argv)?;
        if code != 0 {
            return Err(err.trim().to_string());
        }
        let s: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("status is not JSON: {e}"))?;
        let joined = s["joined"].as_u64().unwrap_or(0) as usize;
        bar.set_position(joined as u64);
        if joined >= expect {
            Ok(())
        } else {
            Err(format!("{joined} of {expect} daemons joined"))
        }
    });
    bar.finish_and_clear();
    joined
}

/// The controller's status table, as `up` ends with it.
fn print_table() -> Result<u8, Failure> {
    let (_, table, _) = output_on(CONTROLLER, &["pctl".to_string(), "status".to_string()])?;
    dvmlab_host::stdout::bytes(table.as_bytes());
    Ok(0)
}

/// `up --swarm`: the stack deployed, then a wait for every started daemon to join, then the
/// controller's table.
fn up_swarm(
    plan: &Plan,
    hold: &[String],
    image: &str,
    stack: &str,
    timeout: Duration,
) -> Result<u8, Failure> {
    if plan.ip != IpVersion::V4 {
        return Err(Failure(2, SWARM_V4.into()));
    }
    let t = Instant::now();
    let expect = plan.hosts().len() - hold.len();
    let bar = join_bar(expect, format!("deploying {expect} services on the swarm"));
    swarm::Lab::deploy(plan, image, stack, hold)?;
    bar.set_message("waiting for the tasks to start and the daemons to join");
    wait_joined(&bar, expect, timeout, Duration::from_millis(250)).map_err(|e| {
        Failure(
            1,
            format!(
                "the DVM did not form: {e} (see `lab logs {CONTROLLER}` and `docker stack ps {stack}`; `lab down` removes the stack)"
            ),
        )
    })?;
    print_up(
        &format!("the swarm (stack {stack}, image {image})"),
        plan,
        hold,
        t,
    )
}
