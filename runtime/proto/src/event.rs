//! PMIx events as data (RFC 0002): PMIx's names and numbers (handler statuses, event codes
//! and data ranges, from the specs README), what an event, a registration's directives and
//! a handler's result are, and the messages a job process or tool and its daemon exchange
//! about them. Tools accept a code by number or by name (`-231`, `PMIX_EVENT_NODE_DOWN`,
//! `EVENT_NODE_DOWN`), as OpenPMIx's own `pevent` does. The state machines are in
//! `dvmlab-core`'s `event` module.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A PMIx status: an event's code, or what a handler returns.
pub type Status = i32;

pub const EVENT_NO_ACTION_TAKEN: Status = -331;
pub const EVENT_PARTIAL_ACTION_TAKEN: Status = -332;
pub const EVENT_ACTION_DEFERRED: Status = -333;
pub const EVENT_ACTION_COMPLETE: Status = -334;
pub const ERR_EVENT_REGISTRATION: Status = -144;

pub const ERR_PROC_ABORTED: Status = -7;
pub const ERR_PROC_REQUESTED_ABORT: Status = -8;
pub const ERR_PROC_ABORTING: Status = -9;
pub const ERR_UNREACH: Status = -25;
pub const ERR_LOST_CONNECTION: Status = -61;
pub const EVENT_JOB_END: Status = -145;
pub const EVENT_PROC_TERMINATED: Status = -201;
pub const EVENT_NODE_DOWN: Status = -231;
pub const ERR_TIMEOUT: Status = -24;
/// An elastic change completed: the DVM has its new size (the requester alone hears it).
pub const DVM_IS_READY: Status = -195;
/// An elastic change failed; the cause is in `pmix.job.term.status`.
pub const ERR_DVM_MOD: Status = -196;
/// dvmlab's own cause for a failed grow: the launch agent failed, or the new daemon exited
/// before it was wired (codes below −3000 are free for external use).
pub const DVMLAB_ERR_LAUNCH: Status = -3001;

/// Info keys of the elastic completion events.
pub const ALLOC_ID: &str = "pmix.alloc.id";
pub const ALLOC_REQ_ID: &str = "pmix.alloc.reqid";
pub const JOB_TERM_STATUS: &str = "pmix.job.term.status";

/// Every code with a name, for parsing and printing.
const NAMED: &[(&str, Status)] = &[
    ("EVENT_NO_ACTION_TAKEN", EVENT_NO_ACTION_TAKEN),
    ("EVENT_PARTIAL_ACTION_TAKEN", EVENT_PARTIAL_ACTION_TAKEN),
    ("EVENT_ACTION_DEFERRED", EVENT_ACTION_DEFERRED),
    ("EVENT_ACTION_COMPLETE", EVENT_ACTION_COMPLETE),
    ("ERR_EVENT_REGISTRATION", ERR_EVENT_REGISTRATION),
    ("ERR_PROC_ABORTED", ERR_PROC_ABORTED),
    ("ERR_PROC_REQUESTED_ABORT", ERR_PROC_REQUESTED_ABORT),
    ("ERR_PROC_ABORTING", ERR_PROC_ABORTING),
    ("ERR_TIMEOUT", ERR_TIMEOUT),
    ("ERR_UNREACH", ERR_UNREACH),
    ("ERR_LOST_CONNECTION", ERR_LOST_CONNECTION),
    ("ERR_LOST_CONNECTION_TO_SERVER", -101),
    ("ERR_LOST_PEER_CONNECTION", -102),
    ("EVENT_JOB_END", EVENT_JOB_END),
    ("MODEL_DECLARED", -147),
    ("EVENT_JOB_START", -191),
    ("EVENT_SESSION_START", -192),
    ("EVENT_SESSION_END", -193),
    ("ALLOC_TIMEOUT_WARNING", -194),
    ("DVM_IS_READY", DVM_IS_READY),
    ("ERR_DVM_MOD", ERR_DVM_MOD),
    ("DVMLAB_ERR_LAUNCH", DVMLAB_ERR_LAUNCH),
    ("EVENT_PROC_TERMINATED", EVENT_PROC_TERMINATED),
    ("EVENT_NODE_DOWN", EVENT_NODE_DOWN),
    ("EVENT_NODE_OFFLINE", -232),
];

/// A code given by number (`-231`) or name, with or without the `PMIX_` prefix.
pub fn parse_code(s: &str) -> Option<Status> {
    let s = s.trim();
    if let Ok(n) = s.parse::<Status>() {
        return Some(n);
    }
    let bare = s.strip_prefix("PMIX_").unwrap_or(s);
    NAMED
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(bare))
        .map(|(_, c)| *c)
}

/// The code's name (`PMIX_EVENT_NODE_DOWN`), if it has one.
pub fn code_name(code: Status) -> Option<String> {
    NAMED
        .iter()
        .find(|(_, c)| *c == code)
        .map(|(n, _)| format!("PMIX_{n}"))
}

/// What a handler says it did, as it completes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Completion {
    #[default]
    NoActionTaken,
    PartialActionTaken,
    ActionDeferred,
    /// The event is resolved: no later handler is called.
    ActionComplete,
}

impl Completion {
    pub fn status(self) -> Status {
        match self {
            Completion::NoActionTaken => EVENT_NO_ACTION_TAKEN,
            Completion::PartialActionTaken => EVENT_PARTIAL_ACTION_TAKEN,
            Completion::ActionDeferred => EVENT_ACTION_DEFERRED,
            Completion::ActionComplete => EVENT_ACTION_COMPLETE,
        }
    }

    /// By status number or name (`ACTION_COMPLETE`, `PMIX_EVENT_ACTION_COMPLETE`, `-334`).
    pub fn parse(s: &str) -> Option<Completion> {
        let code = parse_code(s).or_else(|| parse_code(&format!("EVENT_{s}")))?;
        [
            Completion::NoActionTaken,
            Completion::PartialActionTaken,
            Completion::ActionDeferred,
            Completion::ActionComplete,
        ]
        .into_iter()
        .find(|c| c.status() == code)
    }
}

/// To whom a notification goes (`pmix_data_range_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Range {
    Undef,
    /// The runtime only.
    Rm,
    /// Every process on the notifier's node.
    Local,
    /// Every process of the notifier's job.
    Namespace,
    Session,
    Global,
    /// The processes listed as targets, nobody else.
    Custom,
    /// The notifying process's own handlers; never leaves it.
    ProcLocal,
}

impl Range {
    pub const ALL: [Range; 8] = [
        Range::Undef,
        Range::Rm,
        Range::Local,
        Range::Namespace,
        Range::Session,
        Range::Global,
        Range::Custom,
        Range::ProcLocal,
    ];

    pub fn number(self) -> u8 {
        match self {
            Range::Undef => 0,
            Range::Rm => 1,
            Range::Local => 2,
            Range::Namespace => 3,
            Range::Session => 4,
            Range::Global => 5,
            Range::Custom => 6,
            Range::ProcLocal => 7,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Range::Undef => "UNDEF",
            Range::Rm => "RM",
            Range::Local => "LOCAL",
            Range::Namespace => "NAMESPACE",
            Range::Session => "SESSION",
            Range::Global => "GLOBAL",
            Range::Custom => "CUSTOM",
            Range::ProcLocal => "PROC_LOCAL",
        }
    }

    /// By number or name (`NAMESPACE`, `PMIX_RANGE_NAMESPACE`, `3`).
    pub fn parse(s: &str) -> Option<Range> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u8>() {
            return Range::ALL.into_iter().find(|r| r.number() == n);
        }
        let bare = s.strip_prefix("PMIX_").unwrap_or(s);
        let bare = bare.strip_prefix("RANGE_").unwrap_or(bare);
        Range::ALL
            .into_iter()
            .find(|r| r.name().eq_ignore_ascii_case(bare))
    }
}

/// One `pmix_info_t`: a key and its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Info {
    pub key: String,
    pub value: Value,
}

/// PMIx's wildcard rank (`PMIX_RANK_WILDCARD`): every process of a namespace.
pub const RANK_WILDCARD: u32 = u32::MAX - 1;

/// A process as PMIx names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Proc {
    pub nspace: String,
    pub rank: u32,
}

/// An event as a process's handlers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub code: Status,
    /// Who raised it; `None` for the runtime.
    pub source: Option<Proc>,
    pub info: Vec<Info>,
    pub level: Level,
}

/// What one handler of the chain did: an entry of the results array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandlerResult {
    /// The handler's registered name (empty without one).
    pub name: String,
    pub status: Status,
    /// The results it returned.
    pub results: Vec<Info>,
}

impl HandlerResult {
    /// The entry as PMIx lays it out: keyed by the handler's name, its value an array whose
    /// first element is the name with the status and whose rest are the handler's results,
    /// so it always has at least one element.
    pub fn to_info(&self) -> Info {
        let mut inner = vec![serde_json::json!({"key": self.name, "value": self.status})];
        inner.extend(
            self.results
                .iter()
                .map(|i| serde_json::json!({"key": i.key, "value": i.value})),
        );
        Info {
            key: self.name.clone(),
            value: Value::Array(inner),
        }
    }
}

/// What a registration asks beyond its codes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directives {
    /// Shown to later handlers in the results array (`PMIX_EVENT_HDLR_NAME`).
    #[serde(default)]
    pub name: Option<String>,
    /// `PMIX_EVENT_JOB_LEVEL`: job-specific events (default: yes, unless only environment
    /// events were asked for).
    #[serde(default)]
    pub job_level: Option<bool>,
    /// `PMIX_EVENT_ENVIRO_LEVEL`: environment events (default: no).
    #[serde(default)]
    pub enviro_level: Option<bool>,
    /// `PMIX_EVENT_ORDER_PREPEND`: first in its class.
    #[serde(default)]
    pub prepend: bool,
}

/// Whether an event concerns a job (it names processes of a job) or the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Job,
    Environment,
}

impl Directives {
    /// Whether a handler with these directives is given an event of `level`. Naming only
    /// one of the two levels asks for that level alone.
    pub fn accepts(&self, level: Level) -> bool {
        match level {
            Level::Job => self.job_level.unwrap_or(self.enviro_level != Some(true)),
            Level::Environment => self.enviro_level.unwrap_or(false),
        }
    }
}

/// What a job process or tool tells its daemon about events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum EventUp {
    /// Registration `id` (the client's own numbering) for `codes` (none: every code).
    Register {
        id: u64,
        codes: Vec<Status>,
        directives: Directives,
    },
    Deregister {
        id: u64,
    },
    /// Deliver an event as `range` (and, for `CUSTOM`, `targets`) says.
    Notify {
        code: Status,
        range: Range,
        #[serde(default)]
        targets: Vec<Proc>,
        #[serde(default)]
        info: Vec<Info>,
    },
}

/// Which clients of a daemon an event is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "snake_case")]
pub enum Audience {
    /// Nobody (a `PROC_LOCAL` event never reaches a daemon).
    Nobody,
    /// Every client: job processes (also those yet to connect) and tools.
    Everyone,
    /// Every process of this namespace.
    Job { nspace: String },
    /// Exactly these processes.
    Procs { procs: Vec<Proc> },
    /// The runtime itself (the controller; it logs the event).
    Runtime,
}

/// An event on its way over the DVM's tree: up to the controller, then (unless it is for
/// the runtime alone) down to every daemon, each handing it to the clients it is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Travelling {
    pub audience: Audience,
    pub event: Event,
}

/// The PMIx namespace of job `id` of the DVM whose namespace is `dvm`.
pub fn job_nspace(dvm: &str, id: u64) -> String {
    format!("{dvm}@{id}")
}

/// What a daemon tells a job process or tool about events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum EventDown {
    /// Registration `id` is in place: events that match it reach this client from now on
    /// (the kept ones that match follow at once).
    Registered { id: u64 },
    /// Registration `id` was refused (`PMIX_ERR_EVENT_REGISTRATION`), and why.
    Refused { id: u64, reason: String },
    /// The client's last notification is on its way.
    Notified,
    /// The client's last notification was refused, and why.
    NotifyRefused { reason: String },
    /// An event for this client's handlers.
    Deliver { event: Event },
}

/// Most bytes of a notification's info and targets (as JSON): every event a daemon keeps
/// or forwards stays far below a frame.
pub const MAX_EVENT_BYTES: usize = 16 << 10;
/// Most bytes of a handler's name or a namespace.
pub const MAX_NAME_BYTES: usize = 256;

impl EventUp {
    /// Whether the message is within the limits; what is wrong if not.
    pub fn check(&self) -> Result<(), String> {
        match self {
            EventUp::Register { directives, .. } => match &directives.name {
                Some(n) if n.len() > MAX_NAME_BYTES => Err(format!(
                    "handler name of {} bytes (at most {MAX_NAME_BYTES})",
                    n.len()
                )),
                _ => Ok(()),
            },
            EventUp::Deregister { .. } => Ok(()),
            EventUp::Notify { targets, info, .. } => {
                if let Some(t) = targets.iter().find(|t| t.nspace.len() > MAX_NAME_BYTES) {
                    return Err(format!(
                        "target namespace of {} bytes (at most {MAX_NAME_BYTES})",
                        t.nspace.len()
                    ));
                }
                let bytes = serde_json::to_vec(&(targets, info)).map_or(usize::MAX, |b| b.len());
                if bytes > MAX_EVENT_BYTES {
                    return Err(format!(
                        "an event's info and targets of {bytes} bytes (at most {MAX_EVENT_BYTES})"
                    ));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_parse_by_number_and_by_name_as_pmix_tools_spell_them() {
        assert_eq!(parse_code("-231"), Some(EVENT_NODE_DOWN));
        assert_eq!(parse_code("PMIX_EVENT_NODE_DOWN"), Some(EVENT_NODE_DOWN));
        assert_eq!(parse_code("event_node_down"), Some(EVENT_NODE_DOWN));
        assert_eq!(parse_code("PMIX_NO_SUCH_THING"), None);
        assert_eq!(code_name(-7).as_deref(), Some("PMIX_ERR_PROC_ABORTED"));
        assert_eq!(
            Completion::parse("ACTION_COMPLETE"),
            Some(Completion::ActionComplete)
        );
        assert_eq!(Completion::parse("-331"), Some(Completion::NoActionTaken));
        assert_eq!(Range::parse("PMIX_RANGE_CUSTOM"), Some(Range::Custom));
        assert_eq!(Range::parse("7"), Some(Range::ProcLocal));
        assert_eq!(Range::parse("8"), None);
    }

    #[test]
    fn messages_have_their_documented_json() {
        let up: EventUp = serde_json::from_str(
            r#"{"op":"notify","code":-3001,"range":"CUSTOM","targets":[{"nspace":"j","rank":2}]}"#,
        )
        .unwrap();
        assert_eq!(
            up,
            EventUp::Notify {
                code: -3001,
                range: Range::Custom,
                targets: vec![Proc {
                    nspace: "j".into(),
                    rank: 2
                }],
                info: vec![],
            }
        );
        let reg = EventUp::Register {
            id: 1,
            codes: vec![-231],
            directives: Directives {
                name: Some("h".into()),
                ..Directives::default()
            },
        };
        let text = serde_json::to_string(&reg).unwrap();
        assert_eq!(serde_json::from_str::<EventUp>(&text).unwrap(), reg);
        assert!(serde_json::from_str::<EventUp>(r#"{"op":"notify","code":"x"}"#).is_err());
    }
}
