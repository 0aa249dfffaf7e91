//! The job-exec protocol (Flux RFC 33, mapped onto the DVM): what the job-exec modules of
//! daemons say to each other over the tree, and what a job is as they pass it on.

use serde::{Deserialize, Serialize};

use crate::idset::IdSet;
use crate::placement::Placement;
use crate::wire::{base64_bytes, Stream};

/// A job's number, given by the controller's job manager.
pub type JobId = u64;

/// What to run, as the controller's job manager was given it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Where each process runs.
    pub placement: Placement,
    /// Process 0's stdin comes from the tool (`ExecDown::Stdin`); otherwise `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
}

/// How a `state-update` tuple is to be resolved (RFC 33).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateType {
    Add,
    Remove,
    Check,
}

/// A `state-update` tuple, serialized as the RFC's array `[id, userid, type, idset]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTuple(pub JobId, pub u32, pub UpdateType, pub IdSet);

/// The `data` object of a `state-update`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jobs {
    pub jobs: Vec<JobTuple>,
}

crate::tag_first! {
    tag = "type", name = "ExecDown", other = none;
    /// `job-exec.hello` responses: sent down to the ranks in `idset`.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum ExecDown {
        /// RFC 33 `state-update`: `data.jobs` tuples.
        StateUpdate { idset: IdSet, data: Jobs },
        /// What a job runs; precedes its `add` (RFC 33 leaves job data to other services).
        JobInfo {
            idset: IdSet,
            id: JobId,
            spec: JobSpec,
        },
        /// Every shell of the job entered barrier `seq`: they may leave it.
        BarrierDone { idset: IdSet, id: JobId, seq: u64 },
        /// A job exception event; fatal ones (severity 0) kill the local shells.
        Exception {
            idset: IdSet,
            id: JobId,
            severity: u32,
            kind: String,
            note: String,
        },
        /// Deliver a signal to the job's local shells.
        Signal {
            idset: IdSet,
            id: JobId,
            signal: i32,
        },
        /// The next bytes of process 0's stdin, for the rank it runs on.
        Stdin {
            idset: IdSet,
            id: JobId,
            #[serde(with = "base64_bytes")]
            data: Vec<u8>,
            eof: bool,
        },
    }
}

crate::tag_first! {
    tag = "req", name = "ExecUp", other = none;
    /// Requests sent upward (RFC 33 `job-exec.*`).
    #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum ExecUp {
        Hello,
        Start {
            id: JobId,
            ranks: IdSet,
        },
        Barrier {
            id: JobId,
            ranks: IdSet,
            seq: u64,
        },
        Finish {
            id: JobId,
            ranks: IdSet,
            status: i32,
        },
        Exception {
            id: JobId,
            severity: u32,
            #[serde(rename = "type")]
            kind: String,
            note: String,
        },
        Release {
            id: JobId,
            ranks: IdSet,
        },
        /// Bytes a job process wrote, on their way to the tool that submitted the job
        /// (forwarded at once, like exceptions; RFC 33 leaves output collection open).
        Output {
            id: JobId,
            proc: u32,
            stream: Stream,
            #[serde(with = "base64_bytes")]
            data: Vec<u8>,
        },
        /// Process 0 took this many bytes of its stdin in all (forwarded at once).
        StdinAck {
            id: JobId,
            bytes: u64,
        },
    }
}

/// Upward messages counted on this daemon, by kind (the reductions are proven with them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub start: u64,
    pub barrier: u64,
    pub finish: u64,
    pub exception: u64,
    pub release: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_serialize_as_the_rfcs_arrays() {
        let m = ExecDown::StateUpdate {
            idset: IdSet::range(0, 3),
            data: Jobs {
                jobs: vec![JobTuple(42, 1000, UpdateType::Check, IdSet::range(1, 2))],
            },
        };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(
            j,
            r#"{"type":"state-update","idset":"0-3","data":{"jobs":[[42,1000,"check","1-2"]]}}"#
        );
        assert_eq!(serde_json::from_str::<ExecDown>(&j).unwrap(), m);
    }
}
