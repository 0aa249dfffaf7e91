//! The overlay service: one DVM member's part of the tree — its upward link and the daemons
//! that joined below it (`links`), the routes to every rank beneath it and (on the
//! controller) formation (`routes`), heartbeats (`liveness`), pings for tools (`ping`),
//! tools on any node and their requests relayed to the controller (`tools`), and the
//! orderly stop (`stop`). [`Node`] owns the state; each service is an `impl Node`
//! of its own module.
//!
//! Sans-IO: [`crate::daemon_core::DaemonCore`] feeds [`Input`]s with the current monotonic
//! time and carries out the [`Output`]s. No sockets, clocks or threads in here.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use crate::identity::{Identity, Role};
use crate::roster::{Roster, State};
use crate::tree::{RadixTree, Rank};
use crate::uplink::{Policy, Uplink};
use dvmlab_proto::contract::{MemberState, MemberStatus, PingReport, StatusReport};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::wire::{Body, DaemonMsg, Frame, Member, Peer, RankEpoch, ToolReply, ToolRequest};

mod elastic;
mod links;
mod liveness;
mod ping;
mod routes;
mod stop;
mod tools;

use tools::Relayed;
pub use tools::RELAYED;

/// A connection, numbered by the shell.
pub type LinkId = u64;

/// How long a stopping daemon waits for its children to confirm before exiting anyway.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the controller waits for the whole DVM to confirm a stop. Longer than a
/// daemon's grace: a daemon that gave up on part of its subtree still confirms the rest
/// just as its own grace ends, and the controller must still be listening then.
pub const CONTROLLER_STOP_GRACE: Duration = Duration::from_secs(12);
/// How long the controller waits for a pong.
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Hops a routed message may take; far more than any tree's round trip needs.
pub const ROUTE_TTL: u8 = 255;
/// A link on which nothing arrived for this many heartbeat intervals is declared dead.
pub const MISSED_HEARTBEATS: u32 = 3;
/// Tools of other nodes the controller serves at once (see `tools.rs`).
pub const MAX_RELAYED_TOOLS: usize = dvmlab_proto::limits::MAX_CONNECTIONS;

/// Ranks a daemon keeps from its children's reports before its own membership names them
/// (see `Node::held`): one per rank a DVM may have, each a descendant of the child that
/// reported it, so no more than its routes may hold.
pub const MAX_HELD_MEMBERS: usize = dvmlab_proto::limits::MAX_NODES;

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
    /// This daemon's own contact URI.
    pub uri: String,
    /// Whether the shell authenticates and encrypts every connection with the DVM key (it
    /// shows in the status; the core itself never sees a byte of the channel).
    pub authenticated: bool,
    /// Broken on purpose (the test-only `launch-on-departing` defect): a departing daemon
    /// stays its whole grace even with no child to wait for.
    pub depart_lingers: bool,
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Start,
    /// The connection to ancestor `rank` is up and welcomed us in protocol `version`.
    UplinkUp {
        link: LinkId,
        rank: Rank,
        version: u32,
    },
    /// A connection attempt to `rank` failed.
    UplinkFailed {
        rank: Rank,
        reason: String,
    },
    /// A peer connected to us and said hello; `version` is the newest protocol version both
    /// speak (the shell checked there is one). `stopping`: the hello said so (a stopping
    /// controller's poke).
    Hello {
        link: LinkId,
        peer: Peer,
        version: u32,
        stopping: bool,
    },
    Frame {
        link: LinkId,
        msg: DaemonMsg,
    },
    Tool {
        link: LinkId,
        req: ToolRequest,
    },
    /// A job process or tool connected here says something about events.
    Event {
        link: LinkId,
        up: dvmlab_proto::event::EventUp,
    },
    Closed {
        link: LinkId,
    },
    Timer(Timer),
    /// Another core's reply to a tool (the job manager's, the daemon core's status): it goes
    /// out on the tool's link, or down the tree to the daemon a relayed tool is on.
    Reply {
        link: LinkId,
        reply: ToolReply,
    },
    /// The controller: the membership changed (ranks added or departed); send it down.
    Membership,
    /// The controller: the campaign core changed member states (a rank departing or
    /// departed) in a way that formed or unformed the DVM, with no report or loss to say so.
    RosterChanged,
    /// The controller: tell `rank` to leave the DVM.
    Depart(Rank),
    /// The controller: `rank` departed without leaving by itself; close its link.
    CutOff(Rank),
}

/// Timers the core asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    Heartbeat,
    StopGrace,
    /// A stopped daemon has waited long enough for its confirmation to be acknowledged.
    StopAck,
    /// A departing daemon waited long enough for its children to move.
    DepartGrace,
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
    /// Tell the daemon of `rank` on `host` (a child by the tree formula) that this daemon is
    /// up: connect to it and say hello (it declines, and hurries its own connect up).
    /// Nothing comes back to the core. With `stop` (only from a stopping controller, to a
    /// member the stop cannot reach through the tree) the hello says the DVM is stopping,
    /// and the poke is made before the daemon exits.
    Poke {
        rank: Rank,
        host: String,
        stop: bool,
    },
    /// A connect waiting out its back-off delay is made now (none waiting: nothing).
    Hurry,
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
    /// A tool asked for the status (the daemon core answers, with what only it knows).
    StatusFor {
        link: LinkId,
    },
    /// The controller: a tool has gone (its jobs' output has nowhere to go).
    ToolGone {
        link: LinkId,
    },
    /// A job process (`proc`) or tool connected here (events may come from it).
    EventClient {
        link: LinkId,
        proc: Option<dvmlab_proto::event::Proc>,
    },
    /// A job process or tool connected here said this about events.
    EventFromClient {
        link: LinkId,
        up: dvmlab_proto::event::EventUp,
    },
    /// The job process or tool on `link` has gone.
    EventClientGone {
        link: LinkId,
    },
    /// The controller: these ranks reported in, all in one report (wired now, or already:
    /// a daemon that reconnects reports its whole subtree; a departing rank stays
    /// departing); `unsettled` are those reached through a daemon that is leaving.
    Wired {
        ranks: IdSet,
        unsettled: IdSet,
    },
    /// An event came up from a child (towards the controller).
    EventFromBelow(dvmlab_proto::event::Travelling),
    /// An event came down from the parent (for this daemon's clients and those below).
    EventFromAbove(dvmlab_proto::event::Travelling),
    /// The child on `link` said whether a tool below it registered for events.
    EventInterest {
        link: LinkId,
        on: bool,
        seq: u64,
    },
    /// The parent counted this daemon's interest `seq` up to the controller.
    EventInterestSeen {
        seq: u64,
    },
    /// The parent's path to the controller changed: say this daemon's interest again.
    EventInterestAgain,
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
    /// A stopped daemon exits without the acknowledgment of its confirmation of `ranks`.
    StopUnacknowledged {
        ranks: Vec<Rank>,
    },
    /// Ancestor `rank` said it is up; this daemon's connect up, if waiting, goes now.
    Poked {
        rank: Rank,
    },
    /// The controller said the DVM stops, directly: its stop could not reach this daemon
    /// through the tree.
    ToldToStop,
}

#[derive(Debug, Clone)]
struct Child {
    rank: Rank,
    /// The protocol version spoken on the link.
    version: u32,
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
    /// Told to stop by the controller directly (see `stop.rs`): no daemon above awaits
    /// this one's confirmation, so it exits without waiting for an acknowledgment.
    unawaited: bool,
    /// On the controller: the members it told directly as the stop began. One of them
    /// that reaches it afterwards is told again but not awaited: it may have exited on the
    /// poke before its connection was through.
    told: BTreeSet<Rank>,
}

/// One member's protocol state. See the module documentation.
#[derive(Debug)]
pub struct Node {
    cfg: NodeConfig,
    me: Rank,
    uplink: Option<Uplink>,
    up: Option<(LinkId, Rank)>,
    /// The protocol version spoken on `up`.
    up_version: u32,
    /// What the job-exec module was last told of the topology.
    exec_children: Vec<(LinkId, Rank, IdSet)>,
    exec_up: Option<LinkId>,
    /// Incremented on every upward connection; sent with this daemon's reports.
    epoch: u64,
    children: BTreeMap<LinkId, Child>,
    /// Tools that said hello to this daemon, and on the controller the relayed ones.
    tools: BTreeSet<LinkId>,
    /// Job processes connected here for events: local to this daemon, so the path to the
    /// controller breaking does not concern them.
    processes: BTreeSet<LinkId>,
    /// Members children reported that this daemon's membership does not name yet, with the
    /// link each came by: a daemon that (re)started takes children before its parent told
    /// it of the ranks grows added, and dropping them would leave those ranks lost for good
    /// (their own links stay up, so nothing reports them again). Taken once a membership
    /// names them, or until their link drops or reports them lost.
    held: BTreeMap<Rank, (LinkId, Member)>,
    /// The controller: relayed tools by the link id it gave them, and the other way round.
    relayed: HashMap<LinkId, Relayed>,
    relayed_ids: BTreeMap<Relayed, LinkId>,
    next_relayed: u64,
    /// The controller: relayed tools forgotten when the route to their daemon went, to be
    /// closed there once it is back (at most `MAX_RELAYED_TOOLS`, the oldest go first).
    dropped: VecDeque<Relayed>,
    /// A daemon other than the controller: local tools that asked the DVM to stop.
    stop_tools: BTreeSet<LinkId>,
    /// Rank → the child link it is reachable through, and how fresh that route is:
    /// `(via, epoch)` of the report it came from (see `Member::via`).
    routes: HashMap<Rank, (LinkId, (u64, u64))>,
    /// What each rank below reported about itself.
    below: HashMap<Rank, Member>,
    /// Per daemon link (up or down): how many of this daemon's own heartbeats passed since it
    /// last delivered anything. Counted in beats this daemon ran, not in time: a starved
    /// daemon's overdue timer may run before frames that came in time (see `liveness`).
    quiet: HashMap<LinkId, u32>,
    /// The membership; on the controller, with every member's state.
    roster: Roster,
    formed: bool,
    pings: HashMap<u64, PendingPing>,
    next_ping: u64,
    stopping: Option<Stopping>,
    /// Stopped, with these ranks confirmed, and waiting for the confirmation to be
    /// acknowledged (see `stop.rs`).
    confirming: Option<Vec<Rank>>,
    /// Told to leave the DVM: waiting for its children to move to its parent.
    departing: bool,
    out: Vec<Output>,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Node {
        let me = cfg.identity.rank;
        let uplink = (cfg.identity.role == Role::Daemon).then(|| {
            let mut u = Uplink::new(me, cfg.tree, cfg.policy);
            // A daemon launched into a DVM that shrank connects past the ranks that left.
            for (r, m) in cfg.roster.iter() {
                if m.state == State::Departed {
                    u.avoid(r);
                }
            }
            u
        });
        Node {
            me,
            uplink,
            up: None,
            up_version: dvmlab_proto::wire::VERSION,
            epoch: cfg.incarnation,
            children: BTreeMap::new(),
            tools: BTreeSet::new(),
            processes: BTreeSet::new(),
            held: BTreeMap::new(),
            relayed: HashMap::new(),
            relayed_ids: BTreeMap::new(),
            next_relayed: 1,
            dropped: VecDeque::new(),
            stop_tools: BTreeSet::new(),
            routes: HashMap::new(),
            below: HashMap::new(),
            quiet: HashMap::new(),
            exec_children: Vec::new(),
            exec_up: None,
            roster: {
                let mut r = cfg.roster.clone();
                r.set_uri(me, &cfg.uri);
                r
            },
            formed: false,
            pings: HashMap::new(),
            next_ping: 1,
            stopping: None,
            confirming: None,
            departing: false,
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

    /// The controller's membership, for the campaign core to change (the overlay is told
    /// with [`Input::Membership`]).
    pub fn roster_mut(&mut self) -> &mut Roster {
        &mut self.roster
    }

    /// The PMIx name of the tool on `link` (`tool@RANK.LINK`, RANK the daemon it is
    /// connected to and LINK that daemon's number for it), as the event hubs name it.
    pub fn tool_proc(&self, link: LinkId) -> dvmlab_proto::event::Proc {
        let (rank, local) = self.relayed_origin(link).unwrap_or((self.me, link));
        dvmlab_proto::event::Proc {
            nspace: format!("tool@{rank}.{local}"),
            rank: 0,
        }
    }

    /// Feeds one input at monotonic time `now`; returns what to do.
    pub fn handle(&mut self, now: Duration, input: Input) -> Vec<Output> {
        match input {
            Input::Start => self.on_start(now),
            Input::UplinkUp {
                link,
                rank,
                version,
            } => self.on_uplink_up(now, link, rank, version),
            Input::UplinkFailed { rank, reason } => self.on_uplink_failed(now, rank, reason),
            Input::Hello {
                link,
                peer,
                version,
                stopping,
            } => self.on_hello(link, peer, version, stopping),
            Input::Frame { link, msg } => self.on_frame(now, link, msg),
            Input::Tool { link, req } => self.on_tool(now, link, req),
            Input::Event { link, up } => {
                if self.tools.contains(&link) || self.processes.contains(&link) {
                    self.emit(Output::EventFromClient { link, up });
                }
            }
            Input::Closed { link } => self.on_closed(now, link),
            Input::Timer(t) => self.on_timer(now, t),
            Input::Reply { link, reply } => self.reply(link, reply),
            Input::Membership => self.send_membership(),
            Input::RosterChanged => self.check_formed(),
            Input::Depart(rank) => self.tell_depart(rank),
            Input::CutOff(rank) => self.cut_off(rank),
        }
        self.exec_topology();
        self.check();
        std::mem::take(&mut self.out)
    }

    /// The links to this daemon's children.
    pub fn child_links(&self) -> Vec<LinkId> {
        self.children.keys().copied().collect()
    }

    /// The link to this daemon's parent, if it is connected.
    pub fn uplink(&self) -> Option<LinkId> {
        self.up.map(|(l, _)| l)
    }

    /// The protocol version spoken on `link`, if it is the link to the parent or to a child.
    pub fn link_version(&self, link: LinkId) -> Option<u32> {
        if self.up.is_some_and(|(l, _)| l == link) {
            return Some(self.up_version);
        }
        self.children.get(&link).map(|c| c.version)
    }

    /// Tells the job-exec module about new child links, subtrees or a new upward link.
    fn exec_topology(&mut self) {
        // Asked after every input (a controller's every frame): compared in place, and only
        // built when something changed.
        let same = self.children.len() == self.exec_children.len()
            && self
                .children
                .iter()
                .zip(&self.exec_children)
                .all(|((l, c), (el, er, ids))| {
                    let size = c.members.len() + usize::from(!c.members.contains(&c.rank));
                    l == el
                        && c.rank == *er
                        && ids.len() == size as u64
                        && ids.contains(c.rank)
                        && c.members.iter().all(|m| ids.contains(*m))
                });
        if !same {
            let children: Vec<(LinkId, Rank, IdSet)> = self
                .children
                .iter()
                .map(|(l, c)| {
                    let mut ids: IdSet = c.members.iter().copied().collect();
                    ids.insert(c.rank);
                    (*l, c.rank, ids)
                })
                .collect();
            self.exec_children = children.clone();
            self.emit(Output::Exec(crate::exec::Input::Children(children)));
        }
        let up = self.up.map(|(l, _)| l);
        if up != self.exec_up {
            self.exec_up = up;
            self.emit(Output::Exec(crate::exec::Input::Uplink {
                link: up,
                version: self.up_version,
            }));
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
        self.poke_children();
    }

    fn on_frame(&mut self, now: Duration, link: LinkId, msg: DaemonMsg) {
        let from_child = self.children.contains_key(&link);
        let from_parent = self.up.is_some_and(|(l, _)| l == link);
        if from_child || from_parent {
            self.quiet.insert(link, 0);
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
            } if from_child || from_parent => self.on_routed(now, link, src, dst, ttl, body),
            DaemonMsg::Shutdown if from_parent => self.begin_stop(None, false),
            DaemonMsg::ExecUp { req } if from_child => {
                self.emit(Output::Exec(crate::exec::Input::Up { link, req }))
            }
            DaemonMsg::ExecDown { msg } if from_parent => {
                self.emit(Output::Exec(crate::exec::Input::Down(msg)))
            }
            DaemonMsg::Wireup { wireup } if from_parent => self.on_wireup(link, wireup),
            DaemonMsg::Rehome if from_parent => self.on_rehome(now),
            DaemonMsg::PathLost if from_parent => {
                let up = self.up.map_or(0, |u| u.1);
                self.path_lost(&format!("the path above rank {up} broke"));
            }
            DaemonMsg::Event { ev } if from_child => self.emit(Output::EventFromBelow(ev)),
            DaemonMsg::Event { ev } if from_parent => self.emit(Output::EventFromAbove(ev)),
            DaemonMsg::Interest { on, seq } if from_child => {
                self.emit(Output::EventInterest { link, on, seq })
            }
            DaemonMsg::InterestSeen { seq } if from_parent => {
                self.emit(Output::EventInterestSeen { seq })
            }
            DaemonMsg::InterestAgain if from_parent => self.emit(Output::EventInterestAgain),
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
            DaemonMsg::Stopped { ranks } if from_child => self.on_stopped(link, ranks),
            DaemonMsg::StopAcked if from_parent => self.on_stop_acked(),
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

    fn on_tool(&mut self, now: Duration, link: LinkId, req: ToolRequest) {
        // A job process may ask for an allocation (it is then a requester, answered as a
        // tool is), and for nothing else a tool can.
        if self.processes.contains(&link) {
            if !matches!(req, ToolRequest::Alloc { .. }) {
                return self.note(Note::Refused {
                    link,
                    reason: "a job process asks the DVM only for allocations".into(),
                });
            }
            self.tools.insert(link);
        }
        if !self.tools.contains(&link) {
            return self.note(Note::Refused {
                link,
                reason: "tool request before hello".into(),
            });
        }
        if !self.is_controller() {
            return self.relay_up(link, req);
        }
        match req {
            ToolRequest::Status => self.emit(Output::StatusFor { link }),
            ToolRequest::Ping { rank } => self.start_ping(now, link, rank),
            ToolRequest::Stop => self.begin_stop(Some(link), false),
            ToolRequest::Submit { .. }
            | ToolRequest::Jobs
            | ToolRequest::Kill { .. }
            | ToolRequest::Stdin { .. }
            | ToolRequest::Alloc { .. }
            | ToolRequest::Grow { .. }
            | ToolRequest::Shrink { .. } => self.emit(Output::JobTool { link, req }),
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

    fn on_closed(&mut self, now: Duration, link: LinkId) {
        // A job process that made a request is also served as a tool: both go.
        let tool = self.tools.contains(&link);
        if tool {
            self.forget_tool(link);
        }
        if self.processes.remove(&link) {
            return self.emit(Output::EventClientGone { link });
        }
        if tool {
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
            Timer::DepartGrace => self.finish_depart(),
            Timer::StopGrace => {
                if let Some(st) = &self.stopping {
                    let left = st.pending.iter().copied().collect();
                    self.finish_stop(left);
                }
            }
            Timer::StopAck => self.stop_unacknowledged(),
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
                uri: m.uri.clone(),
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
            authenticated: self.cfg.authenticated,
            elastic: false,
            campaigns: Vec::new(),
        }
    }

    /// The routing state's invariants, checked in debug builds after every input.
    fn check(&self) {
        for (rank, (link, _)) in &self.held {
            debug_assert!(
                !self.roster.contains(*rank) && self.children.contains_key(link),
                "rank {}: {rank} held though the membership names it, or its link {link} is gone",
                self.me
            );
        }
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
            // A departing rank keeps its route until it goes, and may have lost it before
            // the campaign core marks it departed.
            debug_assert!(
                self.roster.iter().all(|(r, m)| r == 0
                    || m.state != State::Wired
                    || self.routes.contains_key(&r)),
                "every wired rank but the controller has a route: routes to {:?}, roster {:?}",
                self.routes.keys().collect::<BTreeSet<_>>(),
                self.roster
                    .iter()
                    .map(|(r, m)| (r, m.state))
                    .collect::<Vec<_>>()
            );
            // A departed rank keeps its route until it is gone (it was told to leave).
            debug_assert!(
                self.routes.keys().all(|r| matches!(
                    self.roster.state(*r),
                    Some(State::Wired | State::Departing | State::Departed)
                )),
                "a route to a rank neither wired nor departing nor departed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_secs(1);

    fn controller(size: u32) -> Node {
        node(size, 0)
    }

    fn node(size: u32, rank: Rank) -> Node {
        let hosts: Vec<String> = (0..size).map(|r| format!("h{r}")).collect();
        Node::new(NodeConfig {
            roster: Roster::from_conf(&hosts, false, rank),
            identity: Identity {
                nspace: "t-prte-dvm".into(),
                rank,
                role: if rank == 0 {
                    Role::Controller
                } else {
                    Role::Daemon
                },
                host: format!("h{rank}"),
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
            uri: format!("t.{rank}"),
            authenticated: false,
            depart_lingers: false,
        })
    }

    fn tool_hello(n: &mut Node, link: LinkId) {
        let peer = Peer::Tool;
        let version = dvmlab_proto::wire::VERSION;
        n.handle(
            T,
            Input::Hello {
                link,
                peer,
                version,
                stopping: false,
            },
        );
    }

    fn routed(src: Rank, dst: Rank, body: Body) -> DaemonMsg {
        DaemonMsg::Routed {
            src,
            dst,
            ttl: ROUTE_TTL,
            body,
        }
    }

    /// The tool replies and closes in `out`.
    fn tool_io(out: &[Output]) -> Vec<&Io> {
        out.iter()
            .filter_map(|o| match o {
                Output::Io(io @ Io::Send { .. }) | Output::Io(io @ Io::Close { .. }) => Some(io),
                _ => None,
            })
            .collect()
    }

    /// The ranks `out` reports upward on `up`.
    fn reported_up(out: &[Output], up: LinkId) -> Vec<Rank> {
        out.iter()
            .filter_map(|o| match o {
                Output::Io(Io::Send {
                    link,
                    frame: Frame::Daemon(DaemonMsg::Report { members }),
                }) if *link == up => Some(members.iter().map(|m| m.rank)),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn a_restarted_daemon_reports_a_grown_rank_below_it_once_its_parent_named_it() {
        // Rank 1 (re)started and knows only prte.conf's four ranks; its child 3 reports
        // itself and rank 7, which a grow added, before rank 1's parent sent the membership.
        let (mut d, wireup) = restarted_with_a_report(vec![member(3, 1, 8), member(7, 3, 12)]);
        let out = d.handle(
            T,
            Input::Frame {
                link: 1,
                msg: wireup,
            },
        );
        assert_eq!(reported_up(&out, 1), [7], "{out:?}");
    }

    #[test]
    fn a_restarted_daemon_pokes_the_children_a_membership_from_its_parent_names() {
        // Of ranks 4-7, grown while rank 1 was down, rank 5 is rank 1's child by the tree
        // formula: it waits out its back-off unless poked, as rank 1's start poked the child
        // prte.conf names (rank 3).
        let (mut d, wireup) = restarted_with_a_report(vec![member(3, 1, 8)]);
        let out = d.handle(
            T,
            Input::Frame {
                link: 1,
                msg: wireup.clone(),
            },
        );
        assert_eq!(poked(&out), [5], "{out:?}");
        // A membership it already had pokes nobody again.
        let out = d.handle(
            T,
            Input::Frame {
                link: 1,
                msg: wireup,
            },
        );
        assert!(
            !out.iter().any(|o| matches!(o, Output::Io(Io::Poke { .. }))),
            "{out:?}"
        );
    }

    /// Rank 1, restarted and not yet told of the grow that added ranks 4-7, with child 3
    /// on link 10 that reported `members`; and the wireup that names ranks 4-7.
    fn restarted_with_a_report(members: Vec<Member>) -> (Node, DaemonMsg) {
        let version = dvmlab_proto::wire::VERSION;
        let mut d = joined(4, 1, version);
        let peer = Peer::Daemon {
            rank: 3,
            host: "h3".into(),
        };
        d.handle(
            T,
            Input::Hello {
                link: 10,
                peer,
                version,
                stopping: false,
            },
        );
        let out = d.handle(
            T,
            Input::Frame {
                link: 10,
                msg: DaemonMsg::Report { members },
            },
        );
        assert!(
            reported_up(&out, 1).iter().all(|r| d.roster.contains(*r)),
            "a rank the membership does not name went up: {out:?}"
        );
        let wireup = crate::roster::Wireup {
            epoch: 1,
            added: (4..8).map(|r| (r, format!("h{r}"))).collect(),
            departed: IdSet::new(),
        };
        (d, DaemonMsg::Wireup { wireup })
    }

    #[test]
    fn a_grown_rank_reported_lost_before_the_membership_named_it_is_not_reported_up() {
        let (mut d, wireup) = restarted_with_a_report(vec![member(3, 1, 8), member(7, 3, 12)]);
        let lost = DaemonMsg::Lost {
            ranks: vec![RankEpoch {
                rank: 7,
                epoch: 12,
                via: 0,
            }],
        };
        d.handle(
            T,
            Input::Frame {
                link: 10,
                msg: lost,
            },
        );
        let out = d.handle(
            T,
            Input::Frame {
                link: 1,
                msg: wireup,
            },
        );
        assert!(reported_up(&out, 1).is_empty(), "{out:?}");
    }

    #[test]
    fn a_held_rank_is_replaced_only_by_a_fresher_report_of_it() {
        let (mut d, wireup) = restarted_with_a_report(vec![member(3, 1, 8), member(7, 3, 12)]);
        // The same child reports 7 again as of an older path: the fresher report is the one
        // that goes up.
        let stale = DaemonMsg::Report {
            members: vec![member(7, 3, 9)],
        };
        d.handle(
            T,
            Input::Frame {
                link: 10,
                msg: stale,
            },
        );
        let out = d.handle(
            T,
            Input::Frame {
                link: 1,
                msg: wireup,
            },
        );
        let epochs: Vec<u64> = out
            .iter()
            .filter_map(|o| match o {
                Output::Io(Io::Send {
                    link: 1,
                    frame: Frame::Daemon(DaemonMsg::Report { members }),
                }) => Some(members.iter().filter(|m| m.rank == 7).map(|m| m.epoch)),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(epochs, [12], "{out:?}");
    }

    #[test]
    fn a_tool_on_a_daemon_that_has_not_joined_is_closed_with_the_reason() {
        let mut d = node(4, 1);
        d.handle(T, Input::Start);
        tool_hello(&mut d, 100);
        let req = ToolRequest::Status;
        let out = d.handle(T, Input::Tool { link: 100, req });
        let io = tool_io(&out);
        assert!(
            matches!(io.as_slice(), [Io::Send { link: 100, frame: Frame::ToolReply(ToolReply::Error { message }) }, Io::Close { link: 100 }] if message.contains("has not joined")),
            "{out:?}"
        );
    }

    #[test]
    fn a_broken_path_up_closes_tools_but_not_the_job_processes_events_and_forgets_both_rightly() {
        let mut d = joined(4, 1, dvmlab_proto::wire::VERSION);
        tool_hello(&mut d, 100);
        let peer = Peer::Process {
            nspace: "dvm@1".into(),
            rank: 0,
        };
        let version = dvmlab_proto::wire::VERSION;
        d.handle(
            T,
            Input::Hello {
                link: 200,
                peer,
                version,
                stopping: false,
            },
        );
        let out = d.handle(T, Input::Closed { link: 1 });
        let gone: Vec<LinkId> = out
            .iter()
            .filter_map(|o| match o {
                Output::EventClientGone { link } => Some(*link),
                _ => None,
            })
            .collect();
        assert_eq!(
            gone,
            [100],
            "the tool is closed and its events forgotten: {out:?}"
        );
        assert!(
            !out.iter()
                .any(|o| matches!(o, Output::Io(Io::Close { link: 200 }))),
            "a job process talks to this daemon only: {out:?}"
        );
        let out = d.handle(T, Input::Closed { link: 200 });
        assert_eq!(
            out.iter()
                .filter(|o| matches!(o, Output::EventClientGone { link: 200 }))
                .count(),
            1
        );
    }

    #[test]
    fn a_relayed_request_that_cannot_go_up_closes_its_tool_below_and_tells_the_subtree() {
        let mut d = joined(8, 1, dvmlab_proto::wire::VERSION);
        hello(&mut d, T, 30, 3);
        report(&mut d, T, 30, vec![member(3, 1, 5)]);
        // The way up breaks: the subtree hears of it, and a request from below that was on
        // its way is answered by closing its tool on the daemon it came from.
        let out = d.handle(T, Input::Closed { link: 1 });
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Io(Io::Send {
                    link: 30,
                    frame: Frame::Daemon(DaemonMsg::PathLost)
                })
            )),
            "{out:?}"
        );
        let up = routed(
            3,
            0,
            Body::ToolUp {
                tool: 7,
                req: ToolRequest::Jobs,
            },
        );
        let out = d.handle(T, Input::Frame { link: 30, msg: up });
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Io(Io::Send {
                    link: 30,
                    frame: Frame::Daemon(DaemonMsg::Routed {
                        dst: 3,
                        body: Body::ToolDropped { tool: 7, .. },
                        ..
                    })
                })
            )),
            "{out:?}"
        );
    }

    #[test]
    fn the_controller_serves_a_relayed_tool_and_refuses_one_claimed_by_the_wrong_link() {
        let mut c = controller(4);
        hello(&mut c, T, 10, 1);
        hello(&mut c, T, 20, 2);
        report(&mut c, T, 10, vec![member(1, 0, 5)]);
        report(&mut c, T, 20, vec![member(2, 0, 5)]);
        // Rank 2's tool, claimed on rank 1's link: a daemon speaks only for its subtree.
        let forged = routed(
            2,
            0,
            Body::ToolUp {
                tool: 9,
                req: ToolRequest::Stop,
            },
        );
        let out = c.handle(
            T,
            Input::Frame {
                link: 10,
                msg: forged,
            },
        );
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Io(Io::Note(Note::Refused { link: 10, .. })))),
            "{out:?}"
        );
        assert!(c.stopping.is_none(), "a forged stop was obeyed");
        // Rank 1's own tool is served under a link id of its own, and answered down the tree.
        let up = routed(
            1,
            0,
            Body::ToolUp {
                tool: 9,
                req: ToolRequest::Status,
            },
        );
        let out = c.handle(T, Input::Frame { link: 10, msg: up });
        let Some(link) = out.iter().find_map(|o| match o {
            Output::StatusFor { link } => Some(*link),
            _ => None,
        }) else {
            panic!("{out:?}");
        };
        assert_ne!(link & RELAYED, 0);
        let reply = ToolReply::JobsEnd;
        let out = c.handle(T, Input::Reply { link, reply });
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Io(Io::Send {
                    link: 10,
                    frame: Frame::Daemon(DaemonMsg::Routed {
                        dst: 1,
                        body: Body::ToolDown {
                            tool: 9,
                            reply: ToolReply::JobsEnd
                        },
                        ..
                    })
                })
            )),
            "{out:?}"
        );
        // Rank 1 is lost: its tool is forgotten, and closed once rank 1 is back.
        let out = c.handle(T, Input::Closed { link: 10 });
        assert!(out.contains(&Output::ToolGone { link }), "{out:?}");
        hello(&mut c, T, 11, 1);
        let out = report(&mut c, T, 11, vec![member(1, 0, 6)]);
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Io(Io::Send {
                    link: 11,
                    frame: Frame::Daemon(DaemonMsg::Routed {
                        dst: 1,
                        body: Body::ToolDropped { tool: 9, .. },
                        ..
                    })
                })
            )),
            "{out:?}"
        );
    }

    fn member(rank: Rank, parent: Rank, epoch: u64) -> Member {
        Member {
            rank,
            host: format!("h{rank}"),
            parent,
            epoch,
            via: 0,
            uri: format!("t.{rank};tcp://10.0.0.{rank}:7817:24"),
        }
    }

    /// Daemon `rank` of `size`, started and joined under the controller on link 1 (protocol
    /// `version`).
    fn joined(size: u32, rank: Rank, version: u32) -> Node {
        let mut d = node(size, rank);
        d.handle(T, Input::Start);
        d.handle(
            T,
            Input::UplinkUp {
                link: 1,
                rank: 0,
                version,
            },
        );
        d
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
                stopping: false,
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
        for beat in 1..=MISSED_HEARTBEATS {
            let out = c.handle(T + HB * beat, Input::Timer(Timer::Heartbeat));
            assert!(out
                .iter()
                .any(|o| matches!(o, Output::Io(Io::Send { link: 10, .. }))));
            assert!(c.formed(), "{beat} quiet intervals are tolerated");
        }
        let out = c.handle(T + HB * 4, Input::Timer(Timer::Heartbeat));
        assert!(out.contains(&Output::Io(Io::Close { link: 10 })), "{out:?}");
        assert!(!c.formed());
        assert_eq!(c.status().members[1].state, MemberState::Lost);
    }

    #[test]
    fn one_overdue_beat_is_one_missed_heartbeat_however_late_it_runs() {
        let mut c = controller(2);
        c.handle(T, Input::Start);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        // Starved for a minute: the beat runs before the child's waiting heartbeat.
        let late = T + HB * 60;
        let out = c.handle(late, Input::Timer(Timer::Heartbeat));
        assert!(
            !out.contains(&Output::Io(Io::Close { link: 10 })),
            "{out:?}"
        );
        c.handle(
            late,
            Input::Frame {
                link: 10,
                msg: DaemonMsg::Heartbeat,
            },
        );
        for beat in 1..=MISSED_HEARTBEATS {
            c.handle(late + HB * beat, Input::Timer(Timer::Heartbeat));
        }
        assert!(c.formed(), "heard again, so three more beats are tolerated");
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
                stopping: false,
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
    fn a_rank_that_never_confirms_is_named_and_told_directly_at_the_controllers_grace_end() {
        // Rank 1 was joined as the stop began; its link drops without its confirmation (a
        // partition, say) and it never comes back.
        let mut c = stopping_controller(3);
        let out = c.handle(T, Input::Closed { link: 10 });
        assert!(!exits(&out), "rank 1 is still awaited: {out:?}");
        let out = c.handle(T, Input::Timer(Timer::StopGrace));
        assert!(
            out.iter().any(|o| matches!(o,
            Output::Io(Io::Send { frame: Frame::ToolReply(ToolReply::Stopped { unconfirmed }), .. })
            if unconfirmed == &vec![1])),
            "{out:?}"
        );
        assert_eq!(
            told_to_stop(&out),
            [1],
            "the last word to the unconfirmed: {out:?}"
        );
        assert!(exits(&out));
    }

    /// The ranks `out` pokes with the stop.
    fn told_to_stop(out: &[Output]) -> Vec<Rank> {
        out.iter()
            .filter_map(|o| match o {
                Output::Io(Io::Poke {
                    rank,
                    host,
                    stop: true,
                }) if *host == format!("h{rank}") => Some(*rank),
                _ => None,
            })
            .collect()
    }

    fn stop_poke(n: &mut Node, link: LinkId, from: Rank) -> Vec<Output> {
        let peer = Peer::Daemon {
            rank: from,
            host: format!("h{from}"),
        };
        n.handle(
            T,
            Input::Hello {
                link,
                peer,
                version: dvmlab_proto::wire::VERSION,
                stopping: true,
            },
        )
    }

    #[test]
    fn a_stopping_controller_tells_the_members_it_cannot_reach_directly() {
        // Rank 1 is joined; rank 2's parent gave up on it just before the stop; rank 3
        // never joined; rank 4 left the DVM.
        let mut c = controller(5);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1)]);
        hello(&mut c, T, 20, 2);
        report(&mut c, T, 20, vec![member(2, 0, 1)]);
        c.handle(T, Input::Closed { link: 20 });
        c.roster.set(4, State::Departed);
        tool_hello(&mut c, 99);
        let out = c.handle(
            T,
            Input::Tool {
                link: 99,
                req: ToolRequest::Stop,
            },
        );
        assert_eq!(told_to_stop(&out), [2, 3], "{out:?}");
        assert!(out.contains(&Output::Io(Io::Send {
            link: 10,
            frame: Frame::Daemon(DaemonMsg::Shutdown)
        })));
        // Those told directly are not awaited, even one whose connection comes through
        // after the poke (it may have exited on the poke): the stop ends with rank 1's
        // confirmation.
        let out = hello(&mut c, T, 21, 2);
        assert!(out.contains(&Output::Io(Io::Send {
            link: 21,
            frame: Frame::Daemon(DaemonMsg::Shutdown)
        })));
        let out = frame(&mut c, 10, DaemonMsg::Stopped { ranks: vec![1] });
        assert!(exits(&out), "{out:?}");
        assert!(out.iter().any(|o| matches!(o,
            Output::Io(Io::Send { frame: Frame::ToolReply(ToolReply::Stopped { unconfirmed }), .. })
            if unconfirmed.is_empty())));
    }

    #[test]
    fn a_daemon_the_controller_tells_to_stop_directly_stops_its_subtree_and_exits_unacknowledged() {
        // Rank 1 of 8 (radix 2), cut off from its parent, with rank 3 below it.
        let mut d = node(8, 1);
        d.handle(T, Input::Start);
        hello(&mut d, T, 30, 3);
        report(&mut d, T, 30, vec![member(3, 1, 5)]);
        let out = stop_poke(&mut d, 40, 0);
        assert!(out.contains(&Output::Io(Io::Close { link: 40 })), "{out:?}");
        assert!(out.contains(&Output::Io(Io::Send {
            link: 30,
            frame: Frame::Daemon(DaemonMsg::Shutdown)
        })));
        assert!(!exits(&out), "its subtree first: {out:?}");
        let out = frame(&mut d, 30, DaemonMsg::Stopped { ranks: vec![3] });
        assert!(exits(&out), "nobody above awaits it: {out:?}");
    }

    #[test]
    fn a_stopping_daemon_cut_off_from_above_and_told_directly_exits_once_its_subtree_confirmed() {
        let mut d = stopping_daemon(dvmlab_proto::wire::VERSION);
        d.handle(T, Input::Closed { link: 1 });
        let out = stop_poke(&mut d, 60, 0);
        assert!(!exits(&out), "3 and 7 not heard: {out:?}");
        let out = frame(&mut d, 30, DaemonMsg::Stopped { ranks: vec![3, 7] });
        assert!(exits(&out), "no acknowledgment awaited: {out:?}");
    }

    #[test]
    fn only_the_controller_stops_a_daemon_by_a_poke_and_one_awaiting_its_acknowledgment_exits() {
        // Rank 1 confirmed to its parent and awaits the acknowledgment.
        let mut d = joined(8, 1, dvmlab_proto::wire::VERSION);
        let out = frame(&mut d, 1, DaemonMsg::Shutdown);
        assert!(confirms(&out, 1, &[1]) && !exits(&out), "{out:?}");
        // Rank 3 below it claims the stop: links go up, so it is only a poke (declined).
        let mut leaf = node(8, 3);
        leaf.handle(T, Input::Start);
        let out = stop_poke(&mut leaf, 40, 1);
        assert!(!exits(&out) && leaf.stopping.is_none(), "{out:?}");
        let out = stop_poke(&mut d, 40, 0);
        assert!(exits(&out), "{out:?}");
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

    fn frame(n: &mut Node, link: LinkId, msg: DaemonMsg) -> Vec<Output> {
        n.handle(T, Input::Frame { link, msg })
    }

    /// Rank 1 of 8 (radix 2) joined under the controller (protocol `version`) on link 1,
    /// with rank 3 (and 7 below it) on link 30 and rank 5 on link 50, told by its parent to
    /// stop; rank 5 has confirmed, and was acknowledged.
    fn stopping_daemon(version: u32) -> Node {
        let mut d = joined(8, 1, version);
        hello(&mut d, T, 30, 3);
        report(&mut d, T, 30, vec![member(3, 1, 5), member(7, 3, 6)]);
        hello(&mut d, T, 50, 5);
        report(&mut d, T, 50, vec![member(5, 1, 5)]);
        let out = frame(&mut d, 1, DaemonMsg::Shutdown);
        assert!(
            out.contains(&Output::SetTimer {
                timer: Timer::StopGrace,
                delay: STOP_GRACE
            }),
            "{out:?}"
        );
        let stopped = DaemonMsg::Stopped { ranks: vec![5] };
        let out = frame(&mut d, 50, stopped);
        assert!(out.contains(&Output::Io(Io::Send {
            link: 50,
            frame: Frame::Daemon(DaemonMsg::StopAcked)
        })));
        assert!(
            !out.contains(&Output::Io(Io::Exit)),
            "3 and 7 not heard: {out:?}"
        );
        d
    }

    fn confirms(out: &[Output], link: LinkId, ranks: &[Rank]) -> bool {
        out.contains(&Output::Io(Io::Send {
            link,
            frame: Frame::Daemon(DaemonMsg::Stopped {
                ranks: ranks.to_vec(),
            }),
        }))
    }

    fn exits(out: &[Output]) -> bool {
        out.contains(&Output::Io(Io::Exit))
    }

    #[test]
    fn a_stopping_daemon_that_loses_a_child_link_confirms_the_rest_of_its_subtree_at_once() {
        // Rank 3's subtree was cut off just as the stop came: it heals up to an ancestor and
        // confirms there. Waiting for it here would hold back rank 5's confirmation until
        // this daemon's grace ran out, which is when the controller's could run out too.
        let mut d = stopping_daemon(dvmlab_proto::wire::VERSION);
        let out = d.handle(T, Input::Closed { link: 30 });
        assert!(confirms(&out, 1, &[5, 1]), "{out:?}");
        assert!(
            !exits(&out),
            "exits only once the parent counted it: {out:?}"
        );
        let out = frame(&mut d, 1, DaemonMsg::StopAcked);
        assert!(exits(&out), "{out:?}");
    }

    #[test]
    fn a_stopping_daemon_stops_awaiting_ranks_its_child_reports_lost() {
        let mut d = stopping_daemon(dvmlab_proto::wire::VERSION);
        let lost = DaemonMsg::Lost {
            ranks: vec![RankEpoch {
                rank: 7,
                epoch: 6,
                via: 0,
            }],
        };
        let out = frame(&mut d, 30, lost);
        assert!(
            !out.iter().any(|o| matches!(
                o,
                Output::Io(Io::Send {
                    frame: Frame::Daemon(DaemonMsg::Stopped { .. }),
                    ..
                })
            )),
            "3 not heard: {out:?}"
        );
        let stopped = DaemonMsg::Stopped { ranks: vec![3] };
        let out = frame(&mut d, 30, stopped);
        assert!(confirms(&out, 1, &[3, 5, 1]), "{out:?}");
    }

    #[test]
    fn a_stopped_daemon_whose_parent_drops_it_before_acknowledging_confirms_to_the_controller() {
        let mut d = stopping_daemon(dvmlab_proto::wire::VERSION);
        d.handle(T, Input::Closed { link: 30 });
        // The parent gave up on this link (it looked dead to it) before the confirmation
        // came: the confirmation is lost with the link.
        let out = d.handle(T, Input::Closed { link: 1 });
        assert!(!exits(&out), "{out:?}");
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Io(Io::Connect { rank: 0, .. }))),
            "straight to the controller: {out:?}"
        );
        // A child of its own that heals up to it now is sent on.
        let out = hello(&mut d, T, 70, 7);
        assert!(
            out.iter().any(|o| matches!(o, Output::Io(Io::Send { link: 70, frame: Frame::Refuse { reason } }) if reason.contains("has stopped"))),
            "{out:?}"
        );
        let out = d.handle(
            T,
            Input::UplinkFailed {
                rank: 0,
                reason: "refused".into(),
            },
        );
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Io(Io::Connect { rank: 0, .. }))),
            "it keeps trying: {out:?}"
        );
        let out = d.handle(
            T,
            Input::UplinkUp {
                link: 2,
                rank: 0,
                version: dvmlab_proto::wire::VERSION,
            },
        );
        assert!(confirms(&out, 2, &[5, 1]), "{out:?}");
        let out = frame(&mut d, 2, DaemonMsg::StopAcked);
        assert!(exits(&out), "{out:?}");
    }

    #[test]
    fn a_stopped_daemon_never_acknowledged_exits_after_the_grace_and_says_so() {
        let mut d = stopping_daemon(dvmlab_proto::wire::VERSION);
        let out = d.handle(T, Input::Closed { link: 30 });
        assert!(
            out.contains(&Output::SetTimer {
                timer: Timer::StopAck,
                delay: STOP_GRACE
            }),
            "{out:?}"
        );
        // A confirmation that comes after its own went up is not counted, so not
        // acknowledged: that child confirms to the controller once this daemon is gone.
        let late = DaemonMsg::Stopped { ranks: vec![5] };
        let out = frame(&mut d, 50, late);
        assert!(
            !out.contains(&Output::Io(Io::Send {
                link: 50,
                frame: Frame::Daemon(DaemonMsg::StopAcked)
            })),
            "{out:?}"
        );
        let out = d.handle(T, Input::Timer(Timer::StopAck));
        assert!(exits(&out), "{out:?}");
        assert!(
            out.contains(&Output::Io(Io::Note(Note::StopUnacknowledged {
                ranks: vec![5, 1]
            }))),
            "{out:?}"
        );
    }

    #[test]
    fn a_stopping_daemon_under_a_version_3_parent_exits_as_it_confirms() {
        let mut d = stopping_daemon(3);
        let out = d.handle(T, Input::Closed { link: 30 });
        assert!(confirms(&out, 1, &[5, 1]) && exits(&out), "{out:?}");
    }

    #[test]
    fn the_controller_outwaits_its_daemons_and_hears_a_lost_subtree_confirm_directly() {
        let mut c = controller(4);
        hello(&mut c, T, 10, 1);
        report(&mut c, T, 10, vec![member(1, 0, 1), member(3, 1, 2)]);
        hello(&mut c, T, 20, 2);
        report(&mut c, T, 20, vec![member(2, 0, 1)]);
        c.handle(
            T,
            Input::Hello {
                link: 99,
                peer: Peer::Tool,
                version: dvmlab_proto::wire::VERSION,
                stopping: false,
            },
        );
        let out = c.handle(
            T,
            Input::Tool {
                link: 99,
                req: ToolRequest::Stop,
            },
        );
        assert!(
            out.contains(&Output::SetTimer {
                timer: Timer::StopGrace,
                delay: CONTROLLER_STOP_GRACE
            }) && CONTROLLER_STOP_GRACE > STOP_GRACE,
            "{out:?}"
        );
        // Rank 1 lost rank 3 and confirmed itself alone; rank 3 heals up to the controller.
        let lost = DaemonMsg::Lost {
            ranks: vec![RankEpoch {
                rank: 3,
                epoch: 2,
                via: 0,
            }],
        };
        frame(&mut c, 10, lost);
        let stopped = DaemonMsg::Stopped { ranks: vec![1] };
        frame(&mut c, 10, stopped);
        let stopped = DaemonMsg::Stopped { ranks: vec![2] };
        let out = frame(&mut c, 20, stopped);
        assert!(!out.contains(&Output::Io(Io::Exit)), "3 not heard: {out:?}");
        let out = hello(&mut c, T, 30, 3);
        assert!(out.contains(&Output::Io(Io::Send {
            link: 30,
            frame: Frame::Daemon(DaemonMsg::Shutdown)
        })));
        let stopped = DaemonMsg::Stopped { ranks: vec![3] };
        let out = frame(&mut c, 30, stopped);
        assert!(
            out.iter().any(|o| matches!(o,
            Output::Io(Io::Send { frame: Frame::ToolReply(ToolReply::Stopped { unconfirmed }), .. })
            if unconfirmed.is_empty())),
            "{out:?}"
        );
    }

    /// The ranks `out` pokes, each at its own host.
    fn poked(out: &[Output]) -> Vec<Rank> {
        out.iter()
            .filter_map(|o| match o {
                Output::Io(Io::Poke {
                    rank,
                    host,
                    stop: false,
                }) if *host == format!("h{rank}") => Some(*rank),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_daemon_that_starts_pokes_its_children_by_the_tree_formula() {
        let mut c = controller(8);
        let out = c.handle(T, Input::Start);
        assert_eq!(poked(&out), [1, 2], "{out:?}");
    }

    #[test]
    fn a_daemon_poked_by_its_parent_connects_up_at_once_and_declines_the_link() {
        let mut d = node(8, 3);
        d.handle(T, Input::Start);
        let out = hello(&mut d, T, 40, 1);
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Io(Io::Send {
                    link: 40,
                    frame: Frame::Refuse { .. }
                })
            )),
            "{out:?}"
        );
        assert!(out.contains(&Output::Io(Io::Close { link: 40 })), "{out:?}");
        assert!(out.contains(&Output::Io(Io::Hurry)), "{out:?}");
        // Once connected up there is nothing to hurry.
        d.handle(
            T,
            Input::UplinkUp {
                link: 1,
                rank: 1,
                version: dvmlab_proto::wire::VERSION,
            },
        );
        let out = hello(&mut d, T, 41, 1);
        assert!(out.contains(&Output::Io(Io::Close { link: 41 })), "{out:?}");
        assert!(!out.contains(&Output::Io(Io::Hurry)), "{out:?}");
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
