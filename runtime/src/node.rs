//! The daemon core: one DVM member's protocol state — its upward link, the links of the daemons
//! that joined below it, the routes to every rank beneath it, and (on the controller) the
//! roster that says when the DVM is formed.
//!
//! Sans-IO: the shell feeds [`Input`]s with the current monotonic time and carries out the
//! [`Output`]s. No sockets, clocks or threads in here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::contract::{MemberState, MemberStatus, PingReport, StatusReport};
use crate::identity::{Identity, Role};
use crate::tree::{RadixTree, Rank};
use crate::uplink::{Policy, Uplink};
use crate::wire::{Body, DaemonMsg, Frame, Member, Peer, ToolReply, ToolRequest};

/// A connection, numbered by the shell.
pub type LinkId = u64;

/// How long a stopping daemon waits for its children to confirm before exiting anyway.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the controller waits for a pong.
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Static facts the core needs: who it is and the DVM's shape.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub identity: Identity,
    /// The host of every rank, indexed by rank.
    pub hosts: Vec<String>,
    pub tree: RadixTree,
    pub policy: Policy,
    pub controller_listed: bool,
    pub controller_uri: String,
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Start,
    /// The connection to ancestor `rank` is up and welcomed us.
    UplinkUp {
        link: LinkId,
        rank: Rank,
    },
    /// A connection attempt to `rank` failed.
    UplinkFailed {
        rank: Rank,
        reason: String,
    },
    /// A peer connected to us and said hello.
    Hello {
        link: LinkId,
        peer: Peer,
    },
    Frame {
        link: LinkId,
        msg: DaemonMsg,
    },
    Tool {
        link: LinkId,
        req: ToolRequest,
    },
    Closed {
        link: LinkId,
    },
    Timer(Timer),
}

/// Timers the core asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    StopGrace,
    Ping(u64),
}

/// Something for the shell to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// After `delay`, connect to `rank` and say hello; report `UplinkUp` or `UplinkFailed`.
    Connect {
        rank: Rank,
        delay: Duration,
    },
    Send {
        link: LinkId,
        frame: Frame,
    },
    /// Flush what was sent on `link`, then close it.
    Close {
        link: LinkId,
    },
    SetTimer {
        timer: Timer,
        delay: Duration,
    },
    Note(Note),
    /// Flush every link and exit the process with status 0.
    Exit,
}

/// Events worth a log line. Job and proc state notes are logged only when the matching
/// `*LogJobState` / `*LogProcState` key is on.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    DvmReady {
        nspace: String,
        daemons: u32,
    },
    DvmIncomplete {
        joined: u32,
        expected: u32,
    },
    Joined {
        parent: Rank,
        tree_parent: Rank,
    },
    Healing {
        from: Rank,
        to: Rank,
    },
    ConnectFailed {
        rank: Rank,
        reason: String,
        retry_in: Duration,
    },
    UplinkLost {
        rank: Rank,
    },
    Refused {
        link: LinkId,
        reason: String,
    },
    Unroutable {
        dst: Rank,
    },
    /// The state of the DVM job (the daemons' job) changed.
    JobState {
        state: &'static str,
    },
    /// A daemon's state changed, as seen from here.
    ProcState {
        rank: Rank,
        state: &'static str,
    },
    StopIncomplete {
        ranks: Vec<Rank>,
    },
}

#[derive(Debug, Clone)]
struct Child {
    rank: Rank,
    /// Every rank reachable through this link, `rank` included once reported.
    members: BTreeSet<Rank>,
}

#[derive(Debug, Clone)]
struct PendingPing {
    tool: LinkId,
    rank: Rank,
    sent: Duration,
}

#[derive(Debug, Clone, Default)]
struct Stopping {
    tool: Option<LinkId>,
}

/// One member's protocol state. See the module documentation.
#[derive(Debug)]
pub struct Node {
    cfg: NodeConfig,
    me: Rank,
    uplink: Option<Uplink>,
    up: Option<(LinkId, Rank)>,
    children: BTreeMap<LinkId, Child>,
    tools: BTreeSet<LinkId>,
    /// Rank → the child link it is reachable through.
    routes: HashMap<Rank, LinkId>,
    /// What each rank below reported about itself.
    below: HashMap<Rank, Member>,
    /// Controller only: ranks that ever joined, for telling `waiting` from `lost`.
    ever_joined: BTreeSet<Rank>,
    formed: bool,
    pings: HashMap<u64, PendingPing>,
    next_ping: u64,
    stopping: Option<Stopping>,
    out: Vec<Output>,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Node {
        let me = cfg.identity.rank;
        let uplink =
            (cfg.identity.role == Role::Daemon).then(|| Uplink::new(me, cfg.tree, cfg.policy));
        Node {
            me,
            uplink,
            up: None,
            children: BTreeMap::new(),
            tools: BTreeSet::new(),
            routes: HashMap::new(),
            below: HashMap::new(),
            ever_joined: BTreeSet::new(),
            formed: false,
            pings: HashMap::new(),
            next_ping: 1,
            stopping: None,
            out: Vec::new(),
            cfg,
        }
    }

    fn is_controller(&self) -> bool {
        self.uplink.is_none()
    }

    pub fn rank(&self) -> Rank {
        self.me
    }

    /// Whether the DVM is formed (meaningful on the controller).
    pub fn formed(&self) -> bool {
        self.formed
    }

    /// Ranks currently reachable below this daemon.
    pub fn reachable_below(&self) -> BTreeSet<Rank> {
        self.routes.keys().copied().collect()
    }

    /// The rank this daemon is connected to upward, if connected.
    pub fn parent_link(&self) -> Option<Rank> {
        self.up.map(|(_, r)| r)
    }

    /// Feeds one input at monotonic time `now`; returns what to do.
    pub fn handle(&mut self, now: Duration, input: Input) -> Vec<Output> {
        match input {
            Input::Start => self.on_start(now),
            Input::UplinkUp { link, rank } => self.on_uplink_up(link, rank),
            Input::UplinkFailed { rank, reason } => self.on_uplink_failed(now, rank, reason),
            Input::Hello { link, peer } => self.on_hello(link, peer),
            Input::Frame { link, msg } => self.on_frame(now, link, msg),
            Input::Tool { link, req } => self.on_tool(now, link, req),
            Input::Closed { link } => self.on_closed(now, link),
            Input::Timer(t) => self.on_timer(t),
        }
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, o: Output) {
        self.out.push(o);
    }

    fn note(&mut self, n: Note) {
        self.out.push(Output::Note(n));
    }

    fn send(&mut self, link: LinkId, msg: DaemonMsg) {
        self.emit(Output::Send {
            link,
            frame: Frame::Daemon(msg),
        });
    }

    fn reply(&mut self, tool: LinkId, reply: ToolReply) {
        self.emit(Output::Send {
            link: tool,
            frame: Frame::ToolReply(reply),
        });
    }

    fn on_start(&mut self, now: Duration) {
        self.note(Note::JobState { state: "RUNNING" });
        self.note(Note::ProcState {
            rank: self.me,
            state: "RUNNING",
        });
        match self.uplink.as_mut() {
            Some(u) => {
                let a = u.start(now);
                self.emit(Output::Connect {
                    rank: a.rank,
                    delay: a.delay,
                });
            }
            None => self.check_formed(),
        }
    }

    fn self_member(&self, parent: Rank) -> Member {
        Member {
            rank: self.me,
            host: self.cfg.identity.host.clone(),
            parent,
        }
    }

    fn on_uplink_up(&mut self, link: LinkId, rank: Rank) {
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        u.connected();
        self.up = Some((link, rank));
        let tree_parent = self.cfg.tree.parent(self.me).unwrap_or(0);
        self.note(Note::Joined {
            parent: rank,
            tree_parent,
        });
        let mut members = vec![self.self_member(rank)];
        let mut below: Vec<&Member> = self.below.values().collect();
        below.sort_by_key(|m| m.rank);
        members.extend(below.into_iter().cloned());
        self.send(link, DaemonMsg::Report { members });
    }

    fn on_uplink_failed(&mut self, now: Duration, rank: Rank, reason: String) {
        if self.stopping.is_some() {
            return;
        }
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        if u.target() != rank {
            return;
        }
        let a = u.failed(now);
        if let Some(from) = a.healed_from {
            self.note(Note::Healing { from, to: a.rank });
        } else {
            self.note(Note::ConnectFailed {
                rank,
                reason,
                retry_in: a.delay,
            });
        }
        self.emit(Output::Connect {
            rank: a.rank,
            delay: a.delay,
        });
    }

    fn refuse(&mut self, link: LinkId, reason: String) {
        self.note(Note::Refused {
            link,
            reason: reason.clone(),
        });
        self.emit(Output::Send {
            link,
            frame: Frame::Refuse { reason },
        });
        self.emit(Output::Close { link });
    }

    fn on_hello(&mut self, link: LinkId, peer: Peer) {
        let welcome = Frame::Welcome {
            nspace: self.cfg.identity.nspace.clone(),
            rank: self.me,
        };
        match peer {
            Peer::Tool if self.is_controller() => {
                self.tools.insert(link);
                self.emit(Output::Send {
                    link,
                    frame: welcome,
                });
            }
            Peer::Tool => self.refuse(
                link,
                format!(
                    "rank {} is not the controller; tools talk to rank 0 on {}",
                    self.me, self.cfg.hosts[0]
                ),
            ),
            Peer::Daemon { .. } if self.stopping.is_some() => {
                self.refuse(link, "the DVM is stopping".into())
            }
            Peer::Daemon { rank, host } => {
                let size = self.cfg.tree.size();
                if rank == 0 || rank >= size || rank == self.me {
                    return self.refuse(
                        link,
                        format!("rank {rank} ({host}) is not a daemon rank of this DVM (1..{size}) or is this daemon's own"),
                    );
                }
                if !self.cfg.tree.is_ancestor_or_self(self.me, rank) {
                    return self.refuse(
                        link,
                        format!("rank {} is not an ancestor of rank {rank}", self.me),
                    );
                }
                self.children.insert(
                    link,
                    Child {
                        rank,
                        members: BTreeSet::new(),
                    },
                );
                self.emit(Output::Send {
                    link,
                    frame: welcome,
                });
            }
        }
    }

    fn on_frame(&mut self, now: Duration, link: LinkId, msg: DaemonMsg) {
        let from_child = self.children.contains_key(&link);
        let from_parent = self.up.is_some_and(|(l, _)| l == link);
        match msg {
            DaemonMsg::Report { members } if from_child => self.on_report(link, members),
            DaemonMsg::Lost { ranks } if from_child => self.on_lost(link, ranks),
            DaemonMsg::Routed { src, dst, body } if from_child || from_parent => {
                self.on_routed(now, src, dst, body)
            }
            DaemonMsg::Shutdown if from_parent => self.begin_stop(None),
            other => self.note(Note::Refused {
                link,
                reason: format!("unexpected message on this link: {other:?}"),
            }),
        }
    }

    fn on_report(&mut self, link: LinkId, members: Vec<Member>) {
        let size = self.cfg.tree.size();
        let mut accepted = Vec::new();
        for m in members {
            if m.rank == 0 || m.rank >= size || m.rank == self.me {
                continue;
            }
            if let Some(old) = self.routes.insert(m.rank, link) {
                if old != link {
                    if let Some(c) = self.children.get_mut(&old) {
                        c.members.remove(&m.rank);
                    }
                }
            }
            if let Some(c) = self.children.get_mut(&link) {
                c.members.insert(m.rank);
            }
            self.below.insert(m.rank, m.clone());
            if m.parent == self.me {
                self.note(Note::ProcState {
                    rank: m.rank,
                    state: "JOINED",
                });
            }
            accepted.push(m);
        }
        if accepted.is_empty() {
            return;
        }
        if self.is_controller() {
            self.ever_joined.extend(accepted.iter().map(|m| m.rank));
            self.check_formed();
        } else if let Some((up, _)) = self.up {
            self.send(up, DaemonMsg::Report { members: accepted });
        }
    }

    fn on_lost(&mut self, link: LinkId, ranks: Vec<Rank>) {
        let gone: Vec<Rank> = ranks
            .into_iter()
            .filter(|r| self.routes.get(r) == Some(&link))
            .collect();
        self.forget(link, gone);
    }

    /// Drops routes to `gone` (all reached through `link`) and tells whoever is above.
    fn forget(&mut self, link: LinkId, gone: Vec<Rank>) {
        if gone.is_empty() {
            return;
        }
        for r in &gone {
            self.routes.remove(r);
            self.below.remove(r);
            if let Some(c) = self.children.get_mut(&link) {
                c.members.remove(r);
            }
            self.note(Note::ProcState {
                rank: *r,
                state: "LOST",
            });
        }
        if self.is_controller() {
            self.check_formed();
        } else if let Some((up, _)) = self.up {
            self.send(up, DaemonMsg::Lost { ranks: gone });
        }
    }

    fn check_formed(&mut self) {
        let expected = self.cfg.tree.size();
        let joined = self.routes.len() as u32 + 1;
        let formed = joined == expected;
        if formed && !self.formed {
            self.note(Note::DvmReady {
                nspace: self.cfg.identity.nspace.clone(),
                daemons: expected,
            });
            self.note(Note::JobState { state: "VM READY" });
        } else if !formed && self.formed && self.stopping.is_none() {
            self.note(Note::DvmIncomplete { joined, expected });
        }
        self.formed = formed;
    }

    fn route(&mut self, src: Rank, dst: Rank, body: Body) {
        let msg = DaemonMsg::Routed { src, dst, body };
        if let Some(&link) = self.routes.get(&dst) {
            self.send(link, msg);
        } else if let (Some((up, _)), false) = (self.up, dst == self.me) {
            self.send(up, msg);
        } else {
            self.note(Note::Unroutable { dst });
        }
    }

    fn on_routed(&mut self, now: Duration, src: Rank, dst: Rank, body: Body) {
        let body = match body {
            Body::Ping { id, mut path } => {
                path.push(self.me);
                Body::Ping { id, path }
            }
            Body::Pong { id, mut path } => {
                path.push(self.me);
                Body::Pong { id, path }
            }
        };
        if dst != self.me {
            return self.route(src, dst, body);
        }
        match body {
            Body::Ping { id, path } => self.route(self.me, src, Body::Pong { id, path }),
            Body::Pong { id, path } => self.finish_ping(now, id, path),
        }
    }

    fn finish_ping(&mut self, now: Duration, id: u64, path: Vec<Rank>) {
        let Some(p) = self.pings.remove(&id) else {
            return;
        };
        let report = PingReport {
            rank: p.rank,
            host: self.cfg.hosts[p.rank as usize].clone(),
            ok: true,
            rtt_us: Some(now.saturating_sub(p.sent).as_micros() as u64),
            path,
            error: None,
        };
        self.reply(p.tool, ToolReply::Ping(report));
    }

    fn on_tool(&mut self, now: Duration, link: LinkId, req: ToolRequest) {
        if !self.tools.contains(&link) {
            return self.note(Note::Refused {
                link,
                reason: "tool request before hello".into(),
            });
        }
        match req {
            ToolRequest::Status => {
                let s = self.status();
                self.reply(link, ToolReply::Status(s));
            }
            ToolRequest::Ping { rank } => self.start_ping(now, link, rank),
            ToolRequest::Stop => self.begin_stop(Some(link)),
        }
    }

    fn start_ping(&mut self, now: Duration, tool: LinkId, rank: Rank) {
        let size = self.cfg.tree.size();
        let fail = |msg: String| PingReport {
            rank,
            host: self
                .cfg
                .hosts
                .get(rank as usize)
                .cloned()
                .unwrap_or_default(),
            ok: false,
            rtt_us: None,
            path: vec![],
            error: Some(msg),
        };
        if rank >= size {
            let r = fail(format!("rank {rank} is not in this DVM (0..{size})"));
            return self.reply(tool, ToolReply::Ping(r));
        }
        if rank == self.me {
            let r = PingReport {
                ok: true,
                rtt_us: Some(0),
                path: vec![self.me],
                error: None,
                ..fail(String::new())
            };
            return self.reply(tool, ToolReply::Ping(r));
        }
        if !self.routes.contains_key(&rank) {
            let r = fail(format!("rank {rank} has not joined the DVM"));
            return self.reply(tool, ToolReply::Ping(r));
        }
        let id = self.next_ping;
        self.next_ping += 1;
        self.pings.insert(
            id,
            PendingPing {
                tool,
                rank,
                sent: now,
            },
        );
        self.emit(Output::SetTimer {
            timer: Timer::Ping(id),
            delay: PING_TIMEOUT,
        });
        self.route(
            self.me,
            rank,
            Body::Ping {
                id,
                path: vec![self.me],
            },
        );
    }

    fn begin_stop(&mut self, tool: Option<LinkId>) {
        if self.stopping.is_some() {
            if let Some(t) = tool {
                self.reply(
                    t,
                    ToolReply::Error {
                        message: "the DVM is already stopping".into(),
                    },
                );
            }
            return;
        }
        self.stopping = Some(Stopping { tool });
        self.note(Note::JobState {
            state: "TERMINATING",
        });
        let links: Vec<LinkId> = self.children.keys().copied().collect();
        for l in links {
            self.send(l, DaemonMsg::Shutdown);
        }
        self.emit(Output::SetTimer {
            timer: Timer::StopGrace,
            delay: STOP_GRACE,
        });
        self.maybe_finish_stop();
    }

    fn maybe_finish_stop(&mut self) {
        if self.children.is_empty() {
            self.finish_stop(Vec::new());
        }
    }

    fn finish_stop(&mut self, unconfirmed: Vec<Rank>) {
        let Some(st) = self.stopping.take() else {
            return;
        };
        if !unconfirmed.is_empty() {
            self.note(Note::StopIncomplete {
                ranks: unconfirmed.clone(),
            });
        }
        self.note(Note::ProcState {
            rank: self.me,
            state: "TERMINATED",
        });
        self.note(Note::JobState {
            state: "TERMINATED",
        });
        if let Some(t) = st.tool {
            self.reply(t, ToolReply::Stopped { unconfirmed });
        }
        self.emit(Output::Exit);
    }

    fn on_closed(&mut self, now: Duration, link: LinkId) {
        if self.tools.remove(&link) {
            self.pings.retain(|_, p| p.tool != link);
            return;
        }
        if let Some(child) = self.children.remove(&link) {
            let gone: Vec<Rank> = child.members.iter().copied().collect();
            if gone.is_empty() && self.stopping.is_none() {
                self.note(Note::ProcState {
                    rank: child.rank,
                    state: "LOST",
                });
            }
            self.forget(link, gone);
            if self.stopping.is_some() {
                self.maybe_finish_stop();
            }
            return;
        }
        if self.up.is_some_and(|(l, _)| l == link) {
            let (_, rank) = self.up.take().unwrap_or((link, 0));
            if self.stopping.is_some() {
                return;
            }
            self.note(Note::UplinkLost { rank });
            if let Some(u) = self.uplink.as_mut() {
                let a = u.lost(now);
                self.emit(Output::Connect {
                    rank: a.rank,
                    delay: a.delay,
                });
            }
        }
    }

    fn on_timer(&mut self, t: Timer) {
        match t {
            Timer::StopGrace => {
                let left: Vec<Rank> = self.children.values().map(|c| c.rank).collect();
                if self.stopping.is_some() {
                    self.finish_stop(left);
                }
            }
            Timer::Ping(id) => {
                if let Some(p) = self.pings.remove(&id) {
                    let r = PingReport {
                        rank: p.rank,
                        host: self.cfg.hosts[p.rank as usize].clone(),
                        ok: false,
                        rtt_us: None,
                        path: vec![],
                        error: Some(format!("no answer within {PING_TIMEOUT:?}")),
                    };
                    self.reply(p.tool, ToolReply::Ping(r));
                }
            }
        }
    }

    /// The controller's view of the DVM, for `pctl status`.
    pub fn status(&self) -> StatusReport {
        let size = self.cfg.tree.size();
        let members = (0..size)
            .map(|r| {
                let joined = r == self.me || self.routes.contains_key(&r);
                MemberStatus {
                    rank: r,
                    host: self.cfg.hosts[r as usize].clone(),
                    parent: self.below.get(&r).map(|m| m.parent),
                    tree_parent: self.cfg.tree.parent(r),
                    state: if joined {
                        MemberState::Joined
                    } else if self.ever_joined.contains(&r) {
                        MemberState::Lost
                    } else {
                        MemberState::Waiting
                    },
                }
            })
            .collect();
        StatusReport {
            namespace: self.cfg.identity.nspace.clone(),
            formed: self.formed,
            expected: size,
            joined: self.routes.len() as u32 + 1,
            radix: self.cfg.tree.radix(),
            controller_host: self.cfg.hosts[0].clone(),
            controller_uri: self.cfg.controller_uri.clone(),
            controller_listed: self.cfg.controller_listed,
            formed_at_unix_ms: None,
            members,
        }
    }
}
