//! The job-exec protocol (Flux RFC 33, mapped onto the DVM): what the job-exec modules of
//! daemons say to each other over the tree, and what a job is as they pass it on.

use serde::{Deserialize, Serialize};

use crate::idset::IdSet;
use crate::placement::Placement;
use crate::wire::{base64_bytes, Stream};

/// The first protocol version whose parents mark the state-update that answers a hello
/// (`ExecDown::StateUpdate::answer`); under an older parent a child takes the first
/// state-update it gets for the answer.
pub const ANSWER_MARKED: u32 = 5;

/// The first protocol version whose barriers are named by keys ([`barrier_key`]) in
/// `ExecUp::Barrier` and `ExecDown::BarrierDone`. An older daemon sends and expects the
/// number its processes wrote: what goes to it carries only that number
/// ([`ExecUp::for_version`], [`ExecDown::for_version`]), and what comes from it has no count.
pub const BARRIER_KEYS: u32 = 6;

/// How job-exec names a job's barrier on the wire: the job's `count`-th barrier (every
/// process of a job goes through the same barriers in turn, so each rank counts the same;
/// the first is 1), above the low 32 bits of the number the processes wrote. Keys grow,
/// whatever numbers a job uses (barrier 1 again and again, or 0): a report of a key whose
/// end already passed a daemon is surely stale, and a process never mistakes an earlier end
/// for its own. A key of count 0 is a number as a daemon older than [`BARRIER_KEYS`] wrote it.
pub fn barrier_key(count: u64, number: u64) -> u64 {
    (count.min(u64::from(u32::MAX)) << 32) | barrier_number(number)
}

/// The count of a barrier key (0: a number from a daemon older than [`BARRIER_KEYS`]).
pub fn barrier_count(key: u64) -> u64 {
    key >> 32
}

/// The number the processes wrote, of a barrier key.
pub fn barrier_number(key: u64) -> u64 {
    key & u64::from(u32::MAX)
}

fn is_false(b: &bool) -> bool {
    !*b
}

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
        /// RFC 33 `state-update`: `data.jobs` tuples. `answer` marks the one that answers
        /// the child's hello (from protocol version [`ANSWER_MARKED`]): an `add` that
        /// passed the parent while the hello travelled may come first, and the child kills
        /// the jobs it runs that only the answer leaves out. Absent on the wire when false,
        /// so an older daemon reads every state-update as it did.
        StateUpdate {
            idset: IdSet,
            data: Jobs,
            #[serde(default, skip_serializing_if = "is_false")]
            answer: bool,
        },
        /// What a job runs; precedes its `add` (RFC 33 leaves job data to other services).
        JobInfo {
            idset: IdSet,
            id: JobId,
            spec: JobSpec,
        },
        /// Every shell of the job entered barrier `seq`: they may leave it. `seq` is
        /// job-exec's key for the barrier (the count of barriers the job's processes passed,
        /// above the low 32 bits of the number they wrote), not that number itself.
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
        /// `seq`: job-exec's key for the barrier, as in `ExecDown::BarrierDone`.
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
        /// The end of the job's barrier `seq` (a key) passed the sender: its processes left
        /// it. Sent to a new parent once that answered the hello (from protocol version
        /// [`BARRIER_KEYS`]), so that a parent that never saw that end (restarted, a
        /// restarted controller, which keeps no barrier, or one new on the job's path) lets
        /// go the ranks whose end was lost on the way, and takes their reports for stale.
        Passed {
            id: JobId,
            seq: u64,
        },
    }
}

impl ExecDown {
    /// This message as a daemon that speaks protocol `version` reads it.
    pub fn for_version(self, version: u32) -> ExecDown {
        match self {
            ExecDown::BarrierDone { idset, id, seq } if version < BARRIER_KEYS => {
                ExecDown::BarrierDone {
                    idset,
                    id,
                    seq: barrier_number(seq),
                }
            }
            other => other,
        }
    }
}

impl ExecUp {
    /// This request as a daemon that speaks protocol `version` reads it; none if that
    /// version has no such request.
    pub fn for_version(self, version: u32) -> Option<ExecUp> {
        match self {
            ExecUp::Barrier { id, ranks, seq } if version < BARRIER_KEYS => Some(ExecUp::Barrier {
                id,
                ranks,
                seq: barrier_number(seq),
            }),
            ExecUp::Passed { .. } if version < BARRIER_KEYS => None,
            other => Some(other),
        }
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
            answer: false,
        };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(
            j,
            r#"{"type":"state-update","idset":"0-3","data":{"jobs":[[42,1000,"check","1-2"]]}}"#
        );
        assert_eq!(serde_json::from_str::<ExecDown>(&j).unwrap(), m);
    }

    /// A daemon older than the barrier keys gets the number its processes wrote, and only
    /// such a daemon: the key's count is what newer ones tell barriers apart by.
    #[test]
    fn a_daemon_older_than_the_barrier_keys_gets_the_number_as_written() {
        let key = barrier_key(3, 7);
        assert_eq!((barrier_count(key), barrier_number(key)), (3, 7));
        let down = ExecDown::BarrierDone {
            idset: IdSet::range(1, 2),
            id: 9,
            seq: key,
        };
        let up = ExecUp::Barrier {
            id: 9,
            ranks: IdSet::range(1, 2),
            seq: key,
        };
        assert!(matches!(
            down.clone().for_version(BARRIER_KEYS - 1),
            ExecDown::BarrierDone { seq: 7, .. }
        ));
        assert!(matches!(
            up.clone().for_version(BARRIER_KEYS - 1),
            Some(ExecUp::Barrier { seq: 7, .. })
        ));
        assert_eq!(down.clone().for_version(BARRIER_KEYS), down);
        assert_eq!(up.clone().for_version(BARRIER_KEYS), Some(up));
        let other = ExecUp::Start {
            id: 9,
            ranks: IdSet::range(1, 2),
        };
        assert_eq!(other.clone().for_version(1), Some(other));
        let passed = ExecUp::Passed { id: 9, seq: key };
        assert_eq!(passed.clone().for_version(BARRIER_KEYS - 1), None);
        assert_eq!(passed.clone().for_version(BARRIER_KEYS), Some(passed));
    }

    /// A daemon of version 4 has no `answer` field: it must read the marked answer as the
    /// state-update it always was, and the field must not appear on any other.
    #[test]
    fn the_answer_mark_is_a_field_older_readers_skip() {
        let answer = ExecDown::StateUpdate {
            idset: IdSet::range(3, 4),
            data: Jobs { jobs: vec![] },
            answer: true,
        };
        let j = serde_json::to_string(&answer).unwrap();
        assert_eq!(
            j,
            r#"{"type":"state-update","idset":"3-4","data":{"jobs":[]},"answer":true}"#
        );
        assert_eq!(serde_json::from_str::<ExecDown>(&j).unwrap(), answer);

        #[derive(Deserialize)]
        #[serde(tag = "type", rename_all = "kebab-case")]
        enum Version4 {
            StateUpdate { idset: IdSet, data: Jobs },
        }
        let Version4::StateUpdate { idset, data } = serde_json::from_str(&j).unwrap();
        assert_eq!((idset, data), (IdSet::range(3, 4), Jobs { jobs: vec![] }));
    }
}
