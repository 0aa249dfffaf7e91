//! `prun`: run a job on the DVM and wait for it.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use crate::client::connect_to_dvm;
use clap::{Parser, ValueEnum};
use dvmlab_proto::limits::{MAX_OUTPUT_CHUNK, STDIN_WINDOW};
use dvmlab_proto::placement::MapBy;
use dvmlab_proto::wire::{Stream, Submit, ToolReply, ToolRequest};
use tokio::signal::unix::{signal, SignalKind};

/// Run a job on the DVM formed by `prted --bootstrap`: its processes start on the DVM's
/// nodes, their output streams here, and prun exits with the job's status (the greatest of
/// its processes': an exit code, or 128 + a signal number).
///
/// The controller is found the way the daemons find it: from prte.conf (/etc/prte.conf, or
/// --conf, or the prte_bootstrap_conf parameter). SIGINT and SIGTERM are forwarded to the
/// job; a second SIGINT kills it. prun's stdin goes to process 0 (as bytes, at the pace it
/// reads them); the other processes read /dev/null.
///
/// Exit status: the job's; 2 for a usage error; 3 when the controller cannot be reached or
/// refuses the job.
#[derive(Parser, Debug)]
#[command(name = "prun", version, verbatim_doc_comment, trailing_var_arg = true)]
struct Cli {
    /// Number of processes (default: one per node).
    #[arg(short = 'n', long = "np")]
    np: Option<u32>,

    /// Spread processes round robin over nodes, or fill each node in turn.
    #[arg(long, value_enum, default_value_t = Mapping::Node)]
    map_by: Mapping,

    /// Only these hosts, comma separated, in this order.
    #[arg(long, value_delimiter = ',')]
    host: Option<Vec<String>>,

    /// Which process reads prun's stdin: 0, or none (all read /dev/null).
    #[arg(long, value_enum, default_value_t = StdinTo::Zero)]
    stdin: StdinTo,

    /// Prefix every output line with the process's index.
    #[arg(long)]
    tag_output: bool,

    /// Kill the job after this many seconds.
    #[arg(long, value_name = "SECS")]
    time_limit: Option<f64>,

    /// Working directory of the processes (default: the daemons').
    #[arg(long)]
    wdir: Option<String>,

    /// Set VAR=VALUE in the processes' environment; may be repeated.
    #[arg(short = 'x', long = "env", value_name = "VAR=VALUE")]
    env: Vec<String>,

    /// The prte.conf to read.
    #[arg(long, value_name = "PATH")]
    conf: Option<String>,

    /// Set an MCA-style parameter, as for prted; may be repeated.
    #[arg(long, num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append)]
    prtemca: Vec<String>,

    /// Seconds to wait for the controller to answer.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,

    /// The command and its arguments.
    #[arg(required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StdinTo {
    #[value(name = "0")]
    Zero,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mapping {
    Node,
    Slot,
}

/// `prun`'s command line, run by the `prun` binary.
pub fn main() -> ExitCode {
    crate::run_tool("prun", run(Cli::parse()))
}

fn write_all(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

/// Whether stdin is a terminal this process does not own (prun started with `&`): reading it
/// would stop prun with SIGTTIN, so the job gets an empty stdin instead.
fn stdin_is_someone_elses_terminal() -> bool {
    let stdin = std::io::stdin();
    nix::unistd::isatty(&stdin).unwrap_or(false)
        && nix::unistd::tcgetpgrp(&stdin).is_ok_and(|fg| fg != nix::unistd::getpgrp())
}

/// Whether stdin is /dev/null or closed: there is nothing to forward, so process 0 reads
/// /dev/null itself and the job goes without a stdin pipe, its forwarding and its round
/// trips (most jobs a script or a scheduler starts).
fn stdin_is_empty() -> bool {
    use nix::sys::stat::{fstat, stat, SFlag};
    let Ok(st) = fstat(std::io::stdin()) else {
        return true;
    };
    let char_dev = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
    char_dev && stat("/dev/null").is_ok_and(|null| null.st_rdev == st.st_rdev)
}

/// Reads this process's stdin in a thread of its own, a chunk at a time; an empty chunk is
/// the end (or a read error, which ends it as well).
fn read_stdin(tx: tokio::sync::mpsc::Sender<Vec<u8>>) {
    std::thread::spawn(move || {
        use std::io::Read;
        if stdin_is_someone_elses_terminal() {
            let _ = tx.blocking_send(Vec::new());
            return;
        }
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut buf = vec![0u8; MAX_OUTPUT_CHUNK];
            let n = loop {
                match stdin.read(&mut buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break 0,
                    Ok(n) => break n,
                }
            };
            buf.truncate(n);
            if tx.blocking_send(buf).is_err() || n == 0 {
                return;
            }
        }
    });
}

/// The exit code for a wait status: the exit code, or 128 + the signal.
fn exit_code(status: i32) -> u8 {
    let sig = status & 0x7f;
    if sig == 0 {
        ((status >> 8) & 0xff) as u8
    } else {
        (128 + sig).min(255) as u8
    }
}

async fn run(cli: Cli) -> Result<u8, (u8, String)> {
    if !(cli.timeout.is_finite() && cli.timeout > 0.0 && cli.timeout <= 1e6) {
        return Err((2, "--timeout must be a number of seconds above 0".into()));
    }
    let time_limit_ms = match cli.time_limit {
        Some(t) if t.is_finite() && t > 0.0 && t <= 1e9 => Some((t * 1000.0) as u64),
        Some(_) => {
            return Err((
                2,
                "--time-limit must be a positive number of seconds".into(),
            ))
        }
        None => None,
    };
    let mut env = Vec::new();
    for e in &cli.env {
        match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.push((k.to_string(), v.to_string())),
            _ => return Err((2, format!("-x {e}: expected VAR=VALUE"))),
        }
    }
    let timeout = Duration::from_secs_f64(cli.timeout);
    let params = dvmlab_host::conf_file::tool_params(&cli.prtemca, cli.conf.as_deref());
    let mut c = connect_to_dvm(&params, timeout).await.map_err(|e| (3, e))?;
    let forward_stdin = cli.stdin == StdinTo::Zero && !stdin_is_empty();
    let job = Submit {
        argv: cli.command.clone(),
        env,
        cwd: cli.wdir.clone(),
        // None: the controller runs one per node (joined compute node, or listed host).
        nprocs: cli.np,
        map_by: match cli.map_by {
            Mapping::Node => MapBy::Node,
            Mapping::Slot => MapBy::Slot,
        },
        hosts: cli.host.clone(),
        time_limit_ms,
        userid: nix::unistd::getuid().as_raw(),
        stdin: forward_stdin,
    };
    c.send(ToolRequest::Submit { job })
        .await
        .map_err(|e| (3, e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| (3, e.to_string()))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| (3, e.to_string()))?;
    let mut id = None;
    let mut interrupts = 0;
    let mut line_start: HashMap<(u32, Stream), bool> = HashMap::new();
    // Stdin: read in a thread (a blocking read of whatever fd 0 is), a chunk at a time, and
    // only taken while less than a window is unacknowledged.
    let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
    let mut stdin_open = false;
    let (mut sent, mut acked) = (0u64, 0u64);
    loop {
        let room = stdin_open && sent - acked < STDIN_WINDOW as u64;
        let reply = tokio::select! {
            r = c.recv() => r.map_err(|e| (3, e))?,
            chunk = stdin_rx.recv(), if room => {
                let (Some(id), chunk) = (id, chunk) else { continue };
                let data = chunk.unwrap_or_default();
                let eof = data.is_empty();
                stdin_open = !eof;
                sent += data.len() as u64;
                c.send(ToolRequest::Stdin { id, data, eof }).await.map_err(|e| (3, e))?;
                continue;
            }
            _ = sigint.recv() => {
                interrupts += 1;
                let sig = if interrupts > 1 { 9 } else { 2 };
                if let Some(id) = id {
                    c.send(ToolRequest::Kill { id, signal: sig }).await.map_err(|e| (3, e))?;
                }
                continue;
            }
            _ = sigterm.recv() => {
                if let Some(id) = id {
                    c.send(ToolRequest::Kill { id, signal: 15 }).await.map_err(|e| (3, e))?;
                }
                continue;
            }
        };
        match reply {
            ToolReply::Submitted { id: i, .. } => {
                id = Some(i);
                if forward_stdin {
                    stdin_open = true;
                    read_stdin(stdin_tx.clone());
                }
            }
            ToolReply::StdinAck { bytes, .. } => acked = acked.max(bytes),
            ToolReply::JobOutput {
                proc, stream, data, ..
            } => {
                // A piece that ends a line ends it; the next piece of that stream starts one.
                let fresh = line_start.entry((proc, stream)).or_insert(true);
                let mut bytes = Vec::with_capacity(data.len() + 12);
                if cli.tag_output && *fresh {
                    bytes.extend_from_slice(format!("[{proc}] ").as_bytes());
                }
                *fresh = data.ends_with(b"\n");
                bytes.extend_from_slice(&data);
                let written = match stream {
                    Stream::Stdout => write_all(&mut std::io::stdout(), &bytes),
                    Stream::Stderr => write_all(&mut std::io::stderr(), &bytes),
                };
                if let Err(e) = written {
                    // Whoever reads our output went away: the job goes on without it.
                    if e.kind() != std::io::ErrorKind::BrokenPipe {
                        return Err((3, format!("cannot write the job's output: {e}")));
                    }
                }
            }
            ToolReply::JobEnded {
                id,
                status,
                exception,
            } => {
                if let Some(e) = exception {
                    eprintln!("prun: job {id}: exception {e}");
                }
                return Ok(exit_code(status));
            }
            ToolReply::Signalled { .. } => {}
            ToolReply::Error { message } => return Err((3, message)),
            other => return Err((3, format!("unexpected reply {other:?}"))),
        }
    }
}
