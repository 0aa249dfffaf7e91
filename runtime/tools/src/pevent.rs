//! `pevent`: listen for PMIx events with handlers described on the command line or in a
//! JSON chain file, printing one JSON line per handler call; or notify an event.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::events::{Events, Step};
use dvmlab_proto::event::{parse_code, Completion, Directives, Info, Proc, Range, Status};

/// Listen for PMIx events on this node, or notify one (PMIx RFC 0002).
///
/// `pevent listen` registers the handlers given with --handler (or in a --chain file) and
/// prints one JSON line when they are registered ({"ready": true, "me": the job process it
/// is, or null for a tool, "registrations": ...}), then one per handler
/// call: the handler's name and registration id, the event's code, source and info, and the
/// results array it was given (one entry per earlier handler of the chain); then what it
/// returned. `pevent notify CODE` sends an event. Codes and ranges are numbers or PMIx names
/// (-231, PMIX_EVENT_NODE_DOWN; 3, NAMESPACE).
///
/// Inside a job, pevent is one of the job's processes (it finds its daemon and identity in
/// DVMLAB_EVENTS, DVMLAB_NSPACE and DVMLAB_PROC); elsewhere on a node of the DVM it is a tool.
///
/// Exit status: 0; 1 when --count events were not served before --timeout; 2 for a usage
/// error; 3 when the daemon cannot be reached or refuses.
#[derive(Parser, Debug)]
#[command(name = "pevent", version, verbatim_doc_comment)]
struct Cli {
    /// The prte.conf to read (tools outside a job).
    #[arg(long, value_name = "PATH", global = true)]
    conf: Option<String>,

    /// Set an MCA-style parameter, as for prted; may be repeated.
    #[arg(long, num_args = 2, value_names = ["NAME", "VALUE"], action = clap::ArgAction::Append, global = true)]
    prtemca: Vec<String>,

    /// Seconds to wait for the daemon to answer.
    #[arg(long, default_value_t = 10.0, global = true)]
    connect_timeout: f64,

    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Register handlers and print each call as a JSON line.
    Listen {
        /// A handler: comma-separated NAME=VALUE pairs among name, codes (colon-separated),
        /// status (what it returns: NO_ACTION_TAKEN, PARTIAL_ACTION_TAKEN, ACTION_DEFERRED,
        /// ACTION_COMPLETE), job (true/false), env (true/false), prepend, results (KEY:VALUE
        /// pairs separated by ';'), delay-ms (how long before it completes). May be repeated;
        /// registered in order.
        #[arg(long, value_name = "SPEC")]
        handler: Vec<String>,

        /// A JSON file: an array of handlers, each {"name", "codes", "status", "job_level",
        /// "enviro_level", "prepend", "results": [{"key", "value"}], "delay_ms",
        /// "register_delay_ms", "deregister", "rank" (only that job process registers it)},
        /// registered before the --handler ones; and of notifications to send once they
        /// are, each {"notify": {"code", "range", "targets": [{"nspace", "rank"}], "info",
        /// "rank" (only that job process sends it), "after_ms", "on" (send it each time an
        /// event of this code went through the chain)}}.
        #[arg(long, value_name = "FILE")]
        chain: Option<String>,

        /// Exit once this many events went through the chain.
        #[arg(long)]
        count: Option<u64>,

        /// Exit (1 if --count was not reached) after this many seconds.
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
    },
    /// Notify an event.
    Notify {
        /// The event's code: a number or a PMIx name.
        #[arg(allow_hyphen_values = true)]
        code: String,
        /// Who receives it: PROC_LOCAL, LOCAL, NAMESPACE, SESSION, GLOBAL, RM, CUSTOM (or
        /// the number).
        #[arg(long, default_value = "SESSION")]
        range: String,
        /// A target of a CUSTOM range, NSPACE:RANK (NSPACE:* for every process of the job);
        /// may be repeated.
        #[arg(long, value_name = "NSPACE:RANK")]
        target: Vec<String>,
        /// Info to carry, KEY=VALUE (the value as JSON if it parses, else a string); may be
        /// repeated.
        #[arg(long, value_name = "KEY=VALUE")]
        info: Vec<String>,
        /// Print {"notified": CODE, "sent_us": ...} (microseconds since the Unix epoch, just
        /// before it was sent) once the daemon accepted it.
        #[arg(long)]
        json: bool,
    },
}

/// Now, in microseconds since the Unix epoch (the lines' `at_us` and `sent_us`, so delivery
/// can be timed across processes on one machine).
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One handler of a listener's chain.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub codes: Vec<Status>,
    #[serde(default)]
    pub status: Completion,
    #[serde(default)]
    pub job_level: Option<bool>,
    #[serde(default)]
    pub enviro_level: Option<bool>,
    #[serde(default)]
    pub prepend: bool,
    #[serde(default)]
    pub results: Vec<Info>,
    #[serde(default)]
    pub delay_ms: u64,
    /// Wait this long after connecting (and after the handlers before it) to register.
    #[serde(default)]
    pub register_delay_ms: u64,
    /// The handler deregisters itself when called, before it completes.
    #[serde(default)]
    pub deregister: bool,
    /// Only the job process of this rank registers it (every listener, without one).
    #[serde(default)]
    pub rank: Option<u32>,
}

/// A notification a listener sends once its handlers are registered (a chain file entry
/// `{"notify": {...}}`): by the job process of rank `rank` only (any, and tools, without
/// one), `after_ms` after the ready line or the notification before it, or, with `on`, each
/// time an event of that code went through its chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySpec {
    pub code: Status,
    pub range: String,
    #[serde(default)]
    pub targets: Vec<Proc>,
    #[serde(default)]
    pub info: Vec<Info>,
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub after_ms: u64,
    #[serde(default)]
    pub on: Option<Status>,
}

/// A chain file: handlers, and notifications to send once they are registered.
pub fn parse_chain(text: &str) -> Result<(Vec<HandlerSpec>, Vec<NotifySpec>), String> {
    let entries: Vec<Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON array: {e}"))?;
    let (mut handlers, mut notes) = (Vec::new(), Vec::new());
    for (i, e) in entries.into_iter().enumerate() {
        match e.get("notify") {
            Some(_) if e.as_object().is_some_and(|o| o.len() > 1) => {
                return Err(format!(
                    "entry {i}: a notification is {{\"notify\": {{...}}}} and nothing beside it"
                ))
            }
            Some(n) => {
                let n: NotifySpec = serde_json::from_value(n.clone())
                    .map_err(|err| format!("entry {i} (a notify): {err}"))?;
                if Range::parse(&n.range).is_none() {
                    return Err(format!(
                        "entry {i}: range {:?} is not a PMIx range",
                        n.range
                    ));
                }
                notes.push(n);
            }
            None => handlers.push(
                serde_json::from_value(e).map_err(|err| format!("entry {i} (a handler): {err}"))?,
            ),
        }
    }
    Ok((handlers, notes))
}

fn boolean(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{key}={v}: expected true or false")),
    }
}

/// A JSON value if `v` is one, else `v` as a string.
fn value(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

/// Parses a `--handler` spec.
pub fn parse_handler(spec: &str) -> Result<HandlerSpec, String> {
    let mut h = HandlerSpec::default();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        match k {
            "name" => h.name = Some(v.to_string()),
            "codes" => {
                h.codes = v
                    .split(':')
                    .filter(|c| !c.is_empty())
                    .map(|c| parse_code(c).ok_or_else(|| format!("codes: {c:?} is not a code")))
                    .collect::<Result<_, _>>()?
            }
            "status" => {
                h.status = Completion::parse(v)
                    .ok_or_else(|| format!("status={v}: not a handler status"))?
            }
            "job" => h.job_level = Some(boolean(k, v)?),
            "env" => h.enviro_level = Some(boolean(k, v)?),
            "prepend" => h.prepend = v.is_empty() || boolean(k, v)?,
            "results" => {
                h.results = v
                    .split(';')
                    .filter(|r| !r.is_empty())
                    .map(|r| {
                        let (key, val) = r
                            .split_once(':')
                            .ok_or_else(|| format!("results: {r:?} is not KEY:VALUE"))?;
                        Ok(Info {
                            key: key.to_string(),
                            value: value(val),
                        })
                    })
                    .collect::<Result<_, String>>()?
            }
            "delay-ms" => {
                h.delay_ms = v
                    .parse()
                    .map_err(|_| format!("delay-ms={v}: not a number of milliseconds"))?
            }
            "register-delay-ms" => {
                h.register_delay_ms = v
                    .parse()
                    .map_err(|_| format!("register-delay-ms={v}: not a number of milliseconds"))?
            }
            "deregister" => h.deregister = v.is_empty() || boolean(k, v)?,
            other => return Err(format!("{spec}: unknown handler key {other:?}")),
        }
    }
    Ok(h)
}

/// `pevent`'s command line, run by the `pevent` binary.
pub fn main() -> ExitCode {
    crate::run_tool("pevent", run(Cli::parse()))
}

fn line(v: Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

async fn run(cli: Cli) -> Result<u8, (u8, String)> {
    if !(cli.connect_timeout.is_finite() && cli.connect_timeout > 0.0) {
        return Err((
            2,
            "--connect-timeout must be a number of seconds above 0".into(),
        ));
    }
    let params = dvmlab_host::conf_file::tool_params(&cli.prtemca, cli.conf.as_deref());
    match cli.what {
        What::Notify {
            code,
            range,
            target,
            info,
            json,
        } => {
            let code = parse_code(&code).ok_or((2, format!("{code:?} is not an event code")))?;
            let range = Range::parse(&range).ok_or((2, format!("--range {range}: not a range")))?;
            let targets = target
                .iter()
                .map(|t| {
                    let (ns, r) = t
                        .rsplit_once(':')
                        .ok_or((2, format!("--target {t}: expected NSPACE:RANK")))?;
                    let rank = match r {
                        "*" => dvmlab_proto::event::RANK_WILDCARD,
                        _ => r
                            .parse()
                            .map_err(|_| (2, format!("--target {t}: {r:?} is not a rank or *")))?,
                    };
                    Ok(Proc {
                        nspace: ns.to_string(),
                        rank,
                    })
                })
                .collect::<Result<Vec<_>, (u8, String)>>()?;
            let info = info
                .iter()
                .map(|i| {
                    let (k, v) = i
                        .split_once('=')
                        .ok_or((2, format!("--info {i}: expected KEY=VALUE")))?;
                    Ok(Info {
                        key: k.to_string(),
                        value: value(v),
                    })
                })
                .collect::<Result<Vec<_>, (u8, String)>>()?;
            let mut ev = Events::connect(&params, Duration::from_secs_f64(cli.connect_timeout))
                .await
                .map_err(|e| (3, e))?;
            let sent_us = unix_us();
            ev.notify(code, range, targets, info)
                .await
                .map_err(|e| (3, e))?;
            if json {
                line(json!({"notified": code, "sent_us": sent_us}));
            }
            Ok(0)
        }
        What::Listen {
            handler,
            chain,
            count,
            timeout,
        } => {
            let (mut specs, notes) = match chain {
                None => (Vec::new(), Vec::new()),
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| (2, format!("--chain {path}: {e}")))?;
                    parse_chain(&text).map_err(|e| (2, format!("--chain {path}: {e}")))?
                }
            };
            for h in &handler {
                specs.push(parse_handler(h).map_err(|e| (2, format!("--handler {e}")))?);
            }
            if specs.is_empty() {
                return Err((2, "listen needs at least one --handler or a --chain".into()));
            }
            let deadline = match timeout {
                Some(t) if t.is_finite() && t > 0.0 => {
                    Some(tokio::time::Instant::now() + Duration::from_secs_f64(t))
                }
                Some(_) => return Err((2, "--timeout must be a number of seconds above 0".into())),
                None => None,
            };
            let mut ev = Events::connect(&params, Duration::from_secs_f64(cli.connect_timeout))
                .await
                .map_err(|e| (3, e))?;
            // The deadline bounds everything: registering, handlers' delays, answers.
            let run = listen(&mut ev, specs, notes, count);
            match deadline {
                Some(d) => tokio::time::timeout_at(d, run)
                    .await
                    .unwrap_or(Ok(if count.is_some() { 1 } else { 0 })),
                None => run.await,
            }
        }
    }
}

async fn listen(
    ev: &mut Events,
    specs: Vec<HandlerSpec>,
    notes: Vec<NotifySpec>,
    count: Option<u64>,
) -> Result<u8, (u8, String)> {
    line(json!({"connected": true, "me": ev.me()}));
    let mut by_id = std::collections::BTreeMap::new();
    let mut ids = Vec::new();
    let my_rank = ev.me().map(|p| p.rank);
    for h in specs {
        if h.rank.is_some() && h.rank != my_rank {
            continue;
        }
        if h.register_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(h.register_delay_ms)).await;
        }
        let id = ev
            .register(
                h.codes.clone(),
                Directives {
                    name: h.name.clone(),
                    job_level: h.job_level,
                    enviro_level: h.enviro_level,
                    prepend: h.prepend,
                },
            )
            .await
            .map_err(|e| (3, e))?;
        ids.push(json!({"id": id, "name": h.name}));
        by_id.insert(id, h);
    }
    line(json!({"ready": true, "me": ev.me(), "registrations": ids}));
    let mine: Vec<&NotifySpec> = notes
        .iter()
        .filter(|n| n.rank.is_none() || n.rank == my_rank)
        .collect();
    for n in mine.iter().filter(|n| n.on.is_none()) {
        send(ev, n).await?;
    }
    let mut served = 0u64;
    if count == Some(0) {
        return Ok(0);
    }
    loop {
        match ev.next().await.map_err(|e| (3, e))? {
            Step::Invoke(inv) => {
                let Some(h) = by_id.get(&inv.reg) else {
                    continue;
                };
                line(json!({
                    "handler": h.name,
                    "id": inv.reg,
                    "code": inv.event.code,
                    "source": inv.event.source,
                    "info": inv.event.info,
                    "results": inv.results.iter().map(|r| r.to_info()).collect::<Vec<_>>(),
                    "returns": h.status,
                    "at_us": unix_us(),
                }));
                if h.deregister {
                    ev.deregister(inv.reg).await.map_err(|e| (3, e))?;
                }
                if h.delay_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(h.delay_ms)).await;
                }
                ev.done(inv.reg, h.status, h.results.clone())
                    .await
                    .map_err(|e| (3, e))?;
            }
            Step::Served {
                event,
                results,
                internal,
            } => {
                line(json!({
                    "served": event.code,
                    "handlers": results.iter().map(|r| r.to_info()).collect::<Vec<_>>(),
                    "internal": internal,
                }));
                for n in mine.iter().filter(|n| n.on == Some(event.code)) {
                    send(ev, n).await?;
                }
                // The lost-server event is this process's own, not one it was sent: the
                // daemon is gone, and the next step says so.
                if internal {
                    continue;
                }
                served += 1;
                if count.is_some_and(|c| served >= c) {
                    return Ok(0);
                }
            }
            Step::Refused { id, reason } => {
                return Err((3, format!("registration {id} refused: {reason}")))
            }
        }
    }
}

/// Sends the notification `n` describes, `after_ms` from now, and says so.
async fn send(ev: &mut Events, n: &NotifySpec) -> Result<(), (u8, String)> {
    if n.after_ms > 0 {
        tokio::time::sleep(Duration::from_millis(n.after_ms)).await;
    }
    let range = Range::parse(&n.range).unwrap_or(Range::Undef);
    let sent_us = unix_us();
    ev.notify(n.code, range, n.targets.clone(), n.info.clone())
        .await
        .map_err(|e| (3, e))?;
    line(json!({"notified": n.code, "range": n.range, "sent_us": sent_us}));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_specs_parse_and_bad_ones_name_what_is_wrong() {
        let h = parse_handler(
            "name=h1,codes=-231:PMIX_ERR_PROC_ABORTED,status=ACTION_COMPLETE,env=true,prepend,results=k:1;s:x,delay-ms=20",
        )
        .unwrap();
        assert_eq!(h.name.as_deref(), Some("h1"));
        assert_eq!(h.codes, [-231, -7]);
        assert_eq!(h.status, Completion::ActionComplete);
        assert_eq!(
            (h.enviro_level, h.prepend, h.delay_ms),
            (Some(true), true, 20)
        );
        assert_eq!(h.results[0].value, json!(1));
        assert_eq!(h.results[1].value, json!("x"));
        for (bad, says) in [
            ("codes=nope", "nope"),
            ("status=MAYBE", "MAYBE"),
            ("colour=red", "colour"),
            ("job=perhaps", "job=perhaps"),
            ("delay-ms=soon", "delay-ms"),
        ] {
            let e = parse_handler(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
