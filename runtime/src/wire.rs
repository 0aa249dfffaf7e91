//! The wire protocol: every frame any DVM process sends, and the one codec that carries them.
//!
//! Frames are length-delimited (4-byte big-endian length, at most [`MAX_FRAME`] bytes) JSON
//! documents. A connection opens with [`Hello`] from the connecting side, answered by
//! `Welcome` or `Refuse`. Anything that does not decode is an error that ends the connection;
//! nothing a peer sends can panic the receiver.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::contract::{JobReport, PingReport, ProcPlace, StatusReport};
use crate::jobexec::{ExecDown, ExecUp, JobId};
use crate::tree::Rank;

/// Protocol name sent in every [`Hello`].
pub const MAGIC: &str = "dvmlab";
/// Protocol version; a peer with another version is refused.
pub const VERSION: u32 = 1;
/// Largest frame accepted.
pub const MAX_FRAME: usize = 16 << 20;

/// The first frame on every connection, sent by the side that connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub version: u32,
    pub nspace: String,
    pub peer: Peer,
}

/// Who is connecting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Peer {
    /// A daemon of the DVM phoning home to its parent (or a healed-to ancestor).
    Daemon { rank: Rank, host: String },
    /// A tool such as `pctl`, talking to the controller.
    Tool,
}

/// A member of a subtree, as reported upward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub rank: Rank,
    pub host: String,
    /// The rank it is connected to.
    pub parent: Rank,
    /// How many times this daemon has connected upward. A report with a lower epoch than one
    /// already seen is stale (it travelled an old path) and is ignored.
    pub epoch: u64,
}

/// A rank as of one of its connections, for withdrawing exactly that connection's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEpoch {
    pub rank: Rank,
    pub epoch: u64,
}

/// Traffic between daemons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
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
    /// Upward: a job-exec request (RFC 33 `job-exec.*`).
    ExecUp { req: ExecUp },
    /// Downward: a job-exec `hello` response.
    ExecDown { msg: ExecDown },
}

/// Payloads of routed messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    Ping { id: u64, path: Vec<Rank> },
    Pong { id: u64, path: Vec<Rank> },
}

/// How a job's processes are spread over the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MapBy {
    /// Round robin: process i on node i mod N.
    Node,
    /// Fill each node with consecutive processes before the next.
    Slot,
}

/// A job as `prun` submits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submit {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub nprocs: u32,
    pub map_by: MapBy,
    /// Only these hosts (by name), in this order.
    pub hosts: Option<Vec<String>>,
    pub time_limit_ms: Option<u64>,
    pub userid: u32,
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
        placement: Vec<ProcPlace>,
    },
    /// A line a job process wrote (`stream` is `stdout` or `stderr`; `proc` its index).
    JobOutput {
        id: JobId,
        proc: u32,
        stream: String,
        data: String,
    },
    /// The job is over (every rank released); `status` is the greatest wait status.
    JobEnded {
        id: JobId,
        status: i32,
        exception: Option<String>,
    },
    Jobs {
        jobs: Vec<JobReport>,
    },
    Signalled {
        id: JobId,
    },
}

/// Every frame on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Frame {
    Hello(Hello),
    Welcome { nspace: String, rank: Rank },
    Refuse { reason: String },
    Daemon(DaemonMsg),
    Tool(ToolRequest),
    ToolReply(ToolReply),
}

/// The codec for [`Frame`]s over any byte stream.
#[derive(Debug)]
pub struct FrameCodec {
    inner: LengthDelimitedCodec,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec {
            inner: LengthDelimitedCodec::builder()
                .max_frame_length(MAX_FRAME)
                .new_codec(),
        }
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        match self.inner.decode(src)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("undecodable frame: {e}"),
                )
            }),
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), Self::Error> {
        let bytes = serde_json::to_vec(&item)?;
        self.inner.encode(Bytes::from(bytes), dst)
    }
}

impl Hello {
    pub fn new(nspace: &str, peer: Peer) -> Hello {
        Hello {
            magic: MAGIC.into(),
            version: VERSION,
            nspace: nspace.into(),
            peer,
        }
    }

    /// Why this hello cannot be accepted by a member of `nspace`, if it cannot.
    pub fn mismatch(&self, nspace: &str) -> Option<String> {
        if self.magic != MAGIC {
            Some(format!("not a {MAGIC} peer (magic {:?})", self.magic))
        } else if self.version != VERSION {
            Some(format!(
                "protocol version {} not supported (this daemon speaks {VERSION})",
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
    use proptest::prelude::*;

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
    fn hello_mismatches_are_explained() {
        let h = Hello::new("a-prte-dvm", Peer::Tool);
        assert!(h.mismatch("a-prte-dvm").is_none());
        assert!(h.mismatch("b-prte-dvm").unwrap().contains("namespace"));
        let old = Hello { version: 0, ..h };
        assert!(old.mismatch("a-prte-dvm").unwrap().contains("version"));
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
}
