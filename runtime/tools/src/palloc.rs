//! `palloc`: ask the DVM for a change of size as a PMIx requester would (an allocation
//! request, directive NEW, EXTEND or RELEASE) and follow it through both phases: the
//! synchronous answer, then the one terminal event.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde_json::json;

use crate::events::{Events, Step};
use dvmlab_core::conf::Params;
use dvmlab_proto::event::{
    code_name, Completion, Directives, Status, ALLOC_ID, ALLOC_REQ_ID, DVM_IS_READY, ERR_DVM_MOD,
    JOB_TERM_STATUS,
};
use dvmlab_proto::wire::{Directive, ToolReply};

/// Ask the DVM to grow or shrink, as a PMIx allocation request, and wait for the outcome.
///
/// `palloc new --host H1,H2` adds hosts as a new allocation, `palloc extend --alloc-id ID
/// --host H` adds hosts to an allocation, `palloc release --host H | --alloc-id ID` takes
/// hosts out. palloc registers for PMIX_DVM_IS_READY (-195) and PMIX_ERR_DVM_MOD (-196) on
/// this node's daemon, sends the request, prints the synchronous answer (accepted, with the
/// allocation id and the ranks that change, or rejected with the reason), then waits for
/// the terminal event and prints its name, code, both ids and any cause. With --json, each
/// is a JSON line: {"phase": "accepted"|"rejected"|"event", ...}.
///
/// It runs on a node of the DVM, as a tool, or inside a job, as that job process (then the
/// process is the requester); the node's daemon relays the request to the controller and
/// hands it the event.
///
/// Exit status: 0 when the change is done (PMIX_DVM_IS_READY, or accepted with nothing to
/// change); 1 when it was rejected or failed (PMIX_ERR_DVM_MOD), or no event came before
/// --timeout; 2 for a usage error; 3 when the daemon cannot be reached.
#[derive(Parser, Debug)]
#[command(name = "palloc", version, verbatim_doc_comment)]
struct Cli {
    /// NEW (1), EXTEND (2) or RELEASE (3).
    #[arg(value_enum)]
    directive: DirectiveArg,

    /// Hosts to add or release, comma-separated; may be repeated.
    #[arg(long = "host", value_delimiter = ',', value_name = "HOST")]
    hosts: Vec<String>,

    /// The allocation to extend or release.
    #[arg(long, value_name = "ID")]
    alloc_id: Option<String>,

    /// The requester's own id for the request (PMIX_ALLOC_REQ_ID), carried by the event.
    #[arg(long, visible_alias = "req-id", value_name = "ID")]
    request_id: Option<String>,

    /// Print JSON lines.
    #[arg(long)]
    json: bool,

    /// Seconds to wait for the terminal event.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,

    /// Keep listening this many seconds after the terminal event, printing any other
    /// terminal event that arrives (there should be none: one per request).
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    linger: f64,

    /// The prte.conf to read.
    #[arg(long, value_name = "PATH")]
    conf: Option<String>,

    /// Set an MCA-style parameter, as for prted; may be repeated.
    #[arg(long, num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append)]
    prtemca: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DirectiveArg {
    New,
    Extend,
    Release,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::run_tool("palloc", run(cli))
}

/// Now, in microseconds since the Unix epoch (when an event arrived, to order it against
/// what other processes of the machine saw).
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

async fn run(cli: Cli) -> Result<u8, (u8, String)> {
    for (name, v) in [("--timeout", cli.timeout), ("--linger", cli.linger)] {
        if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
            return Err((
                2,
                format!("{name} must be a number of seconds from 0 to 1000000"),
            ));
        }
    }
    let params = Params::for_tool(&cli.prtemca, cli.conf.as_deref(), std::env::vars());
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(cli.timeout.max(0.0));
    // As the job process the environment names, or else as a tool of this node.
    let mut ev = Events::connect(&params, Duration::from_secs(10))
        .await
        .map_err(|e| (3, e))?;
    // Registered before the request goes out, so the event cannot come first.
    let reg = ev
        .register(vec![DVM_IS_READY, ERR_DVM_MOD], Directives::default())
        .await
        .map_err(|e| (3, e))?;
    let directive = match cli.directive {
        DirectiveArg::New => Directive::New,
        DirectiveArg::Extend => Directive::Extend,
        DirectiveArg::Release => Directive::Release,
    };
    let answer = tokio::time::timeout_at(
        deadline,
        ev.alloc(
            directive,
            cli.hosts.clone(),
            cli.alloc_id.clone(),
            cli.request_id.clone(),
        ),
    )
    .await
    .map_err(|_| (1, "no answer before --timeout".to_string()))?
    .map_err(|e| (3, e))?;
    let alloc = match answer {
        ToolReply::Allocated {
            alloc_id,
            status,
            ranks,
            changed,
        } => {
            if cli.json {
                println!(
                    "{}",
                    json!({"phase": "accepted", "directive": directive.number(), "status": status,
                           "alloc_id": alloc_id, "req_id": cli.request_id,
                           "ranks": ranks.iter().collect::<Vec<_>>(), "changed": changed})
                );
            } else {
                println!(
                    "accepted: allocation {alloc_id}, status {status}, ranks [{ranks}]{}",
                    if changed { "" } else { " (nothing to change)" }
                );
            }
            if !changed {
                return Ok(0);
            }
            alloc_id
        }
        ToolReply::Error { message } => {
            if cli.json {
                println!("{}", json!({"phase": "rejected", "error": message}));
            } else {
                println!("rejected: {message}");
            }
            return Ok(1);
        }
        other => return Err((3, format!("unexpected answer {other:?}"))),
    };
    let mut first: Option<Status> = None;
    let mut until = deadline;
    let exit = |first: Option<Status>| if first == Some(DVM_IS_READY) { 0 } else { 1 };
    loop {
        let step = match tokio::time::timeout_at(until, ev.next()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if first.is_none() => return Err((3, e)),
            Err(_) if first.is_none() => {
                return Err((1, "no terminal event before --timeout".into()))
            }
            _ => return Ok(exit(first)),
        };
        let Step::Invoke(inv) = step else {
            continue;
        };
        ev.done(inv.reg, Completion::NoActionTaken, vec![])
            .await
            .map_err(|e| (3, e))?;
        let event = inv.event;
        let get = |key: &str| {
            event
                .info
                .iter()
                .find(|i| i.key == key)
                .map(|i| i.value.clone())
        };
        let id = get(ALLOC_ID);
        // Another request of this process's would carry another id.
        if inv.reg != reg || id.as_ref().and_then(|v| v.as_str()) != Some(alloc.as_str()) {
            continue;
        }
        let cause: Option<Status> = get(JOB_TERM_STATUS)
            .and_then(|v| v.as_i64())
            .map(|c| c as Status);
        let name = code_name(event.code).unwrap_or_default();
        if cli.json {
            println!(
                "{}",
                json!({"phase": "event", "name": name, "code": event.code,
                       "alloc_id": id, "req_id": get(ALLOC_REQ_ID), "cause": cause,
                       "cause_name": cause.and_then(code_name), "at_us": unix_us()})
            );
        } else {
            let cause = cause
                .map(|c| format!(", cause {} ({c})", code_name(c).unwrap_or_default()))
                .unwrap_or_default();
            println!(
                "{name} ({}): allocation {}, request {}{cause}",
                event.code,
                id.map_or("-".into(), |v| v.to_string()),
                get(ALLOC_REQ_ID).map_or("-".into(), |v| v.to_string()),
            );
        }
        first.get_or_insert(event.code);
        if cli.linger <= 0.0 {
            return Ok(exit(first));
        }
        if until == deadline {
            until = tokio::time::Instant::now() + Duration::from_secs_f64(cli.linger);
        }
    }
}
