//! The daemon core: one DVM member's protocol state — its upward link, the links of the daemons
//! that joined below it, the routes to every rank beneath it, link liveness, and (on the
//! controller) the view that says when the DVM is formed.
//!
//! Sans-IO: the shell feeds [`Input`]s with the current monotonic time and carries out the
//! [`Output`]s. No sockets, clocks or threads in here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::identity::{Identity, Role};
use crate::roster::{Roster, State};
use crate::tree::{RadixTree, Rank};
use crate::uplink::{Policy, Uplink};
use dvmlab_proto::contract::{MemberState, MemberStatus, PingReport, StatusReport};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::wire::{Body, DaemonMsg, Frame, Member, Peer, RankEpoch, ToolReply, ToolRequest};

/// A connection, numbered by the shell.
pub type LinkId = u64;

/// How long a stopping daemon waits for its children to confirm before exiting anyway.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the controller waits for a pong.
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Hops a routed message may take; far more than any tree's round trip needs.
pub const ROUTE_TTL: u8 = 255;
/// A link on which nothing arrived for this many heartbeat intervals is declared dead.
pub const MISSED_HEARTBEATS: u32 = 3;

/// Static facts the core needs: who it is and the DVM's shape.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub identity: Identity,
    /// The membership `prte.conf` defines (this daemon's copy; the controller's is the one
    /// whose states count).
    pub roster: Roster,
    pub tree: RadixTree,
    pub policy: Policy,
    /// Heartbeat interval on daemon links.
    pub heartbeat: Duration,
    /// Grows with every start of the daemon on this host (the shell uses its start time in
    /// microseconds). Epochs count up from it, so a restarted daemon's reports are newer
    /// than anything its previous incarnation sent.
    pub incarnation: u64,
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
    /// A peer connected to us and said hello; `version` is the newest protocol version both
    /// speak (the shell checked there is one).
    Hello {
        link: LinkId,
        peer: Peer,
        version: u32,
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
    Heartbeat,
    StopGrace,
    Ping(u64),
}

/// What the overlay asks of the world outside the cores; the daemon core passes these on
/// to the shell as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Io {
    /// After `delay`, connect to `rank` and say hello; report `UplinkUp` or `UplinkFailed`.
    Connect {
        rank: Rank,
        delay: Duration,
    },
    Send {
        link: LinkId,
        frame: Frame,
    },
    /// Flush what was sent on `link`, then close it and stop reading from it. The core has
    /// already forgotten the link; a later `Closed` for it is ignored.
    Close {
        link: LinkId,
    },
    Note(Note),
    /// Flush every link and exit the process with status 0.
    Exit,
}

/// Something for the daemon core to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Io(Io),
    SetTimer {
        timer: Timer,
        delay: Duration,
    },
    /// For the job-exec module: its topology changed, or a job-exec frame arrived on a link
    /// of the right kind (requests from children, responses from the parent).
    Exec(crate::exec::Input),
    /// A job request from a tool (the controller's job manager answers it).
    JobTool {
        link: LinkId,
        req: ToolRequest,
    },
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
    /// A link went silent for `MISSED_HEARTBEATS` intervals and was dropped.
    LinkDead {
        rank: Rank,
    },
    /// A child reconnected while its old link still looked open; the old one was dropped.
    Replaced {
        rank: Rank,
    },
    Refused {
        link: LinkId,
        reason: String,
    },
    Unroutable {
        dst: Rank,
    },
    /// The peer on `link` did not understand something this daemon sent.
    Unsupported {
        link: LinkId,
        what: String,
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

/// A stop in progress: the ranks below that have not yet confirmed they stopped, and those
/// that have.
#[derive(Debug, Clone, Default)]
struct Stopping {
    tool: Option<LinkId>,
    pending: BTreeSet<Rank>,
    confirmed: BTreeSet<Rank>,
}

/// One member's protocol state. See the module documentation.
#[derive(Debug)]
pub struct Node {
    cfg: NodeConfig,
    me: Rank,
    uplink: Option<Uplink>,
    up: Option<(LinkId, Rank)>,
    /// What the job-exec module was last told of the topology.
    exec_children: Vec<(LinkId, Rank, IdSet)>,
    exec_up: Option<LinkId>,
    /// Incremented on every upward connection; sent with this daemon's reports.
    epoch: u64,
    children: BTreeMap<LinkId, Child>,
    tools: BTreeSet<LinkId>,
    /// Rank → the child link it is reachable through, and how fresh that route is:
    /// `(via, epoch)` of the report it came from (see `Member::via`).
    routes: HashMap<Rank, (LinkId, (u64, u64))>,
    /// What each rank below reported about itself.
    below: HashMap<Rank, Member>,
    /// When each daemon link (up or down) last delivered anything.
    last_heard: HashMap<LinkId, Duration>,
    /// The membership; on the controller, with every member's state.
    roster: Roster,
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
            epoch: cfg.incarnation,
            children: BTreeMap::new(),
            tools: BTreeSet::new(),
            routes: HashMap::new(),
            below: HashMap::new(),
            last_heard: HashMap::new(),
            exec_children: Vec::new(),
            exec_up: None,
            roster: cfg.roster.clone(),
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

    /// Whether `link` is a tool that said hello.
    pub fn is_tool(&self, link: LinkId) -> bool {
        self.tools.contains(&link)
    }

    pub fn rank(&self) -> Rank {
        self.me
    }

    /// Whether the DVM is formed (meaningful on the controller).
    pub fn formed(&self) -> bool {
        self.formed
    }

    /// The membership as this daemon knows it.
    pub fn roster(&self) -> &Roster {
        &self.roster
    }

    /// Feeds one input at monotonic time `now`; returns what to do.
    pub fn handle(&mut self, now: Duration, input: Input) -> Vec<Output> {
        match input {
            Input::Start => self.on_start(now),
            Input::UplinkUp { link, rank } => self.on_uplink_up(now, link, rank),
            Input::UplinkFailed { rank, reason } => self.on_uplink_failed(now, rank, reason),
            Input::Hello {
                link,
                peer,
                version,
            } => self.on_hello(now, link, peer, version),
            Input::Frame { link, msg } => self.on_frame(now, link, msg),
            Input::Tool { link, req } => self.on_tool(now, link, req),
            Input::Closed { link } => self.on_closed(now, link),
            Input::Timer(t) => self.on_timer(now, t),
        }
        self.exec_topology();
        self.check();
        std::mem::take(&mut self.out)
    }

    /// Tells the job-exec module about new child links, subtrees or a new upward link.
    fn exec_topology(&mut self) {
        let children: Vec<(LinkId, Rank, IdSet)> = self
            .children
            .iter()
            .map(|(l, c)| {
                let mut ids: IdSet = c.members.iter().copied().collect();
                ids.insert(c.rank);
                (*l, c.rank, ids)
            })
            .collect();
        let up = self.up.map(|(l, _)| l);
        if children != self.exec_children {
            self.exec_children = children.clone();
            self.emit(Output::Exec(crate::exec::Input::Children(children)));
        }
        if up != self.exec_up {
            self.exec_up = up;
            self.emit(Output::Exec(crate::exec::Input::Uplink(up)));
        }
    }

    fn emit(&mut self, o: Output) {
        self.out.push(o);
    }

    fn note(&mut self, n: Note) {
        self.io(Io::Note(n));
    }

    fn io(&mut self, e: Io) {
        self.out.push(Output::Io(e));
    }

    fn send(&mut self, link: LinkId, msg: DaemonMsg) {
        self.io(Io::Send {
            link,
            frame: Frame::Daemon(msg),
        });
    }

    fn reply(&mut self, tool: LinkId, reply: ToolReply) {
        self.io(Io::Send {
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
        self.emit(Output::SetTimer {
            timer: Timer::Heartbeat,
            delay: self.cfg.heartbeat,
        });
        match self.uplink.as_mut() {
            Some(u) => {
                let a = u.start(now);
                self.io(Io::Connect {
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
            epoch: self.epoch,
            via: self.epoch,
        }
    }

    fn on_uplink_up(&mut self, now: Duration, link: LinkId, rank: Rank) {
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        u.connected();
        self.up = Some((link, rank));
        // The time of this connection (the incarnation is the start time, `now` the time since),
        // so epochs of different daemons compare as the times they (re)connected.
        let at = self.cfg.incarnation.saturating_add(now.as_micros() as u64);
        self.epoch = (self.epoch + 1).max(at);
        self.last_heard.insert(link, now);
        let tree_parent = self.cfg.tree.parent(self.me).unwrap_or(0);
        self.note(Note::Joined {
            parent: rank,
            tree_parent,
        });
        let mut members = vec![self.self_member(rank)];
        let mut below: Vec<&Member> = self.below.values().collect();
        below.sort_by_key(|m| m.rank);
        let epoch = self.epoch;
        members.extend(below.into_iter().cloned().map(|mut m| {
            m.via = m.via.max(epoch);
            m
        }));
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
        self.io(Io::Connect {
            rank: a.rank,
            delay: a.delay,
        });
    }

    fn refuse(&mut self, link: LinkId, reason: String) {
        self.note(Note::Refused {
            link,
            reason: reason.clone(),
        });
        self.io(Io::Send {
            link,
            frame: Frame::Refuse { reason },
        });
        self.io(Io::Close { link });
    }

    fn on_hello(&mut self, now: Duration, link: LinkId, peer: Peer, version: u32) {
        let welcome = Frame::Welcome {
            nspace: self.cfg.identity.nspace.clone(),
            rank: self.me,
            version,
            caps: dvmlab_proto::wire::CAPS,
        };
        match peer {
            Peer::Tool if self.is_controller() => {
                self.tools.insert(link);
                self.io(Io::Send {
                    link,
                    frame: welcome,
                });
            }
            Peer::Tool => self.refuse(
                link,
                format!(
                    "rank {} is not the controller; tools talk to rank 0 on {}",
                    self.me,
                    self.roster.host(0)
                ),
            ),
            Peer::Daemon { rank, host } => {
                let size = self.roster.len();
                if rank == 0 || !self.roster.contains(rank) || rank == self.me {
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
                // A child that reconnects while its old link still looks open (it died
                // without a FIN, or the network dropped it): the new link wins.
                let stale: Vec<LinkId> = self
                    .children
                    .iter()
                    .filter(|(_, c)| c.rank == rank)
                    .map(|(l, _)| *l)
                    .collect();
                for old in stale {
                    self.note(Note::Replaced { rank });
                    self.io(Io::Close { link: old });
                    self.drop_child(old);
                }
                self.children.insert(
                    link,
                    Child {
                        rank,
                        members: BTreeSet::new(),
                    },
                );
                self.last_heard.insert(link, now);
                self.io(Io::Send {
                    link,
                    frame: welcome,
                });
                // Version 1 had no wireup message; its daemons know the membership from the
                // conf alone.
                if version >= 2 {
                    let wireup = self.roster.wireup();
                    self.send(link, DaemonMsg::Wireup { wireup });
                }
                // Only a rank never heard from is joining; a lost one stays lost, and a wired one
                // (re-homing while its old route stands) stays wired, until its report.
                if self.is_controller() && self.roster.state(rank) == Some(State::Waiting) {
                    self.roster.set(rank, State::Joining);
                }
                // A daemon that reaches us while we stop is told to stop too, and awaited.
                if let Some(st) = self.stopping.as_mut() {
                    st.pending.insert(rank);
                    self.send(link, DaemonMsg::Shutdown);
                }
            }
        }
    }

    fn on_frame(&mut self, now: Duration, link: LinkId, msg: DaemonMsg) {
        let from_child = self.children.contains_key(&link);
        let from_parent = self.up.is_some_and(|(l, _)| l == link);
        if from_child || from_parent {
            self.last_heard.insert(link, now);
        }
        match msg {
            DaemonMsg::Heartbeat if from_child || from_parent => {}
            DaemonMsg::Report { members } if from_child => self.on_report(link, members),
            DaemonMsg::Lost { ranks } if from_child => self.on_lost(link, ranks),
            DaemonMsg::Routed {
                src,
                dst,
                ttl,
                body,
            } if from_child || from_parent => self.on_routed(now, src, dst, ttl, body),
            DaemonMsg::Shutdown if from_parent => self.begin_stop(None),
            DaemonMsg::ExecUp { req } if from_child => {
                self.emit(Output::Exec(crate::exec::Input::Up { link, req }))
            }
            DaemonMsg::ExecDown { msg } if from_parent => {
                self.emit(Output::Exec(crate::exec::Input::Down(msg)))
            }
            DaemonMsg::Wireup { wireup } if from_parent => {
                if let Err(e) = self.roster.apply(&wireup) {
                    self.note(Note::Refused {
                        link,
                        reason: format!("membership from the parent not taken: {e}"),
                    });
                }
            }
            DaemonMsg::Unknown if from_child || from_parent => {
                self.send(
                    link,
                    DaemonMsg::Unsupported {
                        what: format!(
                            "a message of a kind protocol version {} does not have",
                            dvmlab_proto::wire::VERSION
                        ),
                    },
                );
            }
            DaemonMsg::Unsupported { what } if from_child || from_parent => {
                self.note(Note::Unsupported { link, what });
            }
            DaemonMsg::Stopped { ranks } if from_child => {
                if let Some(st) = self.stopping.as_mut() {
                    for r in ranks {
                        st.pending.remove(&r);
                        st.confirmed.insert(r);
                    }
                    self.maybe_finish_stop();
                }
            }
            other => {
                let mut what = format!("{other:?}");
                what.truncate(200);
                self.note(Note::Refused {
                    link,
                    reason: format!("unexpected message on this link: {what}"),
                });
                self.io(Io::Close { link });
            }
        }
    }

    fn on_report(&mut self, link: LinkId, members: Vec<Member>) {
        let Some(child) = self.children.get(&link).map(|c| c.rank) else {
            return;
        };
        let mut accepted = Vec::new();
        let mut foreign = Vec::new();
        for m in members {
            if m.rank == 0 || !self.roster.contains(m.rank) || m.rank == self.me {
                continue;
            }
            // A daemon speaks only for its own subtree: whoever it is connected to, the ranks
            // below it are its descendants by the tree formula.
            if !self.cfg.tree.is_ancestor_or_self(child, m.rank) {
                foreign.push(m.rank);
                continue;
            }
            let fresh = (m.via, m.epoch);
            match self.routes.get(&m.rank) {
                // Travelled an older path than the route we have: stale.
                Some(&(_, f)) if fresh < f => continue,
                Some(&(old, _)) if old != link => {
                    if let Some(c) = self.children.get_mut(&old) {
                        c.members.remove(&m.rank);
                    }
                }
                _ => {}
            }
            self.routes.insert(m.rank, (link, fresh));
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
        if !foreign.is_empty() {
            self.note(Note::Refused {
                link,
                reason: format!(
                    "rank {child} reported ranks {foreign:?} outside its subtree; ignored"
                ),
            });
        }
        if accepted.is_empty() {
            return;
        }
        if self.is_controller() {
            for m in &accepted {
                self.roster.set(m.rank, State::Wired);
            }
            self.check_formed();
        } else if let Some((up, _)) = self.up {
            let epoch = self.epoch;
            for m in &mut accepted {
                m.via = m.via.max(epoch);
            }
            self.send(up, DaemonMsg::Report { members: accepted });
        }
    }

    fn on_lost(&mut self, link: LinkId, ranks: Vec<RankEpoch>) {
        let gone: Vec<Rank> = ranks
            .into_iter()
            .filter(|re| self.routes.get(&re.rank) == Some(&(link, (re.via, re.epoch))))
            .map(|re| re.rank)
            .collect();
        self.forget(link, gone);
    }

    /// Drops routes to `gone` (all reached through `link`) and tells whoever is above.
    fn forget(&mut self, link: LinkId, gone: Vec<Rank>) {
        if gone.is_empty() {
            return;
        }
        let mut lost = Vec::with_capacity(gone.len());
        for r in gone {
            if let Some((_, (via, epoch))) = self.routes.remove(&r) {
                // As the parent recorded the route: through this daemon's connection.
                let via = via.max(self.epoch);
                lost.push(RankEpoch {
                    rank: r,
                    epoch,
                    via,
                });
            }
            self.below.remove(&r);
            if let Some(c) = self.children.get_mut(&link) {
                c.members.remove(&r);
            }
            if self.is_controller() {
                self.roster.set(r, State::Lost);
            }
            self.note(Note::ProcState {
                rank: r,
                state: "LOST",
            });
        }
        if self.is_controller() {
            self.check_formed();
            let ids: IdSet = lost.iter().map(|l| l.rank).collect();
            if !ids.is_empty() {
                self.emit(Output::Exec(crate::exec::Input::Lost(ids)));
            }
        } else if let Some((up, _)) = self.up {
            self.send(up, DaemonMsg::Lost { ranks: lost });
        }
    }

    fn check_formed(&mut self) {
        let expected = self.roster.expected();
        let joined = self.roster.count(State::Wired);
        let formed = self.roster.formed();
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

    fn route(&mut self, src: Rank, dst: Rank, ttl: u8, body: Body) {
        let Some(ttl) = ttl.checked_sub(1) else {
            return self.note(Note::Unroutable { dst });
        };
        let msg = DaemonMsg::Routed {
            src,
            dst,
            ttl,
            body,
        };
        if let Some(&(link, _)) = self.routes.get(&dst) {
            self.send(link, msg);
        } else if let (Some((up, _)), false) = (self.up, dst == self.me) {
            self.send(up, msg);
        } else {
            self.note(Note::Unroutable { dst });
        }
    }

    fn on_routed(&mut self, now: Duration, src: Rank, dst: Rank, ttl: u8, body: Body) {
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
            return self.route(src, dst, ttl, body);
        }
        match body {
            Body::Ping { id, path } => self.route(self.me, src, ROUTE_TTL, Body::Pong { id, path }),
            Body::Pong { id, path } => self.finish_ping(now, id, path),
        }
    }

    fn finish_ping(&mut self, now: Duration, id: u64, path: Vec<Rank>) {
        let Some(p) = self.pings.remove(&id) else {
            return;
        };
        let report = PingReport {
            rank: p.rank,
            host: self.roster.host(p.rank).to_string(),
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
            ToolRequest::Submit { .. } | ToolRequest::Jobs | ToolRequest::Kill { .. } => {
                self.emit(Output::JobTool { link, req })
            }
            ToolRequest::Unknown => self.reply(
                link,
                ToolReply::Error {
                    message: format!(
                        "this daemon does not know that request (it speaks protocol versions {}..={})",
                        dvmlab_proto::wire::MIN_VERSION,
                        dvmlab_proto::wire::VERSION
                    ),
                },
            ),
        }
    }

    fn start_ping(&mut self, now: Duration, tool: LinkId, rank: Rank) {
        let size = self.roster.len();
        let fail = |msg: String| PingReport {
            rank,
            host: self.roster.host(rank).to_string(),
            ok: false,
            rtt_us: None,
            path: vec![],
            error: Some(msg),
        };
        if !self.roster.contains(rank) {
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
        if self.pings.len() >= dvmlab_proto::limits::MAX_PENDING_PINGS {
            let r = fail(format!(
                "{} pings are already in flight, the most this daemon tracks",
                self.pings.len()
            ));
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
            ROUTE_TTL,
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
        let mut pending = BTreeSet::new();
        for c in self.children.values() {
            pending.insert(c.rank);
            pending.extend(c.members.iter().copied());
        }
        self.stopping = Some(Stopping {
            tool,
            pending,
            confirmed: BTreeSet::new(),
        });
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
        if self
            .stopping
            .as_ref()
            .is_some_and(|st| st.pending.is_empty())
        {
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
        if let Some((up, _)) = self.up {
            let mut ranks: Vec<Rank> = st.confirmed.into_iter().collect();
            ranks.push(self.me);
            self.send(up, DaemonMsg::Stopped { ranks });
        }
        if let Some(t) = st.tool {
            self.reply(t, ToolReply::Stopped { unconfirmed });
        }
        self.io(Io::Exit);
    }

    /// Forgets child link `link` and the routes through it.
    fn drop_child(&mut self, link: LinkId) {
        self.last_heard.remove(&link);
        let Some(child) = self.children.remove(&link) else {
            return;
        };
        if child.members.is_empty() && self.stopping.is_none() {
            self.note(Note::ProcState {
                rank: child.rank,
                state: "LOST",
            });
        }
        if self.is_controller() && self.roster.state(child.rank) == Some(State::Joining) {
            self.roster.set(child.rank, State::Waiting);
        }
        let gone: Vec<Rank> = child
            .members
            .into_iter()
            .filter(|r| self.routes.get(r).is_some_and(|(l, _)| *l == link))
            .collect();
        self.forget(link, gone);
    }

    /// Forgets the upward link and starts reconnecting (unless stopping).
    fn drop_uplink(&mut self, now: Duration) {
        let Some((link, rank)) = self.up.take() else {
            return;
        };
        self.last_heard.remove(&link);
        if self.stopping.is_some() {
            return;
        }
        self.note(Note::UplinkLost { rank });
        if let Some(u) = self.uplink.as_mut() {
            let a = u.lost(now);
            self.io(Io::Connect {
                rank: a.rank,
                delay: a.delay,
            });
        }
    }

    fn on_closed(&mut self, now: Duration, link: LinkId) {
        if self.tools.remove(&link) {
            self.pings.retain(|_, p| p.tool != link);
            return;
        }
        if self.children.contains_key(&link) {
            self.drop_child(link);
            if self.stopping.is_some() {
                self.maybe_finish_stop();
            }
            return;
        }
        if self.up.is_some_and(|(l, _)| l == link) {
            self.drop_uplink(now);
        }
    }

    fn on_timer(&mut self, now: Duration, t: Timer) {
        match t {
            Timer::Heartbeat => self.heartbeat(now),
            Timer::StopGrace => {
                if let Some(st) = &self.stopping {
                    let left = st.pending.iter().copied().collect();
                    self.finish_stop(left);
                }
            }
            Timer::Ping(id) => {
                if let Some(p) = self.pings.remove(&id) {
                    let r = PingReport {
                        rank: p.rank,
                        host: self.roster.host(p.rank).to_string(),
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

    /// Sends a heartbeat on every daemon link and drops links that went silent: a frozen,
    /// powered-off or cut-off peer sends no FIN, so silence is the only sign.
    fn heartbeat(&mut self, now: Duration) {
        let limit = self.cfg.heartbeat * MISSED_HEARTBEATS;
        let silent =
            |heard: Option<&Duration>| heard.is_none_or(|t| now.saturating_sub(*t) > limit);
        if let Some((up, rank)) = self.up {
            if silent(self.last_heard.get(&up)) {
                self.note(Note::LinkDead { rank });
                self.io(Io::Close { link: up });
                self.drop_uplink(now);
            } else {
                self.send(up, DaemonMsg::Heartbeat);
            }
        }
        let links: Vec<(LinkId, Rank)> = self.children.iter().map(|(l, c)| (*l, c.rank)).collect();
        for (link, rank) in links {
            if silent(self.last_heard.get(&link)) {
                self.note(Note::LinkDead { rank });
                self.io(Io::Close { link });
                self.drop_child(link);
                if self.stopping.is_some() {
                    self.maybe_finish_stop();
                }
            } else {
                self.send(link, DaemonMsg::Heartbeat);
            }
        }
        self.emit(Output::SetTimer {
            timer: Timer::Heartbeat,
            delay: self.cfg.heartbeat,
        });
    }

    /// The controller's view of the DVM, for `pctl status`.
    pub fn status(&self) -> StatusReport {
        let members = self
            .roster
            .iter()
            .map(|(r, m)| MemberStatus {
                rank: r,
                host: m.host.clone(),
                parent: self.below.get(&r).map(|m| m.parent),
                tree_parent: self.cfg.tree.parent(r),
                state: match m.state {
                    State::Wired => MemberState::Joined,
                    State::Waiting => MemberState::Waiting,
                    State::Joining => MemberState::Joining,
                    State::Lost => MemberState::Lost,
                    State::Departing => MemberState::Departing,
                    State::Departed => MemberState::Departed,
                },
            })
            .collect();
        StatusReport {
            namespace: self.cfg.identity.nspace.clone(),
            formed: self.formed,
            expected: self.roster.expected(),
            joined: self.roster.count(State::Wired),
            radix: self.cfg.tree.radix(),
            controller_host: self.roster.host(0).to_string(),
            controller_uri: self.cfg.controller_uri.clone(),
            controller_listed: self.roster.controller_listed(),
            formed_at_unix_ms: None,
            members,
            job_messages: None,
        }
    }

    /// The routing state's invariants, checked in debug builds after every input.
    fn check(&self) {
        for (rank, (link, _)) in &self.routes {
            debug_assert!(
                self.children
                    .get(link)
                    .is_some_and(|c| c.members.contains(rank)),
                "rank {}: route to {rank} through link {link}, which does not list it",
                self.me
            );
            debug_assert!(
                self.children
                    .get(link)
                    .is_some_and(|c| self.cfg.tree.is_ancestor_or_self(c.rank, *rank)),
                "rank {}: route to {rank} through a link outside its subtree",
                self.me
            );
        }
        if self.is_controller() {
            debug_assert_eq!(
                self.routes.len() as u32 + 1,
                self.roster.count(State::Wired),
                "every wired rank but the controller has a route"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_secs(1);

    fn controller(size: u32) -> Node {
        let hosts: Vec<String> = (0..size).map(|r| format!("h{r}")).collect();
        Node::new(NodeConfig {
            roster: Roster::from_conf(&hosts, false, 0),
            identity: Identity {
                nspace: "t-prte-dvm".into(),
                rank: 0,
                role: Role::Controller,
                host: "h0".into(),
            },
            tree: RadixTree::new(2, size),
            policy: Policy {
                initial: Duration::from_millis(20),
                max: Duration::from_secs(5),
                heal_after: Some(Duration::from_secs(1)),
            },
            heartbeat: HB,
            incarnation: 0,
            controller_uri: "t".into(),
        })
    }

    fn member(rank: Rank, parent: Rank, epoch: u64) -> Member {
        Member {
            rank,
            host: format!("h{rank}"),
            parent,
            epoch,
            via: 0,
        }
    }

    fn hello(n: &mut Node, now: Duration, link: LinkId, rank: Rank) -> Vec<Output> {
        let peer = Peer::Daemon {
            rank,
            host: format!("h{rank}"),
        };
        n.handle(
            now,
            Input::Hello {
                link,
                peer,
                version: dvmlab_proto::wire::VERSION,
            },
        )
    }

    fn report(n: &mut Node, now: Duration, link: LinkId, members: Vec<Member>) -> Vec<Output> {
        let msg = DaemonMsg::Report { members };
        n.handle(now, Input::Frame { link, msg })
    }

    fn parent_of(n: &Node, rank: Rank) -> Option<Rank> {
        n.status().members[rank as usize].parent
    }

    const T: Duration = Duration::ZERO;

    #[test]
    fn a_report_from_an_older_path_does_not_overwrite_a_newer_route() {
        let mut c = controller(4);
        hello(&mut c, T, 10, 1);
        hello(&mut c, T, 20, 2);
        report(&mut c, T, 10, vec![member(1, 0, 5)]);
        report(&mut c, T, 20, vec![member(2, 0, 5)]);
        // rank 3 healed from its parent 1 to the controller (epoch 8); its old report via 1
        // (epoch 7) arrives late
        hello(&mut c, T, 30, 3);
        report(&mut c, T, 30, vec![member(3, 0, 8)]);
        report(&mut c, T, 10, vec![member(3, 1, 7)]);
        assert_eq!(parent_of(&c, 3), Some(0));
        // and the old path's loss of rank 3 withdraws nothing
        let lost = DaemonMsg::Lost {
            ranks: vec![RankEpoch {
                rank: 3,
                epoch: 7,
                via: 0,
            }],
        };
        c.handle(
            T,
            Input::Frame {
                link: 10,
                msg: lost,
            },
        );
        assert!(c.formed(), "{:?}", c.status());
    }

    #[test]
    fn a_message_of_a_kind_it_does_not_know_is_answered_and_the_link_stays() {
        let mut c = controller(2);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        let out = c.handle(
            T,
            Input::Frame {
                link: 10,
                msg: DaemonMsg::Unknown,
            },
        );
        assert!(
            matches!(
                &out[..],
                [Output::Io(Io::Send {
                    link: 10,
                    frame: Frame::Daemon(DaemonMsg::Unsupported { .. })
                })]
            ),
            "{out:?}"
        );
        assert!(c.formed(), "the link stays");
    }

    #[test]
    fn a_daemon_speaks_only_for_its_own_subtree() {
        let mut c = controller(4);
        hello(&mut c, T, 10, 1);
        hello(&mut c, T, 20, 2);
        // Rank 3 is rank 1's child by the formula: rank 2 cannot vouch for it, nor for 1.
        let out = report(
            &mut c,
            T,
            20,
            vec![member(2, 0, 5), member(3, 2, 8), member(1, 2, 9)],
        );
        assert!(
            out.iter().any(|o| matches!(o, Output::Io(Io::Note(Note::Refused { reason, .. })) if reason.contains("[3, 1]"))),
            "{out:?}"
        );
        let s = c.status();
        assert_eq!(s.members[2].state, MemberState::Joined);
        assert_eq!(s.members[3].state, MemberState::Waiting);
        assert_eq!(s.members[1].state, MemberState::Joining);
        assert!(!c.formed());
    }

    #[test]
    fn a_reconnecting_child_replaces_its_half_open_link() {
        let mut c = controller(2);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        let out = hello(&mut c, T, 11, 1);
        assert!(out.contains(&Output::Io(Io::Close { link: 10 })), "{out:?}");
        report(&mut c, T, 11, vec![member(1, 0, 2)]);
        assert!(c.formed());
        // the old link's late close changes nothing
        c.handle(T, Input::Closed { link: 10 });
        assert!(c.formed());
    }

    #[test]
    fn a_silent_link_is_dropped_after_missed_heartbeats() {
        let mut c = controller(2);
        c.handle(T, Input::Start);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        let out = c.handle(HB * 2, Input::Timer(Timer::Heartbeat));
        assert!(out
            .iter()
            .any(|o| matches!(o, Output::Io(Io::Send { link: 10, .. }))));
        assert!(c.formed(), "two quiet intervals are tolerated");
        let out = c.handle(HB * 4, Input::Timer(Timer::Heartbeat));
        assert!(out.contains(&Output::Io(Io::Close { link: 10 })), "{out:?}");
        assert!(!c.formed());
        assert_eq!(c.status().members[1].state, MemberState::Lost);
    }

    /// A controller of `size` ranks with rank 1 joined on link 10, told by a tool (link 99)
    /// to stop.
    fn stopping_controller(size: u32) -> Node {
        let mut c = controller(size);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        c.handle(
            T,
            Input::Hello {
                link: 99,
                peer: Peer::Tool,
                version: dvmlab_proto::wire::VERSION,
            },
        );
        c.handle(
            T,
            Input::Tool {
                link: 99,
                req: ToolRequest::Stop,
            },
        );
        c
    }

    #[test]
    fn a_daemon_that_reaches_a_stopping_parent_is_told_to_stop() {
        let mut c = stopping_controller(3);
        let out = hello(&mut c, T, 20, 2);
        assert!(out.contains(&Output::Io(Io::Send {
            link: 20,
            frame: Frame::Daemon(DaemonMsg::Shutdown)
        })));
        // rank 1 confirms and goes; rank 2 never confirms: it is named
        let stopped = DaemonMsg::Stopped { ranks: vec![1] };
        c.handle(
            T,
            Input::Frame {
                link: 10,
                msg: stopped,
            },
        );
        c.handle(T, Input::Closed { link: 10 });
        let out = c.handle(T, Input::Timer(Timer::StopGrace));
        assert!(
            out.iter().any(|o| matches!(o,
            Output::Io(Io::Send { frame: Frame::ToolReply(ToolReply::Stopped { unconfirmed }), .. })
            if unconfirmed == &vec![2])),
            "{out:?}"
        );
        assert!(out.contains(&Output::Io(Io::Exit)));
    }

    #[test]
    fn a_child_whose_link_drops_during_a_stop_is_awaited_and_stopped_when_it_returns() {
        let mut c = stopping_controller(2);
        // The shutdown is lost with the link (a partition, say): not a confirmation.
        let out = c.handle(T, Input::Closed { link: 10 });
        assert!(!out.contains(&Output::Io(Io::Exit)), "{out:?}");
        let out = hello(&mut c, T, 11, 1);
        assert!(out.contains(&Output::Io(Io::Send {
            link: 11,
            frame: Frame::Daemon(DaemonMsg::Shutdown)
        })));
        let stopped = DaemonMsg::Stopped { ranks: vec![1] };
        let out = c.handle(
            T,
            Input::Frame {
                link: 11,
                msg: stopped,
            },
        );
        assert!(out.contains(&Output::Io(Io::Exit)), "{out:?}");
        assert!(out.iter().any(|o| matches!(o,
            Output::Io(Io::Send { frame: Frame::ToolReply(ToolReply::Stopped { unconfirmed }), .. })
            if unconfirmed.is_empty())));
    }

    #[test]
    fn routed_messages_die_when_their_ttl_runs_out() {
        let mut c = controller(2);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        let msg = DaemonMsg::Routed {
            src: 1,
            dst: 1,
            ttl: 0,
            body: Body::Ping {
                id: 1,
                path: vec![],
            },
        };
        let out = c.handle(T, Input::Frame { link: 10, msg });
        assert_eq!(out, vec![Output::Io(Io::Note(Note::Unroutable { dst: 1 }))]);
    }
}
