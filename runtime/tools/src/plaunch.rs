//! `plaunch`: a launch service for hosts without ssh (swarm tasks, pods, bare containers),
//! and the launch agent that uses it. `plaunch serve` on a host starts one program (prted,
//! beside it) for callers that prove they hold the DVM key; `plaunch run HOST COMMAND…` is
//! what the controller's `plm_ssh_agent` runs to start a daemon there, as `ssh HOST
//! COMMAND…` would. The exchange is one request and one reply in the DVM key's secure
//! channel ([`dvmlab_proto::launch`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use dvmlab_core::conf::Params;
use dvmlab_proto::codec::{initiate, read_sealed, respond, write_sealed};
use dvmlab_proto::launch::{LaunchReply, LaunchRequest, DEFAULT_PORT};
use dvmlab_proto::limits::{LAUNCH_EXCHANGE_SECS, MAX_LAUNCH_CALLERS};
use dvmlab_proto::secure::DvmKey;

/// Start daemons on hosts without ssh, for holders of the DVM key.
///
/// On each host the DVM may grow onto:
///   plaunch serve [--listen ADDR] [--allow PROGRAM] [--max-daemons N] [--boot -- ARGS]
/// serves on TCP port 7818 (all addresses) and starts only PROGRAM (by default the prted
/// beside plaunch), at most N (1) at once, for callers that prove they hold the key named
/// by prte.conf's DVMKeyFile. A started daemon is the service's child: its output goes
/// where the service's goes, and stopping the service (SIGTERM) stops its daemons. With
/// --boot the host also starts its own daemon (PROGRAM ARGS) at once, and the service fails
/// with it; once it has left cleanly, the host serves launches, so the DVM can grow onto it
/// again.
///
/// On the controller, as the launch agent (words, no shell):
///   prted --prtemca plm_ssh_agent "plaunch run" ...
/// `plaunch run HOST COMMAND...` asks HOST's service to start COMMAND and exits 0 once it
/// runs there: 1 when the service refused (the reason is printed), 3 when HOST cannot be
/// reached or does not hold the key, 2 for a usage error.
#[derive(Parser, Debug)]
#[command(name = "plaunch", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve launches on this host.
    Serve(ServeArgs),
    /// Start COMMAND on HOST through its launch service (a launch agent).
    Run(RunArgs),
}

/// Where the DVM key comes from: prte.conf's DVMKeyFile, as for every tool.
#[derive(Args, Debug)]
struct KeyArgs {
    /// The prte.conf to read.
    #[arg(long, value_name = "PATH")]
    conf: Option<String>,

    /// Set an MCA-style parameter, as for prted; may be repeated.
    #[arg(long, num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append)]
    prtemca: Vec<String>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address and port to serve on [default: [::]:7818, or 0.0.0.0:7818 without IPv6].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,

    /// The one program callers may start [default: the prted beside plaunch].
    #[arg(long, value_name = "PROGRAM")]
    allow: Option<PathBuf>,

    /// Daemons this service runs at once; a request beyond is refused.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_daemons: u32,

    /// Start the allowed program at once with ARGS (a host that boots its daemon): if it
    /// fails (a non-zero exit, a signal), so does the service, so whatever restarts the host
    /// restarts it; once it has ended cleanly (it left the DVM) the service goes on serving.
    #[arg(long)]
    boot: bool,

    #[command(flatten)]
    key: KeyArgs,

    /// With --boot, the allowed program's arguments (after `--`).
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The service's port on HOST.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,

    /// Seconds to reach HOST and hear its answer.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,

    #[command(flatten)]
    key: KeyArgs,

    /// The host to start COMMAND on.
    host: String,

    /// The command line, run there as it is (no shell).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<String>,
}

const EXCHANGE_LIMIT: Duration = Duration::from_secs(LAUNCH_EXCHANGE_SECS);
/// How long a stopping service waits for its daemons to exit.
const STOP_LIMIT: Duration = Duration::from_secs(4);

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve(a) => crate::run_tool("plaunch", serve(a)),
        Cmd::Run(a) => crate::run_tool("plaunch", run(a)),
    }
}

/// The DVM key prte.conf names; the service and the agent need it.
fn load_key(k: &KeyArgs) -> Result<(DvmKey, dvmlab_core::conf::settings::Settings), String> {
    let params = Params::for_tool(&k.prtemca, k.conf.as_deref(), std::env::vars());
    let settings = dvmlab_host::conf_file::load(&params).map_err(|d| d.to_string())?;
    let key = match &settings.key_file {
        Some((path, _)) => dvmlab_host::keyfile::load(path)?,
        None => {
            return Err(format!(
                "{}: no DVMKeyFile; plaunch serves and asks only with the DVM key",
                params.conf_path().display()
            ))
        }
    };
    Ok((key, settings))
}

/// The daemons the service started and that still run: pid → command line.
type Running = Arc<Mutex<BTreeMap<u32, String>>>;

/// What the service may start and how many at once.
struct Policy {
    /// Canonical, to compare with.
    allowed: PathBuf,
    /// As the service was told, to show.
    shown: PathBuf,
    max_daemons: usize,
}

async fn serve(a: ServeArgs) -> Result<u8, (u8, String)> {
    let (key, _) = load_key(&a.key).map_err(|e| (2, e))?;
    let allow = match a.allow {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| (2, format!("where plaunch is: {e}")))?
            .with_file_name("prted"),
    };
    let allowed = allow
        .canonicalize()
        .map_err(|e| (2, format!("--allow {}: {e}", allow.display())))?;
    let listen = a.listen.unwrap_or_else(|| {
        let any: IpAddr = if dvmlab_host::hosts::ipv6_available() {
            "::".parse().expect("an address")
        } else {
            "0.0.0.0".parse().expect("an address")
        };
        SocketAddr::new(any, DEFAULT_PORT)
    });
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| (3, format!("serving on {listen}: {e}")))?;
    let bound = listener.local_addr().map_err(|e| (3, e.to_string()))?;
    eprintln!(
        "plaunch: serving on {bound}: starts {} (at most {} at once) for holders of the DVM key",
        allow.display(),
        a.max_daemons
    );
    let policy = Arc::new(Policy {
        allowed,
        shown: allow,
        max_daemons: a.max_daemons as usize,
    });
    let key = Arc::new(key);
    let running: Running = Arc::default();
    let (boot_tx, mut boot_failed) = tokio::sync::mpsc::channel(1);
    if a.boot {
        let mut argv = vec![policy.shown.display().to_string()];
        argv.extend(a.args);
        match start(LaunchRequest { argv }, &policy, &running, Some(boot_tx)) {
            LaunchReply::Started { pid } => eprintln!("plaunch: booted pid {pid}"),
            LaunchReply::Refused { reason } => return Err((1, format!("--boot: {reason}"))),
        }
    } else if !a.args.is_empty() {
        return Err((2, "arguments after `--` are for --boot".into()));
    }
    let callers = Arc::new(Semaphore::new(MAX_LAUNCH_CALLERS));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| (3, format!("SIGTERM: {e}")))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| (3, format!("SIGINT: {e}")))?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: it passes as callers leave.
                        eprintln!("plaunch: accepting: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(slot) = callers.clone().try_acquire_owned() else {
                    eprintln!("plaunch: {peer}: {MAX_LAUNCH_CALLERS} callers already; closed");
                    continue;
                };
                let (key, policy, running) = (key.clone(), policy.clone(), running.clone());
                tokio::spawn(async move {
                    let exchange = serve_one(stream, &key, &policy, &running);
                    let said = match tokio::time::timeout(EXCHANGE_LIMIT, exchange).await {
                        Ok(Ok(done)) => done,
                        Ok(Err(e)) => e,
                        Err(_) => format!("took longer than {EXCHANGE_LIMIT:?}; closed"),
                    };
                    eprintln!("plaunch: {peer}: {said}");
                    drop(slot);
                });
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            Some(status) = boot_failed.recv() => {
                stop_daemons(&running).await;
                return Err((1, format!("the daemon it booted failed ({status}); stopping")));
            }
        }
    }
    stop_daemons(&running).await;
    Ok(0)
}

/// Sends every daemon still running SIGTERM (to its process group) and waits a little for
/// them to go: a stopping service takes its daemons with it, as a host shutting down would.
async fn stop_daemons(running: &Running) {
    let pids: Vec<u32> = lock(running).keys().copied().collect();
    for &pid in &pids {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if pids.is_empty() {
        return;
    }
    eprintln!("plaunch: stopping; SIGTERM to daemon(s) {pids:?}");
    let deadline = tokio::time::Instant::now() + STOP_LIMIT;
    while !lock(running).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lock(r: &Running) -> std::sync::MutexGuard<'_, BTreeMap<u32, String>> {
    // A waiter that panicked holding the lock left the map as it was: still usable.
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// One caller: the key handshake (nothing is read before it verified), one request, one
/// reply. What happened, for the service's log.
async fn serve_one(
    mut s: TcpStream,
    key: &DvmKey,
    policy: &Policy,
    running: &Running,
) -> Result<String, String> {
    let (mut sealer, mut opener) = respond(&mut s, key).await?.split();
    let bytes = read_sealed(&mut s, &mut opener).await?;
    let reply = match serde_json::from_slice::<LaunchRequest>(&bytes) {
        Ok(req) => start(req, policy, running, None),
        Err(e) => LaunchReply::Refused {
            reason: format!("not a launch request: {e}"),
        },
    };
    let said = match &reply {
        LaunchReply::Started { pid } => format!("started pid {pid}"),
        LaunchReply::Refused { reason } => format!("refused: {reason}"),
    };
    let text = serde_json::to_vec(&reply).map_err(|e| e.to_string())?;
    write_sealed(&mut s, &mut sealer, &text).await?;
    Ok(said)
}

/// Starts the request's command line if the policy lets it. `failed` hears how it ended
/// if that was not a clean exit (the booted daemon's).
fn start(
    req: LaunchRequest,
    policy: &Policy,
    running: &Running,
    failed: Option<tokio::sync::mpsc::Sender<std::process::ExitStatus>>,
) -> LaunchReply {
    let refused = |reason: String| LaunchReply::Refused { reason };
    if let Err(e) = req.validate() {
        return refused(e);
    }
    let program = Path::new(&req.argv[0]);
    if program.canonicalize().ok().as_deref() != Some(policy.allowed.as_path()) {
        return refused(format!(
            "only {} is started here, not {}",
            policy.shown.display(),
            program.display()
        ));
    }
    let mut map = lock(running);
    if map.len() >= policy.max_daemons {
        let pids: Vec<&u32> = map.keys().collect();
        return refused(format!(
            "{} daemon(s) this service started still run (pid {pids:?}; at most {} at once)",
            map.len(),
            policy.max_daemons
        ));
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&req.argv[1..])
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(false);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return refused(format!("starting {}: {e}", program.display())),
    };
    let Some(pid) = child.id() else {
        return refused(format!("{} exited at once", program.display()));
    };
    let line = req.argv.join(" ");
    eprintln!("plaunch: pid {pid}: {line}");
    map.insert(pid, line);
    drop(map);
    let running = running.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        lock(&running).remove(&pid);
        match status {
            Ok(st) => {
                eprintln!("plaunch: pid {pid} ended: {st}");
                if let (Some(tx), false) = (failed, st.success()) {
                    let _ = tx.send(st).await;
                }
            }
            Err(e) => eprintln!("plaunch: pid {pid}: waiting for it: {e}"),
        }
    });
    LaunchReply::Started { pid }
}

async fn run(a: RunArgs) -> Result<u8, (u8, String)> {
    if !(a.timeout.is_finite() && a.timeout > 0.0 && a.timeout <= 3600.0) {
        return Err((
            2,
            "--timeout must be a number of seconds from 0 to 3600".into(),
        ));
    }
    let req = LaunchRequest { argv: a.command };
    req.validate().map_err(|e| (2, e))?;
    let (key, settings) = load_key(&a.key).map_err(|e| (2, e))?;
    let limit = Duration::from_secs_f64(a.timeout);
    let host = a.host;
    let resolver =
        dvmlab_host::hosts::Resolver::from_settings(&settings).map_err(|d| (2, d.to_string()))?;
    let name = host.clone();
    let addrs = tokio::task::spawn_blocking(move || resolver.resolve(&name))
        .await
        .map_err(|e| (3, e.to_string()))?
        .map_err(|e| (3, format!("{host}: does not resolve ({e})")))?;
    let exchange = async {
        let mut tried = Vec::new();
        for ip in &addrs {
            let at = SocketAddr::new(*ip, a.port);
            match TcpStream::connect(at).await {
                Ok(s) => {
                    return ask(s, &key, &req)
                        .await
                        .map_err(|e| (3, format!("{at}: {e}")))
                }
                Err(e) => tried.push(format!("{at}: {e}")),
            }
        }
        Err((
            3,
            format!("no launch service answers ({})", tried.join("; ")),
        ))
    };
    let reply = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| (3, format!("{host}: no answer within {limit:?}")))?
        .map_err(|(c, e)| (c, format!("{host}: {e}")))?;
    match reply {
        LaunchReply::Started { pid } => {
            eprintln!("plaunch: {host}: started pid {pid}");
            Ok(0)
        }
        LaunchReply::Refused { reason } => Err((1, format!("{host} refused: {reason}"))),
    }
}

/// The caller's side of one exchange.
async fn ask(mut s: TcpStream, key: &DvmKey, req: &LaunchRequest) -> Result<LaunchReply, String> {
    let (mut sealer, mut opener) = initiate(&mut s, key)
        .await
        .map_err(|e| format!("{e}: does the service hold this DVM's key?"))?
        .split();
    let text = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    write_sealed(&mut s, &mut sealer, &text).await?;
    let bytes = read_sealed(&mut s, &mut opener).await?;
    serde_json::from_slice(&bytes).map_err(|e| format!("an answer that is not a launch reply: {e}"))
}
