//! The soak's history: every operation's invocation and completion, every fault, what the
//! DVM reported of its membership and jobs, what listeners heard, and what the hosts' logs
//! say (each process start with its node, each daemon's joins and departures), as JSON
//! lines with microsecond Unix times. The checker reads nothing else.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch, the history's clock (the same as the logs').
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The last line of an operation's `err` when the soak had to kill its command at the
/// operation's deadline: it never returned.
pub const NEVER_RETURNED: &str =
    "dvmlab-soak: killed at the operation's deadline; it never returned";

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub t_us: u64,
    #[serde(flatten)]
    pub entry: Entry,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// The run: first line of every history.
    Meta {
        seed: u64,
        backend: String,
        controller: String,
        /// The hosts of `DVMNodes`, the DVM's first membership (the controller apart).
        initial: Vec<String>,
        /// Hosts the DVM may grow onto.
        spares: Vec<String>,
        duration_s: u64,
        /// The defect the runtime was given on purpose (`dvmlab_test_elastic_fault`), for a
        /// run that shows the checker catching it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runtime_fault: Option<String>,
    },
    /// An operation was started, on `host`.
    Invoke { op: u64, host: String, what: Op },
    /// An operation's command ended: its exit code (`None`: killed at the deadline, then
    /// `err` ends with [`NEVER_RETURNED`], or by a signal), its output lines.
    Complete {
        op: u64,
        exit: Option<i32>,
        out: Vec<String>,
        err: Vec<String>,
    },
    /// A fault began (`start: true`) or was undone.
    Fault { id: u64, start: bool, fault: Fault },
    /// The DVM's membership, formed flag and campaigns, as `pctl status` said when it
    /// changed.
    Status {
        formed: bool,
        members: Vec<Member>,
        campaigns: Vec<Campaign>,
    },
    /// A job as `pctl jobs` said, whenever anything of it changed.
    Job {
        id: u64,
        /// The soak's tag of the job, its `$0`.
        tag: Option<String>,
        state: String,
        status: Option<i32>,
        exception: Option<String>,
        hosts: Vec<String>,
    },
    /// The jobs `pctl jobs` showed held (waiting for a daemon campaign), when that changed.
    Held { ids: Vec<u64> },
    /// An event listener (`pevent listen`, a tool on `host`): started, ready, an event it
    /// was served (`line`: what it printed), or ended.
    Listener {
        listener: u64,
        host: String,
        phase: ListenerPhase,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        line: Option<serde_json::Value>,
    },
    /// From a host's log: a job process started there.
    ProcStart {
        host: String,
        rank: u32,
        job: u64,
        proc: u32,
        pid: i64,
    },
    /// From a host's log: a daemon started (`rank`), joined the DVM, was told to depart,
    /// or exited.
    Daemon {
        host: String,
        rank: u32,
        what: DaemonWhat,
    },
    /// A job process still alive once the DVM had no job left.
    Leftover {
        pid: u32,
        job: Option<u64>,
        cmdline: String,
    },
    /// After the final heal: the DVM's status, and its jobs that had not ended.
    Final {
        formed: bool,
        members: Vec<Member>,
        campaigns: Vec<Campaign>,
        unended: Vec<u64>,
        held: Vec<u64>,
    },
}

/// One rank of the membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub rank: u32,
    pub host: String,
    pub state: String,
}

/// A grow or shrink in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Campaign {
    pub id: u64,
    pub kind: String,
    pub targets: Vec<u32>,
}

/// A listener's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerPhase {
    Started,
    Ready,
    Event,
    Ended,
}

/// A daemon's life, from its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DaemonWhat {
    Started,
    Joined,
    Departing,
    Exited,
}

/// An operation of the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op_type", rename_all = "snake_case")]
pub enum Op {
    /// `prun` of a job tagged `tag`, expected to end as `expect` when nothing interferes.
    Job {
        tag: String,
        shape: String,
        nprocs: u32,
        expect: Expect,
    },
    /// `pctl kill` of the job of operation `target`.
    KillJob { target: u64, job: u64 },
    /// A grow (`palloc new` with a requester, `pctl grow --wait` without).
    Grow { hosts: Vec<String>, requester: bool },
    /// A shrink (`palloc release` with a requester, `pctl shrink --wait` without).
    Shrink { hosts: Vec<String>, requester: bool },
    /// `pevent notify` of the soak's code with `range`, carrying `tag`.
    Notify { range: String, tag: String },
}

/// How a job ends when nothing interferes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    Exit(i32),
    /// Killed by the workload (`pctl kill`, SIGKILL).
    Killed,
    /// Ended by its time limit.
    TimedOut,
}

/// A fault of the nemesis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL to a daemon; undone by starting it again (`late`: after it was long gone).
    Kill {
        host: String,
        late: bool,
    },
    Freeze {
        host: String,
    },
    /// `a` cut off from `b`: both ways, or only `a`'s packets to `b`.
    Partition {
        a: Vec<String>,
        b: Vec<String>,
        one_way: bool,
    },
    /// Every packet of `host` delayed (and some lost).
    Impair {
        host: String,
        delay_ms: u64,
        loss_pct: u32,
    },
    /// The controller killed and started again.
    ControllerRestart {
        host: String,
    },
    /// Launches of a grow onto these hosts fail.
    LaunchFailure {
        hosts: Vec<String>,
    },
}

impl Fault {
    /// The hosts it touches (`None`: the whole DVM, as a controller restart does).
    pub fn hosts(&self) -> Option<Vec<String>> {
        match self {
            Fault::Kill { host, .. } | Fault::Freeze { host } | Fault::Impair { host, .. } => {
                Some(vec![host.clone()])
            }
            Fault::Partition { a, b, .. } => Some(a.iter().chain(b).cloned().collect()),
            Fault::ControllerRestart { .. } => None,
            Fault::LaunchFailure { hosts } => Some(hosts.clone()),
        }
    }
}

/// Appends records to the history file, one JSON line each, written through at once so a
/// crashed soak leaves a history to check.
pub struct Writer {
    file: Mutex<BufWriter<File>>,
}

impl Writer {
    pub fn create(path: &Path) -> Result<Writer, String> {
        let f = File::create(path).map_err(|e| format!("create {}: {e}", path.display()))?;
        Ok(Writer {
            file: Mutex::new(BufWriter::new(f)),
        })
    }

    /// Records `entry` now.
    pub fn record(&self, entry: Entry) {
        self.record_at(now_us(), entry);
    }

    pub fn record_at(&self, t_us: u64, entry: Entry) {
        let rec = Record { t_us, entry };
        if let (Ok(line), Ok(mut f)) = (serde_json::to_string(&rec), self.file.lock()) {
            let _ = writeln!(f, "{line}");
            let _ = f.flush();
        }
    }
}

/// Reads a history; a line that is not a record is an error naming the file and line.
pub fn read(path: &Path) -> Result<Vec<Record>, String> {
    let f = File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line)
                .map_err(|e| format!("{}:{}: not a history record: {e}", path.display(), i + 1))?,
        );
    }
    Ok(out)
}
