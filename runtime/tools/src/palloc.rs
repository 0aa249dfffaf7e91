//! `palloc`: ask the DVM for a change of size as a PMIx requester would (an allocation
//! request, directive NEW, EXTEND or RELEASE) and follow it through both phases: the
//! synchronous answer, then the one terminal event.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

use crate::client::served_by_us;
use dvmlab_core::conf::Params;
use dvmlab_proto::event::{
    code_name, Directives, EventDown, EventUp, Status, ALLOC_ID, ALLOC_REQ_ID, DVM_IS_READY,
    ERR_DVM_MOD, JOB_TERM_STATUS,
};
use dvmlab_proto::wire::{Directive, Frame, FrameCodec, Hello, Peer, ToolReply, ToolRequest};

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
/// It runs on a node of the DVM (the daemon there relays the request to the controller and
/// hands it the event).
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

/// The next frame from the daemon `name`, before `deadline`.
async fn next(
    framed: &mut Framed<UnixStream, FrameCodec>,
    deadline: tokio::time::Instant,
    name: &str,
) -> Result<Frame, (u8, String)> {
    match tokio::time::timeout_at(deadline, framed.next()).await {
        Err(_) => Err((1, "no answer or terminal event before --timeout".into())),
        Ok(None) => Err((3, format!("{name} closed the connection"))),
        Ok(Some(Err(e))) => Err((3, format!("{name}: {e}"))),
        Ok(Some(Ok(f))) => Ok(f),
    }
}

/// The registration palloc makes for the two completion events.
const REGISTRATION: u64 = 1;

async fn run(cli: Cli) -> Result<u8, (u8, String)> {
    let params = Params::for_tool(&cli.prtemca, cli.conf.as_deref(), std::env::vars());
    let connect = Duration::from_secs(10);
    let p = dvmlab_host::bootstrap::Prepared::new(&params)
        .map_err(|e| (3, format!("palloc runs on a node of the DVM: {e}")))?;
    let socket = p.settings.tool_socket(&p.identity.host, p.identity.rank);
    let name = format!("the daemon of this node at {}", socket.display());
    let stream = tokio::time::timeout(connect, UnixStream::connect(&socket))
        .await
        .map_err(|_| (3, format!("{name} did not answer within {connect:?}")))?
        .map_err(|e| (3, format!("cannot reach {name}: {e}")))?;
    served_by_us(&stream, &name).map_err(|e| (3, e))?;
    let mut framed = Framed::new(stream, FrameCodec::default());
    framed
        .send(Frame::Hello(Hello::new(&p.identity.nspace, Peer::Tool)))
        .await
        .map_err(|e| (3, format!("{name}: {e}")))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(cli.timeout.max(0.0));
    match next(&mut framed, deadline, &name).await? {
        Frame::Welcome { .. } => framed.codec_mut().accepted(),
        Frame::Refuse { reason } => return Err((3, format!("{name} refused: {reason}"))),
        other => return Err((3, format!("{name} answered hello with {other:?}"))),
    }
    // Registered before the request goes out, so the event cannot come first.
    framed
        .send(Frame::Event(EventUp::Register {
            id: REGISTRATION,
            codes: vec![DVM_IS_READY, ERR_DVM_MOD],
            directives: Directives::default(),
        }))
        .await
        .map_err(|e| (3, format!("{name}: {e}")))?;
    match next(&mut framed, deadline, &name).await? {
        Frame::EventDown(EventDown::Registered { .. }) => {}
        Frame::EventDown(EventDown::Refused { reason, .. }) => {
            return Err((
                3,
                format!("{name} refused the event registration: {reason}"),
            ))
        }
        other => {
            return Err((
                3,
                format!("{name} answered the registration with {other:?}"),
            ))
        }
    }
    let directive = match cli.directive {
        DirectiveArg::New => Directive::New,
        DirectiveArg::Extend => Directive::Extend,
        DirectiveArg::Release => Directive::Release,
    };
    framed
        .send(Frame::Tool(ToolRequest::Alloc {
            directive,
            hosts: cli.hosts.clone(),
            alloc_id: cli.alloc_id.clone(),
            req_id: cli.request_id.clone(),
        }))
        .await
        .map_err(|e| (3, format!("{name}: {e}")))?;
    let mut alloc = None;
    let mut first: Option<Status> = None;
    let mut linger_until: Option<tokio::time::Instant> = None;
    loop {
        let frame = match linger_until {
            Some(until) => match tokio::time::timeout_at(until, framed.next()).await {
                Err(_) | Ok(None) | Ok(Some(Err(_))) => {
                    return Ok(if first == Some(DVM_IS_READY) { 0 } else { 1 })
                }
                Ok(Some(Ok(f))) => f,
            },
            None => next(&mut framed, deadline, &name).await?,
        };
        match frame {
            Frame::ToolReply(ToolReply::Allocated {
                alloc_id,
                status,
                ranks,
                changed,
            }) => {
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
                alloc = Some(alloc_id);
            }
            Frame::ToolReply(ToolReply::Error { message }) => {
                if cli.json {
                    println!("{}", json!({"phase": "rejected", "error": message}));
                } else {
                    println!("rejected: {message}");
                }
                return Ok(1);
            }
            Frame::EventDown(EventDown::Deliver { event })
                if event.code == DVM_IS_READY || event.code == ERR_DVM_MOD =>
            {
                let get = |key: &str| {
                    event
                        .info
                        .iter()
                        .find(|i| i.key == key)
                        .map(|i| i.value.clone())
                };
                let id = get(ALLOC_ID);
                // Another request of this connection's would carry another id.
                if alloc.is_some() && id.as_ref().and_then(|v| v.as_str()) != alloc.as_deref() {
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
                let code = *first.get_or_insert(event.code);
                if cli.linger <= 0.0 {
                    return Ok(if code == DVM_IS_READY { 0 } else { 1 });
                }
                if linger_until.is_none() {
                    linger_until =
                        Some(tokio::time::Instant::now() + Duration::from_secs_f64(cli.linger));
                }
            }
            // Anything else on this connection (another event, a stray reply) is not ours.
            _ => {}
        }
    }
}
