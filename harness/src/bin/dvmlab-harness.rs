//! `dvmlab-harness`: stand up a DVM of real daemons on this machine, or clean up after crashed
//! runs.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use clap::{Parser, Subcommand, ValueEnum};
use dvmlab_harness::{gc, BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};

/// Start clusters of real DVM daemons as hosts on this machine.
///
/// Hosts are network namespaces (as root) or loopback processes. Everything a run creates
/// is removed when it ends; `gc` removes what a crashed run left behind.
#[derive(Parser, Debug)]
#[command(name = "dvmlab-harness", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Netns,
    Process,
    Docker,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Stand up a DVM (controller `ctl` plus nodes n01..nNN), show it, and tear it down.
    Up {
        /// Number of compute nodes (the controller comes on top unless --controller-listed).
        #[arg(long, default_value_t = 8)]
        nodes: usize,
        /// DVMRadix.
        #[arg(long, default_value_t = 64)]
        radix: u32,
        /// DVMIPVersion: 4 or 6.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(4..=6))]
        ip: u8,
        /// List the controller in DVMNodes (it becomes a compute node too).
        #[arg(long)]
        controller_listed: bool,
        /// Backend; default: netns as root, else process.
        #[arg(long, value_enum)]
        backend: Option<Backend>,
        /// Directory holding prted and pctl; default: next to this program.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Keep the DVM up this many seconds after showing it (0: tear down at once).
        #[arg(long, default_value_t = 0.0)]
        hold: f64,
    },
    /// Run COMMAND on HOST of a harness run, as `ssh HOST COMMAND` would on real machines
    /// (the launch agent a run writes into its directory calls this).
    Agent(dvmlab_harness::agent::AgentArgs),
    /// Remove namespaces, containers, networks, run directories and locks of harness runs
    /// whose process is gone.
    Gc {
        /// Remove those of every run, live or not (and the docker backend's host images).
        #[arg(long)]
        all: bool,
        /// Exit 1 if there was anything to remove: after a test run, whatever is left is
        /// something a test did not clean up.
        #[arg(long)]
        strict: bool,
    },
}

/// Writes one line to stdout. A reader that went away (`dvmlab-harness gc | head -1`) stops
/// nothing: the command still does all its work, cleans up and exits with its own status;
/// only the rest of its report is lost (`println!` would panic, and `up` would then leave
/// its cluster to `gc`).
fn say(line: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(line).and_then(|()| out.write_all(b"\n"));
}

macro_rules! say {
    ($($arg:tt)*) => {
        say(format_args!($($arg)*))
    };
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Agent(args) => {
            let e = args.exec();
            eprintln!("dvmlab-harness agent: {e}");
            ExitCode::from(127)
        }
        Cmd::Gc { all, strict } => {
            let c = gc::collect(all);
            say!(
                "removed {} namespaces, {} run directories, {} loopback locks",
                c.namespaces.len(),
                c.run_dirs.len(),
                c.locks.len()
            );
            for n in &c.namespaces {
                say!("  netns {n}");
            }
            for d in &c.run_dirs {
                say!("  run directory {}", d.display());
            }
            for why in &c.stuck {
                say!("  not removed: {why}");
            }
            let d = dvmlab_harness::docker::collect(all);
            say!(
                "removed {} containers, {} Docker networks, {} host images",
                d.containers.len(),
                d.networks.len(),
                d.images.len()
            );
            for n in d.containers.iter().chain(&d.networks).chain(&d.images) {
                say!("  docker {n}");
            }
            for n in &d.held {
                say!("  not removed: Docker network {n}: the engine holds an endpoint of a container that is gone (an engine defect)");
            }
            let left = c.namespaces.len()
                + c.run_dirs.len()
                + c.stuck.len()
                + c.locks.len()
                + d.containers.len()
                + d.networks.len();
            if strict && left > 0 {
                eprintln!("dvmlab-harness gc --strict: {left} leftovers of finished runs (listed above): something did not clean up after itself");
                return ExitCode::FAILURE;
            }
            // Counted apart: the harness removed the containers and asked for the network,
            // and the engine refused for an endpoint of its own (said above, and at teardown).
            if strict && !d.held.is_empty() {
                eprintln!(
                    "dvmlab-harness gc --strict: {} Docker network(s) held by the engine, not by a run: not counted",
                    d.held.len()
                );
            }
            ExitCode::SUCCESS
        }
        Cmd::Up {
            nodes,
            radix,
            ip,
            controller_listed,
            backend,
            bin_dir,
            hold,
        } => match up(nodes, radix, ip, controller_listed, backend, bin_dir, hold) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dvmlab-harness: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Set by SIGINT/SIGTERM, so `--hold` ends early and the cluster is still torn down.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: i32) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn catch_interrupts() -> Result<(), String> {
    let action = SigAction::new(
        SigHandler::Handler(on_interrupt),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(sig, &action) }.map_err(|e| format!("installing {sig} handler: {e}"))?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn up(
    nodes: usize,
    radix: u32,
    ip: u8,
    listed: bool,
    backend: Option<Backend>,
    bin_dir: Option<PathBuf>,
    hold: f64,
) -> Result<(), String> {
    if ip != 4 && ip != 6 {
        return Err("--ip must be 4 or 6".into());
    }
    if !(hold.is_finite() && (0.0..=1e6).contains(&hold)) {
        return Err("--hold must be a number of seconds from 0 to 1000000".into());
    }
    catch_interrupts()?;
    let backend = match backend {
        Some(Backend::Netns) => BackendKind::Netns,
        Some(Backend::Process) => BackendKind::Process,
        Some(Backend::Docker) => BackendKind::Docker,
        None => BackendKind::from_env()?,
    };
    if backend == BackendKind::Process && ip == 6 {
        return Err("IPv6 needs the netns or docker backend".into());
    }
    let bin = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .parent()
            .map(PathBuf::from)
            .ok_or("cannot find the program's directory")?,
    };
    let prted = bin.join("prted");
    let pctl = bin.join("pctl").to_string_lossy().to_string();
    if !prted.exists() {
        return Err(format!(
            "{} not found (build it, or pass --bin-dir)",
            prted.display()
        ));
    }
    let names: Vec<String> = (1..=nodes).map(|i| format!("n{i:02}")).collect();
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(names.iter().cloned());
    let node_list = if listed {
        format!("ctl,{}", names.join(","))
    } else {
        names.join(",")
    };
    let conf = PrteConf::new()
        .set("ClusterName", "demo")
        .set("DVMNodes", node_list)
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", radix)
        .set("DVMIPVersion", ip);
    let mut spec = ClusterSpec::new(
        "demo",
        &hosts,
        vec![prted.to_string_lossy().to_string(), "--bootstrap".into()],
    );
    spec.backend = backend;
    spec.ip = if ip == 6 { IpMode::V6 } else { IpMode::V4 };
    spec.conf = conf.render();
    // The DVM key the harness makes for the cluster: links and tools authenticated.
    spec.env = vec![("PRTE_MCA_dvmlab_dvm_key_file".into(), "{key}".into())];
    say!(
        "starting {} daemons ({backend:?} backend, radix {radix}, IPv{ip}); run dir below",
        hosts.len()
    );
    let mut cluster = Cluster::new(spec)?;
    say!("  {}", cluster.run_dir().display());
    cluster.start_all()?;
    let pctl_on_ctl = |args: &[&str]| -> Result<String, String> {
        let mut argv = vec![pctl.clone()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let out = cluster.exec("ctl", &argv)?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            return Err(format!(
                "{argv:?} failed: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(text)
    };
    let shown = pctl_on_ctl(&["wait", "--within", "30"]).and_then(|w| {
        Ok(format!(
            "{w}\n{}\n{}",
            pctl_on_ctl(&["status"])?,
            pctl_on_ctl(&["ping", "--all"])?
        ))
    });
    match shown {
        Ok(s) => say!("{s}"),
        Err(e) => {
            eprintln!("{}", cluster.logs_tail(20));
            return Err(e);
        }
    }
    if hold > 0.0 {
        say!("holding for {hold}s (Ctrl-C ends it early and still cleans up)");
        let until = Instant::now() + Duration::from_secs_f64(hold);
        while Instant::now() < until && !INTERRUPTED.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let stopped = pctl_on_ctl(&["stop"]);
    say!("{}", stopped.unwrap_or_else(|e| e));
    cluster.destroy();
    Ok(())
}
