//! `pctl`: look at and control a DVM through its controller.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::client::{connect_to_dvm, Client};
use clap::{Parser, Subcommand};
use dvmlab_core::conf::Params;
use dvmlab_proto::contract::{JobReport, MemberState, PingReport, ProcPlace, StatusReport};
use dvmlab_proto::wire::{JobSummary, ToolReply, ToolRequest};

/// Look at and control a DVM formed by `prted --bootstrap`.
///
/// pctl finds the controller the way the daemons do: from prte.conf (/etc/prte.conf, or
/// --conf, or the prte_bootstrap_conf parameter), its DVMControllerHost and DVMPort.
///
/// Exit status: 0 on success; 1 when the DVM answered but the answer is a failure (a ping
/// that got no pong, a DVM not formed in time); 2 for a usage error; 3 when the controller
/// cannot be found or reached.
#[derive(Parser, Debug)]
#[command(name = "pctl", version, verbatim_doc_comment)]
struct Cli {
    /// The prte.conf to read (same as --prtemca prte_bootstrap_conf PATH).
    #[arg(long, global = true, value_name = "PATH")]
    conf: Option<String>,

    /// Set an MCA-style parameter, as for prted; may be repeated.
    #[arg(long, global = true, num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append)]
    prtemca: Vec<String>,

    /// Seconds to wait for the controller to answer.
    #[arg(long, global = true, default_value_t = 10.0)]
    timeout: f64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show DVM membership: namespace, formed, and every member's rank, host, parent, state.
    Status {
        /// Print the documented JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Send a ping through the routing tree to a daemon and back; print the round trip.
    Ping {
        /// The rank to ping.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        rank: Option<u32>,
        /// Ping every rank of the DVM.
        #[arg(long)]
        all: bool,
        /// Print one JSON object per rank.
        #[arg(long)]
        json: bool,
    },
    /// Stop the whole DVM: every daemon exits 0. Returns once the daemons confirmed.
    Stop,
    /// List jobs: id, state, processes and where they run, exit status.
    Jobs {
        /// Print a JSON array of the documented job objects instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Send a signal to every process of a job (KILL ends it with a `cancel` exception).
    Kill {
        /// The job id.
        job: u64,
        /// Signal name or number (TERM, SIGINT, 9, ...).
        #[arg(default_value = "TERM")]
        signal: String,
    },
    /// Write a fresh random DVM key (mode 0600) to PATH, or where prte.conf's DVMKeyFile
    /// says; never over an existing file.
    Keygen { path: Option<std::path::PathBuf> },
    /// Grow the DVM onto new hosts (elastic mode, prte_elastic_mode): the controller starts
    /// a daemon on each through its launch agent. An operator's push: no PMIx event; prints
    /// the allocation id and the new ranks, and with --wait how it ended.
    Grow {
        /// Hosts to add, comma-separated; may be repeated.
        #[arg(long = "add-host", value_delimiter = ',', value_name = "HOST")]
        add_host: Vec<String>,
        /// A file of hosts to add, one per line (# comments; words after the host ignored).
        #[arg(long = "add-hostfile", value_name = "FILE")]
        add_hostfile: Option<std::path::PathBuf>,
        /// Wait until every new daemon is wired in (exit 1 if the grow failed).
        #[arg(long)]
        wait: bool,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Shrink the DVM (elastic mode): the daemons on HOSTs leave. An operator's push.
    Shrink {
        /// Hosts to take out (comma-separated or separate words).
        #[arg(required = true, value_delimiter = ',', value_name = "HOST")]
        hosts: Vec<String>,
        /// Wait until they have gone (exit 1 if the shrink failed).
        #[arg(long)]
        wait: bool,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Wait until the DVM is formed (polling the controller, which may not be up yet).
    Wait {
        /// Give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 60.0)]
        within: f64,
    },
}

/// A failure and the exit status it maps to.
struct Failure(u8, String);

/// `pctl`'s command line, run by the `pctl` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let params = dvmlab_host::conf_file::tool_params(&cli.prtemca, cli.conf.as_deref());
    if !(cli.timeout.is_finite() && cli.timeout > 0.0 && cli.timeout <= 1e6) {
        eprintln!("pctl: --timeout must be a number of seconds above 0 and at most 1000000");
        return ExitCode::from(2);
    }
    let timeout = Duration::from_secs_f64(cli.timeout);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pctl: {e}");
            return ExitCode::from(3);
        }
    };
    match rt.block_on(run(cli.command, params, timeout)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, msg)) => {
            eprintln!("pctl: {msg}");
            ExitCode::from(code)
        }
    }
}

/// `pctl keygen`: the key goes to PATH, else to `DVMKeyFile`; where it went.
fn keygen(
    path: Option<std::path::PathBuf>,
    params: &Params,
) -> Result<std::path::PathBuf, Failure> {
    let path = match path {
        Some(p) => p,
        None => {
            let s = dvmlab_host::conf_file::load(params).map_err(|d| Failure(2, d.to_string()))?;
            s.key_file.map(|(p, _)| p).ok_or_else(|| {
                Failure(
                    2,
                    format!(
                        "keygen: no PATH given and {} sets no DVMKeyFile",
                        s.conf_path.display()
                    ),
                )
            })?
        }
    };
    dvmlab_host::keyfile::generate(&path).map_err(|e| Failure(1, e))?;
    Ok(path)
}

async fn connect(params: &Params, timeout: Duration) -> Result<Client, Failure> {
    connect_to_dvm(params, timeout)
        .await
        .map_err(|e| Failure(3, e))
}

async fn status(params: &Params, timeout: Duration) -> Result<StatusReport, Failure> {
    let mut c = connect(params, timeout).await?;
    match c.request(ToolRequest::Status, timeout).await {
        Ok(ToolReply::Status(s)) => Ok(s),
        Ok(other) => Err(Failure(3, format!("unexpected reply {other:?}"))),
        Err(e) => Err(Failure(3, e)),
    }
}

/// The hosts of a host file: one per line, `#` starts a comment, words after the host
/// (`slots=4`) are ignored; a bad name is named with its file and line.
fn read_hostfile(path: &std::path::Path) -> Result<Vec<String>, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure(2, format!("{}: {e}", path.display())))?;
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("");
        let Some(host) = line.split_whitespace().next() else {
            continue;
        };
        if !dvmlab_core::hostname::is_valid(host) {
            return Err(Failure(
                2,
                format!("{}:{}: {host:?} is not a host name", path.display(), i + 1),
            ));
        }
        hosts.push(host.to_string());
    }
    Ok(hosts)
}

/// Sends a grow or shrink and prints both answers (the second with `wait`).
async fn change(
    params: &Params,
    timeout: Duration,
    req: ToolRequest,
    wait: bool,
    json: bool,
) -> Result<(), Failure> {
    let mut c = connect(params, timeout).await?;
    match c.request(req, timeout).await.map_err(|e| Failure(3, e))? {
        ToolReply::Allocated {
            alloc_id,
            ranks,
            changed,
            ..
        } => {
            if json {
                print_json(
                    &serde_json::json!({"phase": "accepted", "alloc_id": alloc_id,
                    "ranks": ranks.iter().collect::<Vec<_>>(), "changed": changed}),
                )?;
            } else {
                dvmlab_host::outln!(
                    "accepted: allocation {alloc_id}, ranks [{ranks}]{}",
                    if changed { "" } else { " (nothing to change)" }
                );
            }
            if !changed || !wait {
                return Ok(());
            }
        }
        ToolReply::Error { message } => return Err(Failure(1, message)),
        other => return Err(Failure(3, format!("unexpected reply {other:?}"))),
    }
    match c.recv().await.map_err(|e| Failure(3, e))? {
        ToolReply::CampaignEnded {
            alloc_id,
            ok,
            cause,
        } => {
            let name = cause.and_then(dvmlab_proto::event::code_name);
            if json {
                print_json(&serde_json::json!({"phase": "ended", "alloc_id": alloc_id,
                    "ok": ok, "cause": cause, "cause_name": name}))?;
            } else if ok {
                dvmlab_host::outln!("done: allocation {alloc_id}");
            } else {
                dvmlab_host::outln!(
                    "failed: allocation {alloc_id}, cause {} ({})",
                    name.unwrap_or_default(),
                    cause.unwrap_or(0)
                );
            }
            if ok {
                Ok(())
            } else {
                Err(Failure(
                    1,
                    format!("the change of allocation {alloc_id} failed"),
                ))
            }
        }
        other => Err(Failure(3, format!("unexpected reply {other:?}"))),
    }
}

async fn run(cmd: Command, params: Params, timeout: Duration) -> Result<(), Failure> {
    match cmd {
        Command::Grow {
            mut add_host,
            add_hostfile,
            wait,
            json,
        } => {
            if let Some(f) = add_hostfile {
                add_host.extend(read_hostfile(&f)?);
            }
            if add_host.is_empty() {
                return Err(Failure(2, "grow: give --add-host or --add-hostfile".into()));
            }
            let req = ToolRequest::Grow {
                hosts: add_host,
                wait,
            };
            change(&params, timeout, req, wait, json).await
        }
        Command::Shrink { hosts, wait, json } => {
            change(
                &params,
                timeout,
                ToolRequest::Shrink { hosts, wait },
                wait,
                json,
            )
            .await
        }
        Command::Keygen { path } => {
            let p = keygen(path, &params)?;
            dvmlab_host::outln!("wrote a new DVM key to {}", p.display());
            Ok(())
        }
        Command::Status { json } => {
            let s = status(&params, timeout).await?;
            if json {
                print_json(&s)
            } else {
                print_table(&s);
                Ok(())
            }
        }
        Command::Ping { rank, all, json } => {
            let mut c = connect(&params, timeout).await?;
            let ranks: Vec<u32> = if all {
                let ToolReply::Status(s) = c
                    .request(ToolRequest::Status, timeout)
                    .await
                    .map_err(|e| Failure(3, e))?
                else {
                    return Err(Failure(3, "unexpected reply to status".into()));
                };
                s.members
                    .iter()
                    .filter(|m| m.state != MemberState::Departed)
                    .map(|m| m.rank)
                    .collect()
            } else {
                rank.into_iter().collect()
            };
            let mut failed = 0;
            for r in ranks {
                let rep = match c.request(ToolRequest::Ping { rank: r }, timeout).await {
                    Ok(ToolReply::Ping(p)) => p,
                    Ok(other) => return Err(Failure(3, format!("unexpected reply {other:?}"))),
                    Err(e) => return Err(Failure(3, e)),
                };
                if !rep.ok {
                    failed += 1;
                }
                if json {
                    print_json(&rep)?;
                } else {
                    print_ping(&rep);
                }
            }
            if failed > 0 {
                return Err(Failure(1, format!("{failed} ping(s) failed")));
            }
            Ok(())
        }
        Command::Stop => {
            let mut c = connect(&params, timeout).await?;
            match c
                .request(ToolRequest::Stop, timeout + node_grace())
                .await
                .map_err(|e| Failure(3, e))?
            {
                ToolReply::Stopped { unconfirmed } if unconfirmed.is_empty() => {
                    dvmlab_host::outln!("DVM stopped");
                    Ok(())
                }
                ToolReply::Stopped { unconfirmed } => Err(Failure(
                    1,
                    format!("DVM stopped, but ranks {unconfirmed:?} did not confirm"),
                )),
                ToolReply::Error { message } => Err(Failure(1, message)),
                other => Err(Failure(3, format!("unexpected reply {other:?}"))),
            }
        }
        Command::Jobs { json } => {
            let mut c = connect(&params, timeout).await?;
            let hosts: HashMap<u32, String> = match c.request(ToolRequest::Status, timeout).await {
                Ok(ToolReply::Status(s)) => {
                    s.members.into_iter().map(|m| (m.rank, m.host)).collect()
                }
                Ok(other) => return Err(Failure(3, format!("unexpected reply {other:?}"))),
                Err(e) => return Err(Failure(3, e)),
            };
            c.send(ToolRequest::Jobs).await.map_err(|e| Failure(3, e))?;
            let mut jobs = Vec::new();
            loop {
                match c.reply_within(timeout).await {
                    Ok(ToolReply::Job(j)) => jobs.push(job_report(j, &hosts)),
                    Ok(ToolReply::JobsEnd) => break,
                    Ok(ToolReply::Error { message }) => return Err(Failure(1, message)),
                    Ok(other) => return Err(Failure(3, format!("unexpected reply {other:?}"))),
                    Err(e) => return Err(Failure(3, e)),
                }
            }
            if json {
                print_json(&jobs)
            } else {
                print_jobs(&jobs);
                Ok(())
            }
        }
        Command::Kill { job, signal } => {
            let sig = parse_signal(&signal)
                .ok_or_else(|| Failure(2, format!("{signal}: not a signal name or number")))?;
            let mut c = connect(&params, timeout).await?;
            match c
                .request(
                    ToolRequest::Kill {
                        id: job,
                        signal: sig,
                    },
                    timeout,
                )
                .await
            {
                Ok(ToolReply::Signalled { .. }) => Ok(()),
                Ok(ToolReply::Error { message }) => Err(Failure(1, message)),
                Ok(other) => Err(Failure(3, format!("unexpected reply {other:?}"))),
                Err(e) => Err(Failure(3, e)),
            }
        }
        Command::Wait { within } => {
            if !(within.is_finite() && (0.0..=1e6).contains(&within)) {
                return Err(Failure(
                    2,
                    "--within must be a number of seconds from 0 to 1000000".into(),
                ));
            }
            let deadline = Instant::now() + Duration::from_secs_f64(within);
            let mut last: String;
            loop {
                match status(&params, timeout.min(Duration::from_secs(2))).await {
                    Ok(s) if s.formed => {
                        dvmlab_host::outln!("DVM {} formed: {} daemons", s.namespace, s.expected);
                        return Ok(());
                    }
                    Ok(s) => last = format!("{} of {} daemons joined", s.joined, s.expected),
                    Err(Failure(_, e)) => last = e,
                }
                if Instant::now() >= deadline {
                    return Err(Failure(
                        1,
                        format!("DVM not formed within {within}s: {last}"),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn node_grace() -> Duration {
    dvmlab_core::overlay::CONTROLLER_STOP_GRACE
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<(), Failure> {
    let s = serde_json::to_string(v).map_err(|e| Failure(3, e.to_string()))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}").map_err(|e| Failure(3, e.to_string()))
}

fn print_table(s: &StatusReport) {
    dvmlab_host::outln!(
        "DVM {}: {} ({}/{} daemons joined), radix {}",
        s.namespace,
        if s.formed { "formed" } else { "NOT formed" },
        s.joined,
        s.expected,
        s.radix
    );
    dvmlab_host::outln!("controller {} {}", s.controller_host, s.controller_uri);
    if s.authenticated {
        dvmlab_host::outln!("links      authenticated and encrypted with the DVM key");
    } else {
        dvmlab_host::outln!(
            "links      UNAUTHENTICATED: no DVMKeyFile, anyone who reaches DVMPort can join, run jobs or stop the DVM"
        );
    }
    if s.elastic {
        if s.campaigns.is_empty() {
            dvmlab_host::outln!("elastic    no size change in progress");
        }
        for c in &s.campaigns {
            dvmlab_host::outln!(
                "elastic    {} {} ({}): ranks {:?}, {} of {} {}",
                c.kind,
                c.id,
                c.alloc_id,
                c.targets,
                c.done.len(),
                c.targets.len(),
                if c.kind == "grow" { "wired" } else { "gone" }
            );
        }
    }
    let w = s
        .members
        .iter()
        .map(|m| m.host.len())
        .max()
        .unwrap_or(4)
        .max(4);
    dvmlab_host::outln!(
        "{:>6}  {:<w$}  {:>6}  {:>11}  STATE",
        "RANK",
        "HOST",
        "PARENT",
        "TREE-PARENT"
    );
    let opt = |o: Option<u32>| o.map_or("-".to_string(), |v| v.to_string());
    for m in &s.members {
        let state = match m.state {
            MemberState::Joined => "joined",
            MemberState::Waiting => "waiting",
            MemberState::Joining => "joining",
            MemberState::Lost => "lost",
            MemberState::Departing => "departing",
            MemberState::Departed => "departed",
        };
        dvmlab_host::outln!(
            "{:>6}  {:<w$}  {:>6}  {:>11}  {}",
            m.rank,
            m.host,
            opt(m.parent),
            opt(m.tree_parent),
            state
        );
    }
}

/// `TERM`, `SIGTERM` or `15`.
fn parse_signal(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n).ok().map(|_| n);
    }
    let name = if s.starts_with("SIG") {
        s.to_string()
    } else {
        format!("SIG{s}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|sig| sig as i32)
}

/// The contract's shape of a job: its placement written out process by process.
fn job_report(j: JobSummary, hosts: &HashMap<u32, String>) -> JobReport {
    let placement = (0..j.placement.nprocs)
        .map(|proc| {
            let rank = j.placement.rank_of(proc);
            ProcPlace {
                proc,
                rank,
                host: hosts.get(&rank).cloned().unwrap_or_default(),
            }
        })
        .collect();
    JobReport {
        id: j.id,
        state: j.state,
        argv: j.argv,
        nprocs: j.placement.nprocs,
        placement,
        status: j.status,
        exception: j.exception,
    }
}

fn print_jobs(jobs: &[JobReport]) {
    dvmlab_host::outln!(
        "{:>6}  {:<9}  {:>6}  {:>6}  COMMAND / PLACEMENT",
        "ID",
        "STATE",
        "NPROCS",
        "STATUS"
    );
    for j in jobs {
        dvmlab_host::outln!(
            "{:>6}  {:<9}  {:>6}  {:>6}  {}",
            j.id,
            j.state,
            j.nprocs,
            j.status.map_or("-".to_string(), |s| s.to_string()),
            j.argv.join(" ")
        );
        let places: Vec<String> = j
            .placement
            .iter()
            .map(|p| format!("{}:{}({})", p.proc, p.host, p.rank))
            .collect();
        dvmlab_host::outln!("{:>35}{}", "", places.join(" "));
        if let Some(e) = &j.exception {
            dvmlab_host::outln!("{:>35}exception {e}", "");
        }
    }
}

fn print_ping(p: &PingReport) {
    match (p.ok, p.rtt_us) {
        (true, Some(us)) => dvmlab_host::outln!(
            "rank {} ({}): {:.3} ms via {}",
            p.rank,
            p.host,
            us as f64 / 1000.0,
            p.path
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" > ")
        ),
        _ => dvmlab_host::outln!(
            "rank {} ({}): FAILED: {}",
            p.rank,
            p.host,
            p.error.as_deref().unwrap_or("no answer")
        ),
    }
}
