//! The observable contract: what `pctl ... --json` prints. Tests and the conformance suite
//! read only these shapes; field names are stable and documented in `runtime/README.md`.

use serde::{Deserialize, Serialize};

use crate::Rank;

/// A member daemon's state as the controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Reported in and reachable through the tree.
    Joined,
    /// Never reported in.
    Waiting,
    /// Connected to the controller, its report not yet in (a moment at most).
    Joining,
    /// Reported in once, then its route was lost.
    Lost,
    /// Told to leave the DVM, still reachable.
    Departing,
    /// Left the DVM.
    Departed,
}

/// One row of `pctl status --json`'s `members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub rank: Rank,
    pub host: String,
    /// The daemon it is actually connected to (differs from `tree_parent` after healing);
    /// `null` for the controller and for daemons not joined.
    pub parent: Option<Rank>,
    /// Its parent by the radix-tree formula; `null` for the controller.
    pub tree_parent: Option<Rank>,
    pub state: MemberState,
    /// Its contact URI as it reported it when it last joined (`null` until then).
    #[serde(default)]
    pub uri: Option<String>,
}

/// `pctl status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    pub namespace: String,
    /// True once every expected daemon has reported in (and while they all stay joined).
    pub formed: bool,
    pub expected: u32,
    pub joined: u32,
    pub radix: u32,
    pub controller_host: String,
    pub controller_uri: String,
    /// Whether `DVMControllerHost` is listed in `DVMNodes`.
    pub controller_listed: bool,
    /// Wall-clock time (ms since the Unix epoch) the DVM last became formed; `null` while it
    /// is not formed.
    pub formed_at_unix_ms: Option<u64>,
    pub members: Vec<MemberStatus>,
    /// Job-exec requests the controller received from its children, by kind: with the tree
    /// reducing, one per child per job and event, not one per rank.
    #[serde(default)]
    pub job_messages: Option<crate::exec::Counters>,
    /// Whether every link and tool connection proves it holds the DVM key and is encrypted
    /// (`DVMKeyFile`). False: anyone who reaches `DVMPort` can join, run jobs or stop the DVM.
    #[serde(default)]
    pub authenticated: bool,
    /// Whether the DVM may grow and shrink (`prte_elastic_mode`).
    #[serde(default)]
    pub elastic: bool,
    /// Size changes in progress (elastic mode).
    #[serde(default)]
    pub campaigns: Vec<CampaignStatus>,
}

/// A grow or shrink in progress, as `pctl status --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CampaignStatus {
    pub id: u64,
    /// `grow` or `shrink`.
    pub kind: String,
    /// The ranks it adds or removes.
    pub targets: Vec<Rank>,
    /// Of those, the ones wired (grow) or gone (shrink).
    pub done: Vec<Rank>,
    pub alloc_id: String,
}

/// One answer of `pctl ping --json` (a JSON line per pinged rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingReport {
    pub rank: Rank,
    pub host: String,
    pub ok: bool,
    /// Round trip through the tree, controller to daemon and back, in microseconds.
    pub rtt_us: Option<u64>,
    /// Ranks the ping passed through, out and back (`[0, 1, 3, 1, 0]`).
    pub path: Vec<Rank>,
    pub error: Option<String>,
}

/// Where one process of a job runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcPlace {
    /// The process's index in the job, 0 to nprocs - 1.
    pub proc: u32,
    pub rank: Rank,
    pub host: String,
}

/// One job in `pctl jobs --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    pub id: u64,
    /// `STARTING` (placed, shells being launched), `RUNNING` (every shell started),
    /// `CLEANUP` (every shell exited, epilogs running), `INACTIVE` (every rank released).
    pub state: String,
    pub argv: Vec<String>,
    pub nprocs: u32,
    pub placement: Vec<ProcPlace>,
    /// Greatest wait status of the job's shells, once all exited.
    pub status: Option<i32>,
    /// The first exception raised, if any (`type: note`).
    pub exception: Option<String>,
}
