//! The observable contract: what `pctl ... --json` prints. Tests and the conformance suite
//! read only these shapes; field names are stable and documented in `runtime/README.md`.

use serde::{Deserialize, Serialize};

use crate::tree::Rank;

/// A member daemon's state as the controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Reported in and reachable through the tree.
    Joined,
    /// Never reported in.
    Waiting,
    /// Reported in once, then its route was lost.
    Lost,
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
