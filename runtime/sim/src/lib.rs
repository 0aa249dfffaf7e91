//! The simulator (dev only): many whole daemons (`DaemonCore`: overlay, job-exec and job manager) wired
//! by an in-memory network with random boot times, random per-message latency (FIFO per link,
//! like TCP), parents that boot late, crashes with and without FIN, restarts and cut links;
//! tools submit jobs throughout and simulated job shells run them. Invariants are checked
//! after every step (and the cores `debug_assert!` their own after every input), not only
//! at the end. No sockets, no clocks: every run is reproducible from the proptest seed, and
//! every minimal failing case found is kept below as a named test.

pub mod elastic_model;
pub mod events;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use dvmlab_core::daemon_core::{DaemonCore, Input as CoreInput, Now, Output, Timer};
use dvmlab_core::exec::{ExecDown, ExecUp, Input as ShellInput, JobId, ShellCommand};
use dvmlab_core::identity::{Identity, Role};
use dvmlab_core::jobs::Saved;
use dvmlab_core::overlay::{Input, Io, LinkId, NodeConfig, Note};
use dvmlab_core::roster::Roster;
use dvmlab_core::tree::{RadixTree, Rank};
use dvmlab_core::uplink::Policy;
use dvmlab_proto::contract::MemberState;
use dvmlab_proto::event::{Directives, EventDown, EventUp, EVENT_JOB_END};
use dvmlab_proto::exec::{barrier_count, BARRIER_KEYS};
use dvmlab_proto::placement::MapBy;
use dvmlab_proto::wire::{
    Body, DaemonMsg, Frame, Peer, Submit, ToolReply, ToolRequest, EVENT_INTEREST,
};
use proptest::prelude::*;

/// One simulated millisecond.
pub const MS: u64 = 1;
/// The daemons' start hold (simulated ms): shorter than the simulated jobs' default 50 ms,
/// so runs see starts that go up when the hold runs out and starts that go up with finishes.
const START_HOLD_MS: u64 = 20;
/// The controller's hold on a job's `remove` (the runtime's default is 50 ms).
const REMOVE_HOLD_MS: u64 = 20;
/// Barriers a shell of a barrier job goes through (see [`Sim::barrier_jobs`]).
pub const JOB_BARRIERS: u32 = 2;
pub const TOOL: LinkId = u64::MAX;
/// Tools submitting jobs have links from here up, one each.
pub const JOB_TOOLS: LinkId = 1 << 62;
/// Links of tools that only register for events ([`Sim::event_tool`]) start here.
pub const EVENT_TOOLS: LinkId = 1 << 61;

/// Something that happens in a simulated run, at a time of its own.
#[derive(Debug, Clone)]
pub enum Ev {
    Boot(Rank),
    Input(Rank, Input),
    /// `from` tries to connect to `to`, unless a later connect of `from` superseded this
    /// one (`attempt` is not its latest: see `Io::Hurry`).
    Dial {
        from: Rank,
        to: Rank,
        attempt: u64,
    },
    /// `from` connects to `to` only to say it is up, or with `stop` that the DVM stops
    /// (`Io::Poke`).
    Poke {
        from: Rank,
        to: Rank,
        stop: bool,
    },
    /// The daemon dies; with `fin` its peers see its connections close, without it they only
    /// stop hearing from it (power loss, freeze, partition).
    Crash {
        rank: Rank,
        fin: bool,
    },
    /// One of the open links (picked by `seed`) breaks.
    Cut {
        seed: usize,
    },
    /// The dialer of `link` gives up if no welcome came (the shell's handshake timeout).
    HelloTimeout {
        link: LinkId,
    },
    /// A tool connects to the daemon of rank `at` (the controller, or another that relays
    /// its requests) and submits a job of `nprocs` processes that each run `run_ms`.
    Submit {
        at: Rank,
        nprocs: Option<u32>,
        run_ms: u64,
        /// Only on this rank's host (the controller places the job otherwise).
        on: Option<Rank>,
    },
    /// A job shell's event, from the shell of incarnation `life` of `rank` (dropped if that
    /// daemon has died since).
    Shell {
        rank: Rank,
        life: u64,
        input: ShellInput,
    },
    /// A timer set by incarnation `life` of `rank` (dropped if that daemon has died since:
    /// a restarted daemon is a new process, with only the timers it sets itself).
    Timer {
        rank: Rank,
        life: u64,
        timer: dvmlab_core::overlay::Timer,
    },
    /// The daemon gets no CPU for `ms` (a loaded machine, a paused VM): nothing reaches its
    /// core meanwhile. When it runs again its timers come first and what its peers sent
    /// waits behind them, the worst order a starved event loop can take.
    Stall {
        rank: Rank,
        ms: u64,
    },
    /// The tool on link `TOOL` asks the controller to shrink the DVM by the host of `rank`.
    Shrink {
        rank: Rank,
    },
    /// What the shell of incarnation `life` of `rank` feeds its core on its own: a
    /// campaign's timeout, a release component done (dropped if that daemon has died since).
    Core {
        rank: Rank,
        life: u64,
        input: CoreInput,
    },
}

/// A job as the tool that submitted it saw it.
#[derive(Debug, Default)]
pub struct ToolView {
    /// The daemon it is connected to.
    pub at: Rank,
    pub id: Option<JobId>,
    pub refused: Option<String>,
    pub ended: u32,
    /// How it ended: the greatest wait status, and its first exception if any.
    pub status: Option<i32>,
    pub exception: Option<String>,
    pub run_ms: u64,
    /// Its connection ended: the daemon closed it (with an error reply saying why) or died.
    pub closed: bool,
}

/// A simulated DVM: its daemons, the network between them, the tools and job shells, and
/// what the invariants checked after every step have seen.
pub struct Sim {
    pub nodes: BTreeMap<Rank, DaemonCore>,
    pub alive: Vec<bool>,
    pub cfg: Vec<NodeConfig>,
    pub queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    pub events: Vec<Ev>,
    pub seq: u64,
    pub now: u64,
    /// link id → (owner, peer rank, peer's link id)
    pub links: BTreeMap<LinkId, (Rank, Rank, LinkId)>,
    pub next_link: LinkId,
    /// Dialer's link → the rank it dialed, until the welcome (or refusal) arrives.
    pub pending: BTreeMap<LinkId, Rank>,
    /// per link: time of the last delivery, to keep each link FIFO
    pub last: BTreeMap<LinkId, u64>,
    pub latency: Vec<u64>,
    pub lat_i: usize,
    pub tool_replies: Vec<ToolReply>,
    pub exited: Vec<bool>,
    /// Each rank's incarnation (its boot time), so a dead daemon's shells fall silent.
    pub life: Vec<u64>,
    pub tools: BTreeMap<LinkId, ToolView>,
    /// (rank, incarnation, job): every launch, to catch a job started twice on one daemon.
    pub launched: BTreeSet<(Rank, u64, JobId)>,
    /// Start holds the cores cancelled (rank, life, job): their wakeups never come, as the
    /// real shell aborts them.
    pub cancelled_holds: BTreeSet<(Rank, u64, JobId)>,
    /// Job → its ranks, as the controller placed it.
    pub placed: BTreeMap<JobId, BTreeSet<Rank>>,
    /// Shells running now: (rank, job) → the incarnation running it.
    pub running: BTreeMap<(Rank, JobId), u64>,
    /// Every job's shells enter a barrier as they start, another halfway, and run their time
    /// only once the last completes, as an MPI job's processes meet in `MPI_Init` and
    /// `MPI_Finalize`: a job one of whose ranks is
    /// lost then ends only if the fatal exception reaches every shell (the soak's barrier
    /// jobs). Without it, shells run their time and exit on their own, and a shell the
    /// exception never reached goes unnoticed.
    pub barrier_jobs: bool,
    /// With `barrier_jobs`, per running shell (rank, job; gone with it): the barriers it entered and the
    /// ends it got. A shell goes through [`JOB_BARRIERS`] barriers, all numbered 1 (numbers
    /// repeat), never gets an end while not in a barrier, nor the end of one that another
    /// running shell of the job has not entered.
    pub barriers: BTreeMap<(Rank, JobId), (u32, u32)>,
    /// Per rank: the newest protocol version its daemon speaks. A link speaks the lower of
    /// its two ends' (the real hello's outcome), and what is sent on it must be what a
    /// daemon of that version reads (checked at every send).
    pub versions: Vec<u32>,
    /// What the controller last wrote out of its live jobs: a controller booting again
    /// recovers them.
    pub saved_jobs: Saved,
    /// The first invariant broken, with the time.
    pub violation: Option<String>,
    /// The largest frame any daemon sent, when measured (it costs an encoding per send).
    pub largest_frame: Option<usize>,
    /// Per rank: the end of its stall (see [`Ev::Stall`]).
    pub stalled_until: Vec<u64>,
    /// Every link a daemon found silent and dropped: (time, the daemon, the rank it lost).
    pub dead_links: Vec<(u64, Rank, Rank)>,
    /// Campaigns whose timeout came while they were still in progress: (time, campaign).
    pub campaign_timeouts: Vec<(u64, u64)>,
    /// Per rank: its latest connect up (`Ev::Dial::attempt`), with the rank and the time it
    /// is due at while it waits out its delay.
    pub dials: Vec<(u64, Option<(Rank, u64)>)>,
    /// The poking side of poke links: whatever the poked daemon answers goes nowhere.
    pub pokes: BTreeSet<LinkId>,
    /// Every poke made: (time, poker, poked).
    pub poked: Vec<(u64, Rank, Rank)>,
    /// When kept: every frame the controller sent, in the order its core said to send them
    /// (to tools and to daemons alike).
    pub controller_sends: Option<Vec<Frame>>,
    /// When counted: per rank, the events that came down or up to its daemon.
    pub event_frames: Option<Vec<u32>>,
    /// What each event tool ([`Sim::event_tool`]) was sent, in order.
    pub event_downs: BTreeMap<LinkId, Vec<EventDown>>,
    /// The event tools whose daemon closed their connection (as one does when its path to
    /// the controller breaks: replies may have been lost).
    pub event_tools_closed: BTreeSet<LinkId>,
}

impl Sim {
    pub fn new(n: u32, radix: u32, heal: Option<u64>, latency: Vec<u64>) -> Sim {
        let tree = RadixTree::new(radix, n);
        let hosts: Vec<String> = (0..n).map(|r| format!("h{r}")).collect();
        let cfg = (0..n)
            .map(|r| NodeConfig {
                identity: Identity {
                    nspace: "sim-prte-dvm".into(),
                    rank: r,
                    role: if r == 0 {
                        Role::Controller
                    } else {
                        Role::Daemon
                    },
                    host: hosts[r as usize].clone(),
                },
                roster: Roster::from_conf(&hosts, false, r),
                tree,
                policy: Policy {
                    initial: Duration::from_millis(20),
                    max: Duration::from_millis(2000),
                    heal_after: heal.map(Duration::from_millis),
                },
                heartbeat: Duration::from_millis(1000),
                incarnation: 0,
                controller_uri: "sim".into(),
                uri: format!("sim.{r};tcp://10.0.0.{}:7817:16", r % 250),
                authenticated: true,
                depart_lingers: false,
            })
            .collect();
        Sim {
            nodes: BTreeMap::new(),
            alive: vec![false; n as usize],
            cfg,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            seq: 0,
            now: 0,
            links: BTreeMap::new(),
            next_link: 1,
            last: BTreeMap::new(),
            pending: BTreeMap::new(),
            latency: if latency.is_empty() { vec![1] } else { latency },
            lat_i: 0,
            tool_replies: Vec::new(),
            exited: vec![false; n as usize],
            life: vec![0; n as usize],
            tools: BTreeMap::new(),
            launched: BTreeSet::new(),
            cancelled_holds: BTreeSet::new(),
            placed: BTreeMap::new(),
            running: BTreeMap::new(),
            barrier_jobs: false,
            barriers: BTreeMap::new(),
            versions: vec![dvmlab_proto::wire::VERSION; n as usize],
            saved_jobs: Saved::default(),
            violation: None,
            largest_frame: None,
            stalled_until: vec![0; n as usize],
            dead_links: Vec::new(),
            campaign_timeouts: Vec::new(),
            dials: vec![(0, None); n as usize],
            pokes: BTreeSet::new(),
            poked: Vec::new(),
            controller_sends: None,
            event_frames: None,
            event_downs: BTreeMap::new(),
            event_tools_closed: BTreeSet::new(),
        }
    }

    fn violated(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("at {} ms: {what}", self.now));
        }
    }

    /// What must hold after every step.
    fn check(&mut self) {
        let mut broken = Vec::new();
        for (link, t) in &self.tools {
            if t.ended > 1 {
                broken.push(format!("tool {link}: its job ended {} times", t.ended));
            }
            if t.ended > 0 && t.id.is_none() {
                broken.push(format!("tool {link}: a job ended that was never accepted"));
            }
        }
        if let Some(c) = self.nodes.get(&0) {
            let s = c.status();
            let wired = s
                .members
                .iter()
                .filter(|m| m.state == MemberState::Joined)
                .count() as u32;
            // An elastic DVM stays formed while a member departs and after it left.
            let formed = if s.elastic {
                s.members.iter().all(|m| {
                    matches!(
                        m.state,
                        MemberState::Joined | MemberState::Departing | MemberState::Departed
                    )
                })
            } else {
                wired == s.expected
            };
            if s.joined != wired || s.formed != formed {
                broken.push(format!("controller's status disagrees with itself: {s:?}"));
            }
        }
        for (r, c) in &self.nodes {
            if c.node().roster().len() != self.cfg.len() as u32 {
                broken.push(format!(
                    "rank {r}'s roster has {} ranks",
                    c.node().roster().len()
                ));
            }
        }
        for b in broken {
            self.violated(b);
        }
    }

    /// Schedules `ev` at time `t` (ms).
    pub fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(ev);
        self.queue
            .push(Reverse((t, self.seq, self.events.len() - 1)));
    }

    fn lat(&mut self) -> u64 {
        self.lat_i += 1;
        self.latency[self.lat_i % self.latency.len()]
    }

    /// Delivers `input` over `link` keeping the link FIFO.
    fn deliver_on(&mut self, link: LinkId, to: Rank, input: Input) {
        let t = (self.now + self.lat()).max(*self.last.get(&link).unwrap_or(&0));
        self.last.insert(link, t);
        self.at(t, Ev::Input(to, input));
    }

    /// Feeds an overlay input to rank `r`, if it runs.
    pub fn feed(&mut self, r: Rank, input: Input) {
        self.feed_core(r, CoreInput::Net(input));
    }

    fn feed_core(&mut self, r: Rank, input: CoreInput) {
        if !self.alive[r as usize] {
            return;
        }
        let Some(node) = self.nodes.get_mut(&r) else {
            return;
        };
        let now = Now {
            mono: Duration::from_millis(self.now),
            unix_ms: self.now,
        };
        let outs = node.handle(now, input);
        for o in outs {
            self.apply(r, o);
        }
    }

    /// A job reply as it reaches a submitting tool.
    fn tool_reply(&mut self, link: LinkId, reply: ToolReply) {
        let Some(t) = self.tools.get_mut(&link) else {
            return;
        };
        match reply {
            ToolReply::Submitted { id, .. } => t.id = Some(id),
            ToolReply::Error { message } => t.refused = Some(message),
            // A job that never launched (its hosts left the DVM while it waited) ends
            // without having been placed: its end is where the tool learns its number.
            ToolReply::JobEnded {
                id,
                status,
                exception,
            } => {
                t.id.get_or_insert(id);
                t.ended += 1;
                t.status = Some(status);
                t.exception = exception;
            }
            _ => {}
        }
    }

    /// A placement as the controller sends it (to a tool of its own, or down the tree to a
    /// relayed one, which hears of it later): only wired ranks, at this moment.
    fn check_placement(&mut self, reply: &ToolReply) {
        let ToolReply::Submitted { id, placement } = reply else {
            return;
        };
        let wired = self
            .nodes
            .get(&0)
            .map(|c| c.node().roster().compute_ranks())
            .unwrap_or_default();
        let ranks: BTreeSet<Rank> = placement.ranks().iter().collect();
        if let Some(r) = ranks.iter().find(|r| !wired.contains(r)) {
            self.violated(format!(
                "job {id} placed on rank {r}, which is not wired in"
            ));
        }
        self.placed.insert(*id, ranks);
    }

    /// How long job `id`'s processes run (once its barrier completed, with `barrier_jobs`).
    fn run_ms(&self, id: JobId) -> u64 {
        self.tools
            .values()
            .find(|t| t.id == Some(id))
            .map_or(50, |t| t.run_ms)
    }

    /// A simulated job shell: it starts, runs, exits (early and killed on a signal), and
    /// its epilog finishes; each step an input from that daemon's incarnation.
    fn shell_at(&mut self, t: u64, rank: Rank, input: ShellInput) {
        let life = self.life[rank as usize];
        self.at(t, Ev::Shell { rank, life, input });
    }

    /// What the shell of `rank` (as it runs now) feeds its core on its own at `t`.
    fn core_at(&mut self, t: u64, rank: Rank, input: CoreInput) {
        let life = self.life[rank as usize];
        self.at(t, Ev::Core { rank, life, input });
    }

    fn apply(&mut self, r: Rank, o: Output) {
        if let (0, Some(sent), Output::Net(Io::Send { frame, .. })) =
            (r, self.controller_sends.as_mut(), &o)
        {
            sent.push(frame.clone());
        }
        match o {
            Output::Net(Io::Connect { rank, delay }) => {
                let t = self.now + delay.as_millis() as u64;
                self.dial(r, rank, t);
            }
            Output::Net(Io::Hurry) => {
                if let Some((to, due)) = self.dials[r as usize].1 {
                    if due > self.now {
                        self.dial(r, to, self.now);
                    }
                }
            }
            Output::Net(Io::Poke { rank, stop, .. }) => {
                let t = self.now + self.lat();
                self.at(
                    t,
                    Ev::Poke {
                        from: r,
                        to: rank,
                        stop,
                    },
                );
            }
            Output::Net(Io::Send { link, frame }) if link == TOOL => {
                if let Frame::ToolReply(rep) = frame {
                    self.tool_replies.push(rep);
                }
            }
            Output::Net(Io::Send { link, frame }) if (EVENT_TOOLS..JOB_TOOLS).contains(&link) => {
                if let Frame::EventDown(d) = frame {
                    self.event_downs.entry(link).or_default().push(d);
                }
            }
            Output::Net(Io::Send { link, frame }) if link >= JOB_TOOLS => {
                if let Frame::ToolReply(rep) = frame {
                    if r == 0 {
                        self.check_placement(&rep);
                    }
                    self.tool_reply(link, rep);
                }
            }
            Output::Net(Io::Send { link, frame }) => {
                if let (
                    0,
                    Frame::Daemon(DaemonMsg::Routed {
                        body: Body::ToolDown { reply, .. },
                        ..
                    }),
                ) = (r, &frame)
                {
                    self.check_placement(reply);
                }
                if let Some(largest) = self.largest_frame.as_mut() {
                    let len =
                        dvmlab_proto::wire::encode_frame(&frame).map_or(usize::MAX, |b| b.len());
                    *largest = (*largest).max(len);
                }
                let Some(&(_, peer, peer_link)) = self.links.get(&link) else {
                    if std::env::var("DVMLAB_SIM_TRACE").is_ok() {
                        eprintln!(
                            "{:>6} ms r{r}: send on closed link {link}: {frame:?}",
                            self.now
                        );
                    }
                    return;
                };
                self.check_version(r, peer, &frame);
                if let (Some(counts), Frame::Daemon(DaemonMsg::Event { .. })) =
                    (self.event_frames.as_mut(), &frame)
                {
                    counts[peer as usize] += 1;
                }
                if let Ok(t) = std::env::var("DVMLAB_SIM_TRACE") {
                    match &frame {
                        Frame::Daemon(m @ DaemonMsg::Routed { .. }) => {
                            eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now)
                        }
                        Frame::Daemon(m @ (DaemonMsg::Report { .. } | DaemonMsg::Lost { .. }))
                            if t == "overlay" =>
                        {
                            eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now)
                        }
                        Frame::Daemon(
                            m @ (DaemonMsg::ExecUp { .. } | DaemonMsg::ExecDown { .. }),
                        ) if t == "exec" => {
                            eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now)
                        }
                        Frame::Daemon(
                            m @ (DaemonMsg::Event { .. }
                            | DaemonMsg::Interest { .. }
                            | DaemonMsg::InterestSeen { .. }
                            | DaemonMsg::InterestAgain),
                        ) if t == "events" => {
                            eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now)
                        }
                        _ => {}
                    }
                }
                if self.pokes.contains(&peer_link) {
                    return;
                }
                match frame {
                    Frame::Daemon(msg) => self.deliver_on(
                        peer_link,
                        peer,
                        Input::Frame {
                            link: peer_link,
                            msg,
                        },
                    ),
                    Frame::Welcome { .. } => {
                        self.pending.remove(&peer_link);
                        let up = Input::UplinkUp {
                            link: peer_link,
                            rank: r,
                            version: self.link_version(r, peer),
                        };
                        self.deliver_on(peer_link, peer, up)
                    }
                    Frame::Refuse { reason } => {
                        self.pending.remove(&peer_link);
                        self.deliver_on(peer_link, peer, Input::UplinkFailed { rank: r, reason })
                    }
                    _ => {}
                }
            }
            Output::Net(Io::Close { link }) if (EVENT_TOOLS..JOB_TOOLS).contains(&link) => {
                self.event_tools_closed.insert(link);
            }
            Output::Net(Io::Close { link }) if link >= JOB_TOOLS => {
                if let Some(t) = self.tools.get_mut(&link) {
                    t.closed = true;
                }
            }
            Output::Net(Io::Close { link }) => self.close(link),
            Output::SetTimer {
                timer: Timer::Net(timer),
                delay,
            } => {
                let t = self.now + delay.as_millis() as u64;
                let life = self.life[r as usize];
                self.at(
                    t,
                    Ev::Timer {
                        rank: r,
                        life,
                        timer,
                    },
                );
            }
            Output::SetTimer {
                timer: Timer::Campaign(id),
                delay,
            } => {
                let t = self.now + delay.as_millis() as u64;
                self.core_at(t, r, CoreInput::CampaignTimeout(id));
            }
            Output::SetTimer {
                timer: Timer::JobLimit(_),
                ..
            } => {}
            Output::SetTimer {
                timer: Timer::StartHold(id),
                delay,
            } => {
                let t = self.now + delay.as_millis() as u64;
                self.core_at(t, r, CoreInput::Shell(ShellInput::StartDue { id }));
            }
            Output::SetTimer {
                timer: Timer::RemoveHold,
                delay,
            } => {
                let t = self.now + delay.as_millis() as u64;
                self.core_at(t, r, CoreInput::RemovesDue);
            }
            Output::CancelTimer(Timer::StartHold(id)) => {
                let life = self.life[r as usize];
                self.cancelled_holds.insert((r, life, id));
            }
            // Job limits are not run here (as their `SetTimer` above).
            Output::CancelTimer(Timer::JobLimit(_)) => {}
            Output::CancelTimer(_) => self.violated(format!(
                "rank {r} cancelled a timer that cannot be cancelled: {o:?}"
            )),
            Output::Shell(ShellCommand::Launch { id, .. }) => {
                let life = self.life[r as usize];
                if !self.launched.insert((r, life, id)) {
                    self.violated(format!("job {id} launched twice on rank {r} (life {life})"));
                }
                if self.placed.get(&id).is_some_and(|p| !p.contains(&r)) {
                    self.violated(format!(
                        "job {id} launched on rank {r}, outside its placement"
                    ));
                }
                self.running.insert((r, id), life);
                let t = self.now + 1 + self.lat();
                self.shell_at(t, r, ShellInput::ShellStarted { id });
                if self.barrier_jobs {
                    self.barriers.insert((r, id), (0, 0));
                    self.shell_at(t + 1, r, ShellInput::ShellBarrier { id, seq: 1 });
                } else {
                    let run_ms = self.run_ms(id);
                    self.shell_at(t + run_ms, r, ShellInput::ShellExited { id, status: 0 });
                }
            }
            Output::Shell(ShellCommand::BarrierDone { id, .. }) => {
                if !self.barrier_jobs {
                    self.violated(format!(
                        "rank {r} completed a barrier of job {id}, which entered none"
                    ));
                } else if self.running.contains_key(&(r, id)) {
                    let (entered, left) = self.barriers.get(&(r, id)).copied().unwrap_or((0, 0));
                    if left >= entered {
                        return self.violated(format!(
                            "rank {r} got an end of a barrier of job {id} while in none ({entered} entered, {left} left)"
                        ));
                    }
                    self.barriers.insert((r, id), (entered, left + 1));
                    // Nobody leaves a barrier before every shell of the job still running
                    // entered it.
                    let behind = self
                        .barriers
                        .iter()
                        .filter(|((q, j), _)| *j == id && self.running.contains_key(&(*q, id)))
                        .find(|(_, (e, _))| *e <= left);
                    if let Some(((q, _), (e, _))) = behind {
                        return self.violated(format!(
                            "rank {r} left barrier {} of job {id} while rank {q} had entered {e}",
                            left + 1
                        ));
                    }
                    let t = self.now + self.run_ms(id);
                    if left + 1 < JOB_BARRIERS {
                        let t = self.now + 1 + self.run_ms(id) / 2;
                        self.shell_at(t, r, ShellInput::ShellBarrier { id, seq: 1 });
                    } else {
                        self.shell_at(t, r, ShellInput::ShellExited { id, status: 0 });
                    }
                }
            }
            Output::Shell(ShellCommand::Kill { id, signal }) => {
                if self.running.contains_key(&(r, id)) {
                    let t = self.now + 1;
                    self.shell_at(t, r, ShellInput::ShellExited { id, status: signal });
                }
            }
            Output::Shell(ShellCommand::Epilog { id }) => {
                let t = self.now + 1 + self.lat();
                self.shell_at(t, r, ShellInput::EpilogDone { id });
            }
            // The simulated jobs take no stdin.
            Output::Shell(ShellCommand::Stdin { .. }) | Output::JobState { .. } => {}
            Output::Persist(saved) => self.saved_jobs = saved,
            // A release component has nothing to do here: it is done at once.
            Output::Release {
                campaign,
                component,
                ..
            } => {
                let input = CoreInput::ReleaseDone {
                    campaign,
                    component,
                };
                self.core_at(self.now + 1, r, input);
            }
            // This simulation's DVM only shrinks (see `Sim::make_elastic`): nothing is
            // launched (grows are model-checked in `elastic_model`).
            Output::Launch { .. }
            | Output::KillLaunch { .. }
            | Output::CheckHosts { .. }
            | Output::PersistMembership(_) => {}
            Output::Log(l) | Output::Info(l) => {
                if std::env::var("DVMLAB_SIM_TRACE").is_ok() {
                    eprintln!("{:>6} ms r{r}: {l}", self.now);
                }
            }
            Output::Net(Io::Note(note)) => {
                if let Note::LinkDead { rank } = &note {
                    self.dead_links.push((self.now, r, *rank));
                }
                if std::env::var("DVMLAB_SIM_TRACE").is_ok_and(|t| t == "all" || t == r.to_string())
                {
                    eprintln!("{:>6} ms r{r}: {note:?}", self.now);
                }
            }
            Output::Net(Io::Exit) => {
                self.alive[r as usize] = false;
                self.exited[r as usize] = true;
                let mine: Vec<LinkId> = self
                    .links
                    .iter()
                    .filter(|(_, v)| v.0 == r)
                    .map(|(k, _)| *k)
                    .collect();
                for l in mine {
                    self.close(l);
                }
            }
        }
    }

    /// Puts event `idx` (queued as `seq`) back to when its daemon runs again, if that
    /// daemon is stalled: timers at the end of the stall, everything else just after. An
    /// input due at the very end waits too, and each keeps its place in the queue, so what
    /// a link delivers stays in the order it was sent.
    fn defer_if_stalled(&mut self, seq: u64, idx: usize) -> bool {
        let (rank, timer) = match &self.events[idx] {
            Ev::Timer { rank, .. } => (*rank, true),
            Ev::Input(r, _) => (*r, false),
            Ev::Shell { rank, .. } => (*rank, false),
            Ev::Core { rank, input, .. } => (*rank, matches!(input, CoreInput::CampaignTimeout(_))),
            _ => return false,
        };
        let until = self.stalled_until[rank as usize];
        let stalled = until > 0 && (self.now < until || (!timer && self.now == until));
        if !stalled {
            return false;
        }
        let t = if timer { until } else { until + 1 };
        self.queue.push(Reverse((t, seq, idx)));
        true
    }

    /// `n` daemons (radix `radix`) booted together on a fast network, run until formed.
    pub fn formed(n: u32, radix: u32) -> Sim {
        Sim::formed_with(n, radix, vec![1, 2, 1, 3])
    }

    /// As [`Sim::formed`], with these per-message latencies.
    pub fn formed_with(n: u32, radix: u32, latency: Vec<u64>) -> Sim {
        let mut sim = Sim::new(n, radix, Some(1000), latency);
        for r in 0..n {
            sim.at(0, Ev::Boot(r));
        }
        sim.run_until(3_000);
        assert!(
            sim.nodes[&0].node().formed(),
            "{:?}",
            sim.nodes[&0].status()
        );
        sim
    }

    /// A new tool connects to the daemon of rank `at` and submits a job of `nprocs`
    /// processes (on `hosts`, or wherever the controller places them) that each run `run_ms`.
    pub fn submit(
        &mut self,
        at: Rank,
        nprocs: Option<u32>,
        hosts: Option<Vec<String>>,
        run_ms: u64,
    ) {
        let link = JOB_TOOLS + self.tools.len() as LinkId;
        // A tool cannot connect to a daemon that is not running.
        let refused = (!self.alive[at as usize]).then(|| "no daemon".to_string());
        self.tools.insert(
            link,
            ToolView {
                at,
                run_ms,
                refused,
                ..ToolView::default()
            },
        );
        let hello = Input::Hello {
            link,
            peer: Peer::Tool,
            version: dvmlab_proto::wire::VERSION,
            stopping: false,
        };
        self.feed(at, hello);
        let job = Submit {
            argv: vec!["true".into()],
            env: vec![],
            cwd: None,
            nprocs,
            map_by: MapBy::Node,
            hosts,
            time_limit_ms: None,
            userid: 1000,
            stdin: false,
        };
        let req = ToolRequest::Submit { job };
        self.feed(at, Input::Tool { link, req });
    }

    /// The controller runs campaigns from now on: an elastic DVM whose release components
    /// (offered a finished shrink's hosts, each done 1 ms later) are `components`. With
    /// none, a shrink's fence opens the moment its last re-homed daemon reports in.
    pub fn make_elastic(&mut self, components: Vec<String>) {
        let radix = self.cfg[0].tree.radix();
        let config = dvmlab_core::campaign::Config {
            radix,
            timeout: Duration::from_secs(10),
            components,
            fault: None,
        };
        if let Some(c) = self.nodes.get_mut(&0) {
            c.configure_controller(Some(config), None);
        }
    }

    /// The tool on link `TOOL` (hello said) asks the controller to shrink the DVM by
    /// `hosts`; its answers land in `tool_replies`.
    pub fn shrink(&mut self, hosts: Vec<String>) {
        let req = ToolRequest::Shrink { hosts, wait: true };
        self.feed(0, Input::Tool { link: TOOL, req });
    }

    /// A tool connects to the daemon of rank `at` on `link` (from [`EVENT_TOOLS`] on) and
    /// registers a handler for every event; what it is sent lands in `event_downs`.
    pub fn event_tool(&mut self, at: Rank, link: LinkId) {
        let hello = Input::Hello {
            link,
            peer: Peer::Tool,
            version: dvmlab_proto::wire::VERSION,
            stopping: false,
        };
        self.feed(at, hello);
        let up = EventUp::Register {
            id: 1,
            codes: vec![],
            directives: Directives::default(),
        };
        self.feed(at, Input::Event { link, up });
    }

    /// The tool on link `TOOL` says hello to the controller.
    pub fn tool_hello(&mut self) {
        self.feed(
            0,
            Input::Hello {
                link: TOOL,
                peer: Peer::Tool,
                version: dvmlab_proto::wire::VERSION,
                stopping: false,
            },
        );
    }

    /// The tool on link `TOOL` (hello said) stops the DVM; within 20 s every daemon must
    /// have exited and the tool heard that every rank confirmed.
    pub fn stop_cleanly(&mut self) -> Result<(), String> {
        self.feed(
            0,
            Input::Tool {
                link: TOOL,
                req: ToolRequest::Stop,
            },
        );
        self.run_until(self.now + 20_000);
        if let Some(v) = &self.violation {
            return Err(v.clone());
        }
        if !self.exited.iter().all(|&e| e) {
            return Err(format!("not all exited: {:?}", self.exited));
        }
        match self.tool_replies.last() {
            Some(ToolReply::Stopped { unconfirmed }) if unconfirmed.is_empty() => Ok(()),
            _ => Err(format!("the stop's answer: {:?}", self.tool_replies)),
        }
    }

    /// A new link from `from` to `to`, with `from`'s hello on its way; the dialer's side.
    fn hello_link(&mut self, from: Rank, to: Rank, stopping: bool) -> LinkId {
        let (a, b) = (self.next_link, self.next_link + 1);
        self.next_link += 2;
        self.links.insert(a, (from, to, b));
        self.links.insert(b, (to, from, a));
        let host = format!("h{from}");
        let version = self.link_version(from, to);
        self.deliver_on(
            b,
            to,
            Input::Hello {
                link: b,
                peer: Peer::Daemon { rank: from, host },
                version,
                stopping,
            },
        );
        a
    }

    /// The protocol version a link between daemons `a` and `b` speaks.
    fn link_version(&self, a: Rank, b: Rank) -> u32 {
        self.versions[a as usize].min(self.versions[b as usize])
    }

    /// A frame `from` sends to `to` must be one a daemon of their link's version reads: a
    /// barrier's key, or what passed, only where both know keys.
    fn check_version(&mut self, from: Rank, to: Rank, frame: &Frame) {
        let version = self.link_version(from, to);
        let unreadable = match frame {
            Frame::Daemon(
                DaemonMsg::Interest { .. }
                | DaemonMsg::InterestSeen { .. }
                | DaemonMsg::InterestAgain,
            ) => version < EVENT_INTEREST,
            Frame::Daemon(DaemonMsg::ExecUp {
                req: ExecUp::Passed { .. },
            }) => version < BARRIER_KEYS,
            Frame::Daemon(DaemonMsg::ExecUp {
                req: ExecUp::Barrier { seq, .. },
            })
            | Frame::Daemon(DaemonMsg::ExecDown {
                msg: ExecDown::BarrierDone { seq, .. },
            }) => version < BARRIER_KEYS && barrier_count(*seq) > 0,
            _ => false,
        };
        if unreadable {
            self.violated(format!(
                "r{from} sent r{to} what protocol version {version} cannot read: {frame:?}"
            ));
        }
    }

    /// `from`'s connect up to `to` at `t`, superseding any still waiting.
    fn dial(&mut self, from: Rank, to: Rank, t: u64) {
        let d = &mut self.dials[from as usize];
        d.0 += 1;
        d.1 = Some((to, t));
        let attempt = d.0;
        self.at(t, Ev::Dial { from, to, attempt });
    }

    fn close(&mut self, link: LinkId) {
        if let Some((owner, peer, peer_link)) = self.links.remove(&link) {
            self.links.remove(&peer_link);
            self.pokes.remove(&link);
            self.pokes.remove(&peer_link);
            for (side, at) in [(peer_link, peer), (link, owner)] {
                // A dialer still waiting for its welcome sees a failed connect, as the real
                // shell does when the connection ends during the hello.
                let input = match self.pending.remove(&side) {
                    Some(rank) => Input::UplinkFailed {
                        rank,
                        reason: "closed during hello".into(),
                    },
                    None => Input::Closed { link: side },
                };
                self.deliver_on(side, at, input);
            }
        }
    }

    /// Runs every event up to time `end` (ms), checking the invariants after each.
    pub fn run_until(&mut self, end: u64) {
        while let Some(Reverse((t, seq, idx))) = self.queue.peek().copied() {
            if t > end {
                break;
            }
            self.queue.pop();
            self.now = t;
            if self.defer_if_stalled(seq, idx) {
                continue;
            }
            match self.events[idx].clone() {
                Ev::Boot(r) => {
                    // A daemon booted over a live one replaces it: its tools lose their
                    // connection as on a crash.
                    for t in self.tools.values_mut().filter(|t| t.at == r) {
                        t.closed = true;
                    }
                    self.alive[r as usize] = true;
                    self.life[r as usize] = self.now + 1;
                    self.running.retain(|(rank, _), _| *rank != r);
                    self.barriers.retain(|(rank, _), _| *rank != r);
                    // The simulator's clock is the same for every daemon (`mono` is the
                    // time since the run started), so start times are all zero: a daemon's
                    // epoch is then the time of its connection, as in the real shell.
                    let cfg = self.cfg[r as usize].clone();
                    let recovered = (r == 0).then(|| self.saved_jobs.clone());
                    let mut core =
                        DaemonCore::new(cfg, recovered, dvmlab_core::event::server::DEFAULT_RING);
                    core.set_start_hold(Duration::from_millis(START_HOLD_MS));
                    core.set_remove_hold(Duration::from_millis(REMOVE_HOLD_MS));
                    self.nodes.insert(r, core);
                    self.feed(r, Input::Start);
                }
                Ev::Submit {
                    at,
                    nprocs,
                    run_ms,
                    on,
                } => {
                    let hosts = on.map(|r| vec![format!("h{r}")]);
                    self.submit(at, nprocs, hosts, run_ms)
                }
                Ev::Shell { rank, life, input } => {
                    if self.alive[rank as usize] && self.life[rank as usize] == life {
                        // Gone with its processes, whether or not the daemon still knows
                        // the job (a stray's exit is reported to nobody).
                        if let ShellInput::ShellExited { id, .. } = &input {
                            self.running.remove(&(rank, *id));
                            self.barriers.remove(&(rank, *id));
                        }
                        if let ShellInput::ShellBarrier { id, .. } = &input {
                            if let Some(b) = self.barriers.get_mut(&(rank, *id)) {
                                b.0 += 1;
                            }
                        }
                        self.feed_core(rank, CoreInput::Shell(input));
                    }
                }
                Ev::Input(r, input) => self.feed(r, input),
                Ev::Timer { rank, life, timer } => {
                    if self.life[rank as usize] == life {
                        self.feed(rank, Input::Timer(timer));
                    }
                }
                Ev::Shrink { rank } => self.shrink(vec![format!("h{rank}")]),
                Ev::Core { rank, life, input } => {
                    if self.life[rank as usize] != life {
                        continue;
                    }
                    if let CoreInput::Shell(ShellInput::StartDue { id }) = &input {
                        if self.cancelled_holds.remove(&(rank, life, *id)) {
                            continue;
                        }
                    }
                    if let CoreInput::CampaignTimeout(id) = &input {
                        let open = self
                            .nodes
                            .get(&rank)
                            .is_some_and(|n| n.status().campaigns.iter().any(|c| c.id == *id));
                        if open {
                            self.campaign_timeouts.push((self.now, *id));
                        }
                    }
                    self.feed_core(rank, input);
                }
                Ev::Stall { rank, ms } => {
                    let until = &mut self.stalled_until[rank as usize];
                    *until = (*until).max(self.now + ms);
                }
                Ev::Crash { rank, fin } => {
                    if !self.alive[rank as usize] {
                        continue;
                    }
                    self.alive[rank as usize] = false;
                    self.nodes.remove(&rank);
                    for t in self.tools.values_mut().filter(|t| t.at == rank) {
                        t.closed = true;
                    }
                    if fin {
                        let mine: Vec<LinkId> = self
                            .links
                            .iter()
                            .filter(|(_, v)| v.0 == rank)
                            .map(|(k, _)| *k)
                            .collect();
                        for l in mine {
                            self.close(l);
                        }
                    }
                }
                Ev::HelloTimeout { link } => {
                    if self.pending.contains_key(&link) {
                        self.close(link);
                    }
                }
                Ev::Cut { seed } => {
                    let mut open: Vec<LinkId> = self.links.keys().copied().collect();
                    open.sort_unstable();
                    if !open.is_empty() {
                        self.close(open[seed % open.len()]);
                    }
                }
                Ev::Poke { from, to, stop } => {
                    // A stopping controller's shell makes its pokes before it exits.
                    let made = self.alive[from as usize] || (stop && self.exited[from as usize]);
                    if !made || !self.alive[to as usize] {
                        continue;
                    }
                    self.poked.push((self.now, from, to));
                    let a = self.hello_link(from, to, stop);
                    self.pokes.insert(a);
                }
                Ev::Dial { from, to, attempt } => {
                    if !self.alive[from as usize] || self.dials[from as usize].0 != attempt {
                        continue;
                    }
                    self.dials[from as usize].1 = None;
                    if self.alive[to as usize] {
                        let a = self.hello_link(from, to, false);
                        self.pending.insert(a, to);
                        self.at(self.now + 5000, Ev::HelloTimeout { link: a });
                    } else {
                        let t = self.now + self.lat();
                        self.at(
                            t,
                            Ev::Input(
                                from,
                                Input::UplinkFailed {
                                    rank: to,
                                    reason: "refused".into(),
                                },
                            ),
                        );
                    }
                }
            }
            self.check();
            if self.violation.is_some() {
                return;
            }
        }
        self.now = end;
    }
}

/// One simulated run with every tool on the controller; see [`scenario_with_relays`].
#[allow(clippy::too_many_arguments)]
pub fn scenario(
    n: u32,
    radix: u32,
    boots: Vec<u64>,
    latency: Vec<u64>,
    missing_seed: Option<u32>,
    crashes: Vec<(u64, u32, bool, u64)>,
    cuts: Vec<(u64, usize)>,
    jobs: Vec<(u64, Option<u32>, u64)>,
) -> Result<(), TestCaseError> {
    scenario_with_relays(
        n,
        radix,
        boots,
        latency,
        missing_seed,
        crashes,
        cuts,
        jobs,
        Vec::new(),
    )
}

/// One simulated run without frozen daemons; see [`scenario_with_freezes`].
#[allow(clippy::too_many_arguments)]
pub fn scenario_with_relays(
    n: u32,
    radix: u32,
    boots: Vec<u64>,
    latency: Vec<u64>,
    missing_seed: Option<u32>,
    crashes: Vec<(u64, u32, bool, u64)>,
    cuts: Vec<(u64, usize)>,
    jobs: Vec<(u64, Option<u32>, u64)>,
    relays: Vec<u32>,
) -> Result<(), TestCaseError> {
    scenario_with_freezes(
        n,
        radix,
        boots,
        latency,
        missing_seed,
        crashes,
        cuts,
        jobs,
        relays,
        Vec::new(),
        Vec::new(),
        MoreChaos::default(),
    )
}

/// What [`scenario_with_freezes`] may add to a run.
#[derive(Debug, Clone, Default)]
pub struct MoreChaos {
    /// See [`Sim::barrier_jobs`].
    pub barrier_jobs: bool,
    /// The controller crashes (time, with FIN, down for) and boots again from the live jobs
    /// it wrote out last, as prted does from its jobs file.
    pub controller_crashes: Vec<(u64, bool, u64)>,
    /// Rank seeds (each taken modulo the size) whose daemons speak the protocol version
    /// before the barrier keys, as daemons not yet upgraded do.
    pub older: Vec<u32>,
    /// Tools that register for events (time, rank seed) through the chaos. Once it is over,
    /// each one whose daemon ran throughout must have had its answer, and must hear the end
    /// of a job submitted then: its interest survived whatever re-homed its daemon.
    pub event_tools: Vec<(u64, u32)>,
}

/// One simulated run; see the properties in `tests/simulation.rs`. Job `i` is submitted by
/// a tool on rank `relays[i] % n` (its requests relayed through the tree), or on the
/// controller past the end of `relays`; it runs only on rank `pinned[i] % n` where that
/// says so. Each of `freezes` (time, rank seed, length) stops a daemon without killing it,
/// as SIGSTOP or a paused VM does: long enough, and its parent drops it as silent while its
/// jobs still run there. `more` adds barrier jobs, controller restarts and daemons of an
/// older protocol version.
#[allow(clippy::too_many_arguments)]
pub fn scenario_with_freezes(
    n: u32,
    radix: u32,
    boots: Vec<u64>,
    latency: Vec<u64>,
    missing_seed: Option<u32>,
    crashes: Vec<(u64, u32, bool, u64)>,
    cuts: Vec<(u64, usize)>,
    jobs: Vec<(u64, Option<u32>, u64)>,
    relays: Vec<u32>,
    freezes: Vec<(u64, u32, u64)>,
    pinned: Vec<Option<u32>>,
    more: MoreChaos,
) -> Result<(), TestCaseError> {
    let heal = Some(1000 * MS);
    let mut sim = Sim::new(n, radix, heal, latency);
    sim.barrier_jobs = more.barrier_jobs;
    for seed in more.older {
        sim.versions[(seed % n) as usize] = BARRIER_KEYS - 1;
    }
    for (t, fin, down) in more.controller_crashes {
        sim.at(t, Ev::Crash { rank: 0, fin });
        sim.at(t + down, Ev::Boot(0));
    }
    let mut event_tools = Vec::new();
    for (i, &(t, seed)) in more.event_tools.iter().enumerate() {
        let (rank, link) = (seed % n, EVENT_TOOLS + i as LinkId);
        let hello = Input::Hello {
            link,
            peer: Peer::Tool,
            version: dvmlab_proto::wire::VERSION,
            stopping: false,
        };
        sim.at(t, Ev::Input(rank, hello));
        let up = EventUp::Register {
            id: 1,
            codes: vec![],
            directives: Directives::default(),
        };
        sim.at(t, Ev::Input(rank, Input::Event { link, up }));
        event_tools.push((t, rank, link));
    }
    let tree = RadixTree::new(radix, n);
    // An interior rank that boots only after the rest has settled.
    let missing = missing_seed
        .map(|s| 1 + s % (n - 1))
        .filter(|&m| !tree.children(m).is_empty());
    for r in 0..n {
        if Some(r) != missing {
            sim.at(boots[r as usize], Ev::Boot(r));
        }
    }
    // Chaos during the first 25 s: crashes (each followed by a restart) and cut links.
    for (t, seed, fin, down) in crashes {
        let r = 1 + seed % (n - 1);
        if Some(r) == missing {
            continue;
        }
        let t = t.max(boots[r as usize] + 1);
        sim.at(t, Ev::Crash { rank: r, fin });
        sim.at(t + down, Ev::Boot(r));
    }
    for (t, seed) in cuts {
        sim.at(t, Ev::Cut { seed });
    }
    for (t, seed, ms) in freezes {
        sim.at(t, Ev::Stall { rank: seed % n, ms });
    }
    // Jobs arrive throughout the chaos.
    for (i, (t, nprocs, run_ms)) in jobs.into_iter().enumerate() {
        let at = relays.get(i).map_or(0, |r| r % n);
        let on = pinned.get(i).copied().flatten().map(|r| r % n);
        sim.at(
            t,
            Ev::Submit {
                at,
                nprocs,
                run_ms,
                on,
            },
        );
    }
    sim.run_until(60_000);
    answered_and_held_nowhere(&sim)?;
    // The chaos is over: the network calms down (no more spikes) while the DVM settles.
    for l in &mut sim.latency {
        *l = (*l).min(8);
    }
    let status = sim.nodes[&0].status();
    let joined: BTreeMap<Rank, MemberState> =
        status.members.iter().map(|m| (m.rank, m.state)).collect();
    for r in 0..n {
        let want = if Some(r) == missing {
            MemberState::Waiting
        } else {
            MemberState::Joined
        };
        prop_assert_eq!(joined[&r], want, "rank {} after 60 s: {:?}", r, status);
    }
    prop_assert_eq!(status.formed, missing.is_none());
    for m in &status.members {
        if let Some(p) = m.parent {
            prop_assert!(
                tree.ancestors(m.rank).contains(&p),
                "{:?} joined a non-ancestor",
                m
            );
        }
    }
    if let Some(m) = missing {
        sim.at(sim.now, Ev::Boot(m));
        sim.run_until(sim.now + 30_000);
        prop_assert!(
            sim.nodes[&0].node().formed(),
            "formed once the late rank boots: {:?}",
            sim.nodes[&0].status()
        );
    }
    // Every rank answers a ping routed through the tree: no route went stale.
    sim.tool_hello();
    for r in 0..n {
        sim.feed(
            0,
            Input::Tool {
                link: TOOL,
                req: ToolRequest::Ping { rank: r },
            },
        );
    }
    sim.run_until(sim.now + 10_000);
    let pongs: Vec<&ToolReply> = sim.tool_replies.iter().collect();
    prop_assert_eq!(pongs.len(), n as usize);
    for p in pongs {
        prop_assert!(matches!(p, ToolReply::Ping(r) if r.ok), "{:?}", p);
    }
    sim.tool_replies.clear();
    heard_by_event_tools(&mut sim, &event_tools)?;
    sim.stop_cleanly().map_err(TestCaseError::fail)
}

/// Every event tool (registered at time `t` on `rank`, on `link`) whose daemon was running
/// before it, never restarted since and never closed its connection had its registration
/// answered, and hears the end of a job submitted now, wherever the job runs.
fn heard_by_event_tools(sim: &mut Sim, tools: &[(u64, Rank, LinkId)]) -> Result<(), TestCaseError> {
    let live: Vec<(Rank, LinkId)> = tools
        .iter()
        .filter(|(t, r, l)| {
            sim.alive[*r as usize]
                && sim.life[*r as usize] < *t
                && !sim.event_tools_closed.contains(l)
        })
        .map(|(_, r, l)| (*r, *l))
        .collect();
    if live.is_empty() {
        return Ok(());
    }
    let job_ends = |sim: &Sim, link: LinkId| {
        sim.event_downs.get(&link).map_or(0, |d| {
            d.iter()
                .filter(
                    |d| matches!(d, EventDown::Deliver { event } if event.code == EVENT_JOB_END),
                )
                .count()
        })
    };
    let before: Vec<usize> = live.iter().map(|(_, l)| job_ends(sim, *l)).collect();
    sim.submit(0, Some(1), None, 10);
    sim.run_until(sim.now + 10_000);
    for ((rank, link), before) in live.iter().zip(before) {
        let answered = sim
            .event_downs
            .get(link)
            .is_some_and(|d| d.contains(&EventDown::Registered { id: 1 }));
        prop_assert!(
            answered,
            "the event tool on rank {} was never answered",
            rank
        );
        prop_assert!(
            job_ends(sim, *link) > before,
            "the event tool on rank {} did not hear a job end after its answer: {:?}",
            rank,
            sim.event_downs.get(link)
        );
    }
    Ok(())
}

/// No invariant broke. Every tool heard its job end exactly once (killed by a node failure
/// or not), was refused, or lost its connection with the daemon it was on (which said why,
/// if it lived): none is left waiting. No daemon still running holds a job or a job's data
/// (one that left took its own along).
fn answered_and_held_nowhere(sim: &Sim) -> Result<(), TestCaseError> {
    if let Some(v) = &sim.violation {
        return Err(TestCaseError::fail(v.clone()));
    }
    for (link, t) in &sim.tools {
        if t.closed {
            continue;
        }
        if t.id.is_some() {
            prop_assert_eq!(t.ended, 1, "tool {}: {:?}", link, t);
        } else {
            prop_assert!(t.refused.is_some(), "tool {}: no answer: {:?}", link, t);
        }
    }
    for (r, c) in sim.nodes.iter().filter(|(r, _)| sim.alive[**r as usize]) {
        let left: Vec<JobId> = c.jobs().map(|(id, _)| id).collect();
        prop_assert!(left.is_empty(), "rank {} still holds jobs {:?}", r, left);
        let data: Vec<JobId> = c.job_data().collect();
        prop_assert!(
            data.is_empty(),
            "rank {} still holds data of jobs {:?}",
            r,
            data
        );
    }
    Ok(())
}

/// One simulated elastic run: `n` daemons form, the controller turns elastic, and from 3 s
/// on jobs arrive (`(time, nprocs, run ms, pinned to this rank's host)`) while daemons are
/// shrunk away (`(time, rank)`, never the last daemon that runs jobs); no job is pinned to
/// a rank being shrunk (it would end unplaced once that host left, as it should). A shrink
/// takes only ranks that run no job, and jobs submitted meanwhile wait for it: no job may
/// fail, no shrink is cut off at its timeout, every tool hears its job end once, no daemon
/// still holds a job, every shrunk daemon has left, and the rest are joined. With `release`, a finished shrink goes
/// through one release component before its fence opens.
pub fn scenario_with_shrinks(
    n: u32,
    radix: u32,
    latency: Vec<u64>,
    jobs: Vec<(u64, Option<u32>, u64, Option<u32>)>,
    shrinks: Vec<(u64, u32)>,
    release: bool,
) -> Result<(), TestCaseError> {
    let mut sim = Sim::formed_with(n, radix, latency);
    let components = if release { vec!["sim".into()] } else { vec![] };
    sim.make_elastic(components);
    sim.tool_hello();
    let mut targets = BTreeSet::new();
    for (t, seed) in shrinks {
        let rank = 1 + seed % (n - 1);
        // One daemon that runs jobs stays, or a job could run nowhere (and fail, rightly).
        if !targets.contains(&rank) && targets.len() + 1 >= (n - 1) as usize {
            continue;
        }
        targets.insert(rank);
        sim.at(3_000 + t, Ev::Shrink { rank });
    }
    for (t, nprocs, run_ms, on) in jobs {
        // The controller runs no jobs.
        let on = on.map(|r| 1 + r % (n - 1)).filter(|r| !targets.contains(r));
        sim.at(
            3_000 + t,
            Ev::Submit {
                at: 0,
                nprocs,
                run_ms,
                on,
            },
        );
    }
    sim.run_until(60_000);
    // Every shrink ends on its targets' departures, none cut off at its timeout.
    prop_assert!(
        sim.campaign_timeouts.is_empty(),
        "shrinks timed out (at ms, campaign): {:?}",
        sim.campaign_timeouts
    );
    answered_and_held_nowhere(&sim)?;
    for (link, t) in sim.tools.iter().filter(|(_, t)| t.ended > 0) {
        prop_assert!(
            t.exception.is_none() && t.status == Some(0),
            "tool {}: its job failed: {:?}",
            link,
            t
        );
    }
    let status = sim.nodes[&0].status();
    prop_assert!(status.campaigns.is_empty(), "{:?}", status);
    for m in &status.members {
        if m.state == MemberState::Departed {
            prop_assert!(
                sim.exited[m.rank as usize],
                "rank {} departed, still runs",
                m.rank
            );
        } else {
            prop_assert_eq!(m.state, MemberState::Joined, "{:?}", status);
        }
    }
    Ok(())
}
