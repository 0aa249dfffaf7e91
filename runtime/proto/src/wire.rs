//! The wire protocol: every frame any DVM process sends, and the one codec that carries them.
//!
//! Frames are length-delimited (4-byte big-endian length) JSON documents, at most
//! [`MAX_HELLO_FRAME`] bytes until the hello is accepted and [`MAX_FRAME`] after. A connection
//! opens with [`Hello`] from the connecting side, answered by `Welcome` (with the protocol
//! version both speak) or `Refuse`. A frame that does not decode ends the connection; a
//! well-formed message of a kind this side does not know (a newer peer's) is answered with an
//! error and the link stays. Nothing a peer sends can panic the receiver.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

#[cfg(feature = "codec")]
pub use crate::codec::FrameCodec;
use crate::contract::{PingReport, StatusReport};
use crate::exec::{ExecDown, ExecUp, JobId};
use crate::idset::IdSet;
pub use crate::limits::{MAX_FRAME, MAX_HELLO_FRAME};
use crate::placement::{MapBy, Placement};
use crate::Rank;

/// Protocol name sent in every [`Hello`].
pub const MAGIC: &str = "dvmlab";
/// The oldest protocol version this build speaks.
pub const MIN_VERSION: u32 = 1;
/// The newest protocol version this build speaks. Version 2: job output as bytes, compact
/// placements, streamed job lists, version ranges and capability bits in the hello.
/// Version 3: tools on any daemon, their requests relayed through the tree.
/// Version 4: a stop confirmation is acknowledged (`StopAcked`); a stopping daemon that
/// loses its parent before that confirms to the controller directly.
/// Version 5: the state-update answering a job-exec hello is marked (`answer`).
/// Version 6: job-exec names barriers by keys (`exec::BARRIER_KEYS`).
/// Version 7: a daemon says whether a tool below it registered for events
/// ([`EVENT_INTEREST`]), and events go only down the links that need them.
pub const VERSION: u32 = 7;
/// The first version whose daemons send [`DaemonMsg::Interest`] and answer it: a parent
/// sends events a child of this version or later only when the child's subtree runs a job
/// or has a tool registered for events; an older child gets every event.
pub const EVENT_INTEREST: u32 = 7;
/// Capability bits this build has (none are defined yet; a peer ignores bits it does not
/// know, and each side uses a capability only when both have it).
pub const CAPS: u64 = 0;

/// The first frame on every connection, sent by the side that connected: the range of
/// protocol versions it speaks, and its capability bits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    /// The newest version the sender speaks.
    pub version: u32,
    /// The oldest version the sender speaks (a version-1 peer sends none: just `version`).
    #[serde(default)]
    pub min_version: Option<u32>,
    #[serde(default)]
    pub caps: u64,
    pub nspace: String,
    pub peer: Peer,
    /// Set only by a stopping controller on a poke ([`Hello::stopping()`]): the DVM is
    /// stopping and the poked daemon, which the stop could not reach through the tree, is
    /// to stop too. A daemon that does not know the field takes it as a plain poke.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopping: bool,
}

/// The membership a parent hands a joining child: what differs from what the child read in
/// `prte.conf` (nothing, in a DVM that has not changed size), so it stays small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wireup {
    /// Counts changes of membership (ranks added or departed), not of states.
    pub epoch: u64,
    /// Ranks past those listed in `prte.conf`, with their hosts, in rank order.
    pub added: Vec<(Rank, String)>,
    pub departed: crate::idset::IdSet,
}

impl Wireup {
    /// As one command-line word for a daemon the controller launches (`EPOCH/R=HOST,…/
    /// DEPARTED`): no character a remote shell would interpret.
    pub fn to_arg(&self) -> String {
        let added: Vec<String> = self.added.iter().map(|(r, h)| format!("{r}={h}")).collect();
        format!(
            "{}/{}/{}",
            self.epoch,
            added.join(","),
            self.departed.encode(false)
        )
    }

    /// Reads [`Wireup::to_arg`]'s form back, saying what is wrong with a bad one.
    pub fn from_arg(s: &str) -> Result<Wireup, String> {
        let mut parts = s.split('/');
        let (Some(epoch), Some(added), Some(departed), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{s:?} is not EPOCH/RANK=HOST,…/DEPARTED"));
        };
        let epoch = epoch
            .parse()
            .map_err(|_| format!("{epoch:?} is not a membership epoch"))?;
        let added = added
            .split(',')
            .filter(|a| !a.is_empty())
            .map(|a| {
                let (r, h) = a
                    .split_once('=')
                    .ok_or_else(|| format!("{a:?} is not RANK=HOST"))?;
                let r: Rank = r.parse().map_err(|_| format!("{r:?} is not a rank"))?;
                if h.is_empty() {
                    return Err(format!("rank {r} has no host"));
                }
                Ok((r, h.to_string()))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let departed = if departed.is_empty() {
            crate::idset::IdSet::new()
        } else {
            crate::idset::IdSet::decode(departed).map_err(|e| e.to_string())?
        };
        Ok(Wireup {
            epoch,
            added,
            departed,
        })
    }
}

/// Which stream of a job process a piece of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Bytes as base64 in a JSON string: job output is whatever a process wrote, not text.
pub mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// Who is connecting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Peer {
    /// A daemon of the DVM phoning home to its parent (or a healed-to ancestor).
    Daemon { rank: Rank, host: String },
    /// A tool such as `pctl`, talking to the daemon of its node (which relays its requests
    /// to the controller) or to the controller.
    Tool,
    /// A job process, talking to the daemon of its node about events (PMIx RFC 0002).
    Process { nspace: String, rank: u32 },
}

/// A member of a subtree, as reported upward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub rank: Rank,
    pub host: String,
    /// The rank it is connected to.
    pub parent: Rank,
    /// When this daemon last connected upward (microseconds since the Unix epoch, or one
    /// more than the last, whichever is later).
    pub epoch: u64,
    /// The latest such connection anywhere on the path the report came up by: each daemon
    /// that forwards it raises it to its own epoch. A report whose `(via, epoch)` is below the
    /// route's travelled an older path (a daemon above the member re-homed since) and is
    /// ignored.
    #[serde(default)]
    pub via: u64,
    /// Its contact URI (`nspace.rank;tcp://address:port:prefix`), as it chose its own
    /// address; empty from a peer of protocol version 1.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uri: String,
}

/// A rank as of one of its connections, for withdrawing exactly that connection's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEpoch {
    pub rank: Rank,
    pub epoch: u64,
    #[serde(default)]
    pub via: u64,
}

crate::tag_first! {
    tag = "op", name = "DaemonMsg", other = Unknown;
    /// Traffic between daemons.
    #[derive(Debug, Clone, PartialEq, Serialize)]
    #[serde(rename_all = "snake_case")]
    pub enum DaemonMsg {
        /// Upward: these ranks are now reachable through the sending link.
        Report { members: Vec<Member> },
        /// Upward: these ranks (as of these epochs) are no longer reachable through the link.
        Lost { ranks: Vec<RankEpoch> },
        /// Either way: a message for one rank, forwarded hop by hop along the tree; dropped when
        /// `ttl` hops have been used up, so no transient inconsistency can bounce it forever.
        Routed {
            src: Rank,
            dst: Rank,
            ttl: u8,
            body: Body,
        },
        /// Either way, every heartbeat interval: proves the link's other end is alive.
        Heartbeat,
        /// Downward: the DVM is stopping; forward to your children, wait for them, exit.
        Shutdown,
        /// Upward, last thing before a stopping daemon exits: these ranks (itself and the part
        /// of its subtree that confirmed) have stopped. A link that closes without it leaves its
        /// ranks unconfirmed: the daemon may come back, and must then be told to stop.
        Stopped { ranks: Vec<Rank> },
        /// Downward (version 4): the `Stopped` just received was counted; the child may exit.
        StopAcked,
        /// Upward: a job-exec request (RFC 33 `job-exec.*`).
        ExecUp { req: ExecUp },
        /// Downward: a job-exec `hello` response.
        ExecDown { msg: ExecDown },
        /// Downward, right after the welcome: the membership beyond what `prte.conf` says.
        Wireup { wireup: Wireup },
        /// Downward, to every daemon below: the path to the controller broke above you (a
        /// daemon lost its upward link); replies to your tools may have been lost.
        PathLost,
        /// Either way: a PMIx event on the tree, up to the controller from a child, down to
        /// every daemon from the parent.
        Event { ev: crate::event::Travelling },
        /// Either way: the other side did not understand a message (it speaks an older
        /// version); the link stays.
        Unsupported { what: String },
        /// Downward: this parent is leaving the DVM; connect to the next ancestor now.
        Rehome,
        /// Upward (version 7): whether a tool on the sending daemon or below it has a
        /// registration for events; `seq` counts the sender's announcements on this link.
        /// Until a child says `on`, its parent sends it only the events of jobs that run
        /// below it and the environment's.
        Interest { on: bool, seq: u64 },
        /// Downward (version 7): every daemon from this one up to the controller counted the
        /// child's interest `seq`, so every event raised from now on comes down to it.
        InterestSeen { seq: u64 },
        /// Downward (version 7): this daemon's path to the controller changed, so what the
        /// child said is counted no further than here: say it again (and have yours do so).
        InterestAgain,
    }
}

/// Payloads of routed messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    Ping {
        id: u64,
        path: Vec<Rank>,
    },
    Pong {
        id: u64,
        path: Vec<Rank>,
    },
    /// To the controller: a request of tool `tool` (the relaying daemon's own number for
    /// it) connected to the daemon `src`.
    ToolUp {
        tool: u64,
        req: ToolRequest,
    },
    /// From the controller: a reply for tool `tool` of the daemon `dst`.
    ToolDown {
        tool: u64,
        reply: ToolReply,
    },
    /// To the controller: tool `tool` of the daemon `src` has gone.
    ToolGone {
        tool: u64,
    },
    /// From the controller: the tree lost the path to tool `tool` of the daemon `dst` for a
    /// while, and the controller forgot it (replies may have been lost): the daemon closes it
    /// with `reason`.
    ToolDropped {
        tool: u64,
        reason: String,
    },
    /// From the controller: leave the DVM (a shrink took this rank, or a failed grow is
    /// undone); the daemon hands its children on to its parent first.
    Depart,
    /// A payload this build does not know (from a newer peer); dropped.
    #[serde(other)]
    Unknown,
}

/// A job as `prun` submits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submit {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    /// `None`: one process per node.
    pub nprocs: Option<u32>,
    pub map_by: MapBy,
    /// Only these hosts (by name), in this order.
    pub hosts: Option<Vec<String>>,
    pub time_limit_ms: Option<u64>,
    pub userid: u32,
    /// Process 0 reads what the tool sends with [`ToolRequest::Stdin`]; without it, every
    /// process reads `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
}

/// What a tool asks of the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "req", rename_all = "snake_case")]
pub enum ToolRequest {
    Status,
    Ping {
        rank: Rank,
    },
    Stop,
    /// Run a job; the answers stream back on this connection until the job ends.
    Submit {
        job: Submit,
    },
    Jobs,
    Kill {
        id: JobId,
        signal: i32,
    },
    /// The next bytes of the stdin of process 0 of a job submitted on this connection (and,
    /// with `eof`, their end). At most `STDIN_WINDOW` bytes beyond the last `StdinAck`.
    Stdin {
        id: JobId,
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
        eof: bool,
    },
    /// An allocation request (PMIx `PMIx_Allocation_request`): NEW or EXTEND adds `hosts`
    /// to the DVM, RELEASE takes `hosts` or the allocation `alloc_id` out of it. The answer
    /// is [`ToolReply::Allocated`] at once; the requester later hears one terminal event.
    Alloc {
        directive: Directive,
        #[serde(default)]
        hosts: Vec<String>,
        #[serde(default)]
        alloc_id: Option<String>,
        #[serde(default)]
        req_id: Option<String>,
    },
    /// An operator's or scheduler's push: grow the DVM onto `hosts` (no requester, so no
    /// event); with `wait`, [`ToolReply::CampaignEnded`] follows the answer.
    Grow {
        hosts: Vec<String>,
        #[serde(default)]
        wait: bool,
    },
    /// An operator's or scheduler's push: the daemons on `hosts` leave the DVM.
    Shrink {
        hosts: Vec<String>,
        #[serde(default)]
        wait: bool,
    },
    /// A request kind this build does not know (sent by a newer tool).
    #[serde(other)]
    Unknown,
}

/// PMIx's allocation directives, by their numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Directive {
    New,
    Extend,
    Release,
}

impl Directive {
    /// `PMIX_ALLOC_NEW` 1, `PMIX_ALLOC_EXTEND` 2, `PMIX_ALLOC_RELEASE` 3.
    pub fn number(self) -> u8 {
        match self {
            Directive::New => 1,
            Directive::Extend => 2,
            Directive::Release => 3,
        }
    }
}

/// A job in the controller's list, as it travels to a tool (which expands the placement for
/// `pctl jobs --json`, see `contract::JobReport`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: JobId,
    pub state: String,
    pub argv: Vec<String>,
    pub placement: Placement,
    pub status: Option<i32>,
    pub exception: Option<String>,
}

/// The controller's answers to a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ToolReply {
    Status(StatusReport),
    Ping(PingReport),
    /// The DVM has stopped; `unconfirmed` lists ranks that did not confirm their exit in time.
    Stopped {
        unconfirmed: Vec<Rank>,
    },
    Error {
        message: String,
    },
    /// The job was accepted and placed.
    Submitted {
        id: JobId,
        placement: Placement,
    },
    /// Bytes job process `proc` wrote, in the order written (at most a line, or
    /// `MAX_OUTPUT_CHUNK` bytes of a longer one).
    JobOutput {
        id: JobId,
        proc: u32,
        stream: Stream,
        #[serde(with = "base64_bytes")]
        data: Vec<u8>,
    },
    /// The job is over (every rank released); `status` is the greatest wait status.
    JobEnded {
        id: JobId,
        status: i32,
        exception: Option<String>,
    },
    /// One job of the list `Jobs` asked for: a frame per job, so the list's size never
    /// grows a frame; `JobsEnd` follows the last.
    Job(JobSummary),
    JobsEnd,
    Signalled {
        id: JobId,
    },
    /// Process 0 of the job took (or, once it exited or closed its stdin, discarded) this
    /// many bytes of its stdin in all.
    StdinAck {
        id: JobId,
        bytes: u64,
    },
    /// An elastic request was accepted (phase one): the change has begun (`changed`) or
    /// there was nothing to change. It does not say the change is done.
    Allocated {
        alloc_id: String,
        /// `PMIX_SUCCESS` (0).
        status: i32,
        /// The ranks the change adds or removes.
        ranks: IdSet,
        changed: bool,
    },
    /// For `wait`: the change this connection asked for ended; `cause` says why it failed.
    CampaignEnded {
        alloc_id: String,
        ok: bool,
        cause: Option<i32>,
    },
}

crate::tag_first! {
    tag = "t", name = "Frame", other = none;
    /// Every frame on the wire.
    #[derive(Debug, Clone, PartialEq, Serialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Frame {
        Hello(Hello),
        /// `version` is the newest both sides speak; `caps` the answering side's bits.
        Welcome {
            nspace: String,
            rank: Rank,
            #[serde(default = "version_one")]
            version: u32,
            #[serde(default)]
            caps: u64,
        },
        Refuse {
            reason: String,
        },
        Daemon(DaemonMsg),
        Tool(ToolRequest),
        ToolReply(ToolReply),
        /// From a job process or tool to its node's daemon: events.
        Event(crate::event::EventUp),
        /// From a daemon to a job process or tool: events.
        EventDown(crate::event::EventDown),
    }
}

fn version_one() -> u32 {
    1
}

/// Encodes one frame into its bytes on the wire (length prefix included), refusing one
/// over [`MAX_FRAME`] with an error that says how large it was.
pub fn encode_frame(frame: &Frame) -> Result<Bytes, String> {
    // The body is written after a placeholder for its length: one buffer, no copy.
    let mut out = vec![0u8; 4];
    serde_json::to_writer(&mut out, frame).map_err(|e| format!("cannot encode frame: {e}"))?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        return Err(format!(
            "frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"
        ));
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(Bytes::from(out))
}

impl Hello {
    pub fn new(nspace: &str, peer: Peer) -> Hello {
        Hello {
            magic: MAGIC.into(),
            version: VERSION,
            min_version: Some(MIN_VERSION),
            caps: CAPS,
            nspace: nspace.into(),
            peer,
            stopping: false,
        }
    }

    /// The hello of a stopping controller's poke (see the `stopping` field).
    pub fn stopping(nspace: &str, peer: Peer) -> Hello {
        Hello {
            stopping: true,
            ..Hello::new(nspace, peer)
        }
    }

    /// The newest version both this build and the sender speak, if any.
    pub fn common_version(&self) -> Option<u32> {
        let theirs = self.min_version.unwrap_or(self.version)..=self.version;
        let v = self.version.min(VERSION);
        (theirs.contains(&v) && v >= MIN_VERSION).then_some(v)
    }

    /// Why this hello cannot be accepted by a member of `nspace`, if it cannot.
    pub fn mismatch(&self, nspace: &str) -> Option<String> {
        if self.magic != MAGIC {
            Some(format!("not a {MAGIC} peer (magic {:?})", self.magic))
        } else if self.common_version().is_none() {
            Some(format!(
                "protocol versions {}..={} not supported (this daemon speaks {MIN_VERSION}..={VERSION})",
                self.min_version.unwrap_or(self.version),
                self.version
            ))
        } else if self.nspace != nspace {
            Some(format!(
                "namespace {} is not this DVM's ({nspace})",
                self.nspace
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use proptest::prelude::*;
    use tokio_util::codec::{Decoder, Encoder};

    fn roundtrip(f: Frame) {
        let mut c = FrameCodec::default();
        let mut buf = BytesMut::new();
        c.encode(f.clone(), &mut buf).unwrap();
        assert_eq!(c.decode(&mut buf).unwrap(), Some(f));
        assert!(buf.is_empty());
    }

    #[test]
    fn frames_roundtrip() {
        roundtrip(Frame::Hello(Hello::new(
            "c-prte-dvm",
            Peer::Daemon {
                rank: 3,
                host: "n03".into(),
            },
        )));
        roundtrip(Frame::Daemon(DaemonMsg::Routed {
            src: 0,
            dst: 9,
            ttl: 64,
            body: Body::Ping {
                id: 7,
                path: vec![0, 1],
            },
        }));
        roundtrip(Frame::Tool(ToolRequest::Ping { rank: 4 }));
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut c = FrameCodec::default();
        let mut buf = BytesMut::new();
        c.encode(Frame::Tool(ToolRequest::Status), &mut buf)
            .unwrap();
        let mut part = buf.split_to(buf.len() - 1);
        assert_eq!(c.decode(&mut part).unwrap(), None);
    }

    #[test]
    fn http_and_oversized_frames_are_errors() {
        let mut c = FrameCodec::default();
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]);
        assert!(c.decode(&mut buf).is_err());
    }

    #[test]
    fn a_stopping_poke_is_marked_and_a_hello_without_the_mark_is_none() {
        let peer = Peer::Daemon {
            rank: 0,
            host: "ctl".into(),
        };
        roundtrip(Frame::Hello(Hello::stopping("c-prte-dvm", peer.clone())));
        let plain = serde_json::to_string(&Hello::new("c-prte-dvm", peer.clone())).unwrap();
        assert!(!plain.contains("stopping"), "{plain}");
        let read: Hello = serde_json::from_str(&plain).unwrap();
        assert!(!read.stopping);
        let marked = serde_json::to_string(&Hello::stopping("c-prte-dvm", peer)).unwrap();
        assert!(serde_json::from_str::<Hello>(&marked).unwrap().stopping);
    }

    #[test]
    fn hello_mismatches_are_explained() {
        let h = Hello::new("a-prte-dvm", Peer::Tool);
        assert!(h.mismatch("a-prte-dvm").is_none());
        assert!(h.mismatch("b-prte-dvm").unwrap().contains("namespace"));
        let ancient = Hello {
            version: 0,
            min_version: None,
            ..h.clone()
        };
        assert!(ancient.mismatch("a-prte-dvm").unwrap().contains("version"));
    }

    #[test]
    fn peers_settle_on_the_newest_version_both_speak() {
        let h = Hello::new("a", Peer::Tool);
        assert_eq!(h.common_version(), Some(VERSION));
        let newer = Hello {
            version: VERSION + 3,
            min_version: Some(MIN_VERSION),
            ..h.clone()
        };
        assert_eq!(newer.common_version(), Some(VERSION));
        let only_newer = Hello {
            min_version: Some(VERSION + 1),
            ..newer
        };
        assert!(only_newer.mismatch("a").unwrap().contains("not supported"));
        // A version-1 peer names one version and no range.
        let v1: Hello = serde_json::from_str(
            r#"{"magic":"dvmlab","version":1,"nspace":"a","peer":{"kind":"tool"}}"#,
        )
        .unwrap();
        assert_eq!(v1.common_version(), Some(1));
    }

    #[test]
    fn a_message_of_an_unknown_kind_decodes_as_unknown_not_as_an_error() {
        let f: Frame =
            serde_json::from_str(r#"{"t":"daemon","op":"grow_campaign","x":1}"#).unwrap();
        assert_eq!(f, Frame::Daemon(DaemonMsg::Unknown));
        let f: Frame = serde_json::from_str(r#"{"t":"tool","req":"events"}"#).unwrap();
        assert_eq!(f, Frame::Tool(ToolRequest::Unknown));
    }

    #[test]
    fn frames_past_the_limits_are_refused_before_and_after_the_hello() {
        let mut c = FrameCodec::default();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&((MAX_HELLO_FRAME + 1) as u32).to_be_bytes());
        assert!(c.decode(&mut buf).is_err(), "a stranger's large frame");
        let mut c = FrameCodec::default();
        c.accepted();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&((MAX_HELLO_FRAME + 1) as u32).to_be_bytes());
        assert_eq!(c.decode(&mut buf).unwrap(), None, "waits for the body");
        let mut c = FrameCodec::default();
        c.accepted();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&((MAX_FRAME + 1) as u32).to_be_bytes());
        assert!(c.decode(&mut buf).is_err());
        let huge = Frame::Refuse {
            reason: "x".repeat(MAX_FRAME),
        };
        assert!(encode_frame(&huge).unwrap_err().contains("exceeds"));
    }

    #[test]
    fn job_output_travels_as_bytes() {
        let f = Frame::ToolReply(ToolReply::JobOutput {
            id: 1,
            proc: 0,
            stream: Stream::Stdout,
            data: vec![0xff, 0, b'\n'],
        });
        roundtrip(f);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut c = FrameCodec::default();
            let mut buf = BytesMut::from(&data[..]);
            for _ in 0..4 {
                match c.decode(&mut buf) {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
        }

        #[test]
        fn arbitrary_json_bodies_never_panic(body in "\\PC{0,200}") {
            let mut c = FrameCodec::default();
            let mut buf = BytesMut::new();
            buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
            buf.extend_from_slice(body.as_bytes());
            let _ = c.decode(&mut buf);
        }
    }

    #[test]
    fn a_membership_travels_as_one_shell_safe_word_and_bad_ones_are_named() {
        let w = Wireup {
            epoch: 7,
            added: vec![(9, "g1".into()), (10, "g2.ib".into())],
            departed: [3, 4, 5].into_iter().collect(),
        };
        let a = w.to_arg();
        assert_eq!(a, "7/9=g1,10=g2.ib/3-5");
        assert_eq!(Wireup::from_arg(&a), Ok(w));
        assert_eq!(Wireup::from_arg("0//").map(|w| w.added.len()), Ok(0));
        for (bad, why) in [
            ("7/9=g1", "is not EPOCH"),
            ("x//", "not a membership epoch"),
            ("1/9/", "not RANK=HOST"),
            ("1/a=b/", "not a rank"),
            ("1/9=/", "has no host"),
        ] {
            let e = Wireup::from_arg(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
