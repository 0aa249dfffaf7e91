//! The simulator: many whole daemons (`DaemonCore`: overlay, job-exec and job manager) wired
//! by an in-memory network with random boot times, random per-message latency (FIFO per link,
//! like TCP), parents that boot late, crashes with and without FIN, restarts and cut links;
//! tools submit jobs throughout and simulated job shells run them. Invariants are checked
//! after every step (and the cores `debug_assert!` their own after every input), not only
//! at the end. No sockets, no clocks: every run is reproducible from the proptest seed, and
//! every minimal failing case found is kept below as a named test.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use dvmlab_runtime::contract::MemberState;
use dvmlab_runtime::daemon_core::{DaemonCore, Input as CoreInput, Now, Output, Timer};
use dvmlab_runtime::identity::{Identity, Role};
use dvmlab_runtime::jobexec::{Input as ShellInput, JobId, ShellCommand};
use dvmlab_runtime::node::{Input, Io, LinkId, NodeConfig};
use dvmlab_runtime::placement::MapBy;
use dvmlab_runtime::roster::Roster;
use dvmlab_runtime::tree::{RadixTree, Rank};
use dvmlab_runtime::uplink::Policy;
use dvmlab_runtime::wire::{DaemonMsg, Frame, Peer, Submit, ToolReply, ToolRequest};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

const MS: u64 = 1;
const TOOL: LinkId = u64::MAX;
/// Tools submitting jobs have links from here up, one each.
const JOB_TOOLS: LinkId = 1 << 62;

#[derive(Debug, Clone)]
enum Ev {
    Boot(Rank),
    Input(Rank, Input),
    /// `from` tries to connect to `to`.
    Dial {
        from: Rank,
        to: Rank,
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
    /// A tool connects to the controller and submits a job of `nprocs` processes that each
    /// run `run_ms`.
    Submit {
        nprocs: Option<u32>,
        run_ms: u64,
    },
    /// A job shell's event, from the shell of incarnation `life` of `rank` (dropped if that
    /// daemon has died since).
    Shell {
        rank: Rank,
        life: u64,
        input: ShellInput,
    },
}

/// A job as the tool that submitted it saw it.
#[derive(Debug, Default)]
struct ToolView {
    id: Option<JobId>,
    refused: Option<String>,
    ended: u32,
    run_ms: u64,
}

struct Sim {
    nodes: BTreeMap<Rank, DaemonCore>,
    alive: Vec<bool>,
    cfg: Vec<NodeConfig>,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Ev>,
    seq: u64,
    now: u64,
    /// link id → (owner, peer rank, peer's link id)
    links: BTreeMap<LinkId, (Rank, Rank, LinkId)>,
    next_link: LinkId,
    /// Dialer's link → the rank it dialed, until the welcome (or refusal) arrives.
    pending: BTreeMap<LinkId, Rank>,
    /// per link: time of the last delivery, to keep each link FIFO
    last: BTreeMap<LinkId, u64>,
    latency: Vec<u64>,
    lat_i: usize,
    tool_replies: Vec<ToolReply>,
    exited: Vec<bool>,
    /// Each rank's incarnation (its boot time), so a dead daemon's shells fall silent.
    life: Vec<u64>,
    tools: BTreeMap<LinkId, ToolView>,
    /// (rank, incarnation, job): every launch, to catch a job started twice on one daemon.
    launched: BTreeSet<(Rank, u64, JobId)>,
    /// Job → its ranks, as the controller placed it.
    placed: BTreeMap<JobId, BTreeSet<Rank>>,
    /// Shells running now: (rank, job) → the incarnation running it.
    running: BTreeMap<(Rank, JobId), u64>,
    /// The first invariant broken, with the time.
    violation: Option<String>,
    /// The largest frame any daemon sent, when measured (it costs an encoding per send).
    largest_frame: Option<usize>,
}

impl Sim {
    fn new(n: u32, radix: u32, heal: Option<u64>, latency: Vec<u64>) -> Sim {
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
            placed: BTreeMap::new(),
            running: BTreeMap::new(),
            violation: None,
            largest_frame: None,
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
            if s.joined != wired || s.formed != (wired == s.expected) {
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

    fn at(&mut self, t: u64, ev: Ev) {
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

    fn feed(&mut self, r: Rank, input: Input) {
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

    /// A job reply to a submitting tool.
    fn tool_reply(&mut self, link: LinkId, reply: ToolReply) {
        let placed = match &reply {
            ToolReply::Submitted { id, placement } => Some((*id, placement.ranks())),
            _ => None,
        };
        let wired = self
            .nodes
            .get(&0)
            .map(|c| c.node().roster().compute_ranks())
            .unwrap_or_default();
        let Some(t) = self.tools.get_mut(&link) else {
            return;
        };
        match reply {
            ToolReply::Submitted { id, .. } => t.id = Some(id),
            ToolReply::Error { message } => t.refused = Some(message),
            ToolReply::JobEnded { .. } => t.ended += 1,
            _ => {}
        }
        if let Some((id, ranks)) = placed {
            let ranks: BTreeSet<Rank> = ranks.iter().collect();
            if let Some(r) = ranks.iter().find(|r| !wired.contains(r)) {
                self.violated(format!(
                    "job {id} placed on rank {r}, which is not wired in"
                ));
            }
            self.placed.insert(id, ranks);
        }
    }

    /// A simulated job shell: it starts, runs, exits (early and killed on a signal), and
    /// its epilog finishes; each step an input from that daemon's incarnation.
    fn shell_at(&mut self, t: u64, rank: Rank, input: ShellInput) {
        let life = self.life[rank as usize];
        self.at(t, Ev::Shell { rank, life, input });
    }

    fn apply(&mut self, r: Rank, o: Output) {
        match o {
            Output::Net(Io::Connect { rank, delay }) => {
                let t = self.now + delay.as_millis() as u64;
                self.at(t, Ev::Dial { from: r, to: rank });
            }
            Output::Net(Io::Send { link, frame }) if link == TOOL => {
                if let Frame::ToolReply(rep) = frame {
                    self.tool_replies.push(rep);
                }
            }
            Output::Net(Io::Send { link, frame }) if link >= JOB_TOOLS => {
                if let Frame::ToolReply(rep) = frame {
                    self.tool_reply(link, rep);
                }
            }
            Output::Net(Io::Send { link, frame }) => {
                if let Some(largest) = self.largest_frame.as_mut() {
                    let len =
                        dvmlab_runtime::wire::encode_frame(&frame).map_or(usize::MAX, |b| b.len());
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
                if let Ok(t) = std::env::var("DVMLAB_SIM_TRACE") {
                    match &frame {
                        Frame::Daemon(m @ DaemonMsg::Routed { .. }) => {
                            eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now)
                        }
                        Frame::Daemon(
                            m @ (DaemonMsg::ExecUp { .. } | DaemonMsg::ExecDown { .. }),
                        ) if t == "exec" => {
                            eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now)
                        }
                        _ => {}
                    }
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
            Output::Net(Io::Close { link }) => self.close(link),
            Output::SetTimer {
                timer: Timer::Net(timer),
                delay,
            } => {
                let t = self.now + delay.as_millis() as u64;
                self.at(t, Ev::Input(r, Input::Timer(timer)));
            }
            Output::SetTimer {
                timer: Timer::JobLimit(_),
                ..
            } => {}
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
                let run_ms = self
                    .tools
                    .values()
                    .find(|t| t.id == Some(id))
                    .map_or(50, |t| t.run_ms);
                let t = self.now + 1 + self.lat();
                self.shell_at(t, r, ShellInput::ShellStarted { id });
                self.shell_at(t + run_ms, r, ShellInput::ShellExited { id, status: 0 });
            }
            Output::Shell(ShellCommand::Kill { id, signal }) => {
                if self.running.contains_key(&(r, id)) {
                    let t = self.now + 1;
                    self.shell_at(t, r, ShellInput::ShellExited { id, status: signal });
                }
            }
            Output::Shell(ShellCommand::Epilog { id }) => {
                self.running.remove(&(r, id));
                let t = self.now + 1 + self.lat();
                self.shell_at(t, r, ShellInput::EpilogDone { id });
            }
            Output::Shell(ShellCommand::BarrierDone { .. }) | Output::Persist(_) => {}
            Output::Log(l) => {
                if std::env::var("DVMLAB_SIM_TRACE").is_ok() {
                    eprintln!("{:>6} ms r{r}: {l}", self.now);
                }
            }
            Output::Net(Io::Note(note)) => {
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

    fn close(&mut self, link: LinkId) {
        if let Some((owner, peer, peer_link)) = self.links.remove(&link) {
            self.links.remove(&peer_link);
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

    fn run_until(&mut self, end: u64) {
        while let Some(Reverse((t, _, idx))) = self.queue.peek().copied() {
            if t > end {
                break;
            }
            self.queue.pop();
            self.now = t;
            match self.events[idx].clone() {
                Ev::Boot(r) => {
                    self.alive[r as usize] = true;
                    self.life[r as usize] = self.now + 1;
                    self.running.retain(|(rank, _), _| *rank != r);
                    let mut cfg = self.cfg[r as usize].clone();
                    cfg.incarnation = self.now * 1000;
                    let recovered = (r == 0).then(Vec::new);
                    self.nodes.insert(r, DaemonCore::new(cfg, recovered));
                    self.feed(r, Input::Start);
                }
                Ev::Submit { nprocs, run_ms } => {
                    let link = JOB_TOOLS + self.tools.len() as LinkId;
                    // A tool cannot connect to a controller that is not running.
                    let refused = (!self.alive[0]).then(|| "no controller".to_string());
                    self.tools.insert(
                        link,
                        ToolView {
                            run_ms,
                            refused,
                            ..ToolView::default()
                        },
                    );
                    let hello = Input::Hello {
                        link,
                        peer: Peer::Tool,
                        version: dvmlab_runtime::wire::VERSION,
                    };
                    self.feed(0, hello);
                    let job = Submit {
                        argv: vec!["true".into()],
                        env: vec![],
                        cwd: None,
                        nprocs,
                        map_by: MapBy::Node,
                        hosts: None,
                        time_limit_ms: None,
                        userid: 1000,
                    };
                    let req = ToolRequest::Submit { job };
                    self.feed(0, Input::Tool { link, req });
                }
                Ev::Shell { rank, life, input } => {
                    if self.alive[rank as usize] && self.life[rank as usize] == life {
                        self.feed_core(rank, CoreInput::Shell(input));
                    }
                }
                Ev::Input(r, input) => self.feed(r, input),
                Ev::Crash { rank, fin } => {
                    if !self.alive[rank as usize] {
                        continue;
                    }
                    self.alive[rank as usize] = false;
                    self.nodes.remove(&rank);
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
                Ev::Dial { from, to } => {
                    if !self.alive[from as usize] {
                        continue;
                    }
                    if self.alive[to as usize] {
                        let (a, b) = (self.next_link, self.next_link + 1);
                        self.next_link += 2;
                        self.links.insert(a, (from, to, b));
                        self.links.insert(b, (to, from, a));
                        self.pending.insert(a, to);
                        self.at(self.now + 5000, Ev::HelloTimeout { link: a });
                        let host = format!("h{from}");
                        self.deliver_on(
                            b,
                            to,
                            Input::Hello {
                                link: b,
                                peer: Peer::Daemon { rank: from, host },
                                version: dvmlab_runtime::wire::VERSION,
                            },
                        );
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

/// One simulated run; see the property below.
#[allow(clippy::too_many_arguments)]
fn scenario(
    n: u32,
    radix: u32,
    boots: Vec<u64>,
    latency: Vec<u64>,
    missing_seed: Option<u32>,
    crashes: Vec<(u64, u32, bool, u64)>,
    cuts: Vec<(u64, usize)>,
    jobs: Vec<(u64, Option<u32>, u64)>,
) -> Result<(), TestCaseError> {
    let heal = Some(1000 * MS);
    let mut sim = Sim::new(n, radix, heal, latency);
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
    // Jobs arrive throughout the chaos.
    for (t, nprocs, run_ms) in jobs {
        sim.at(t, Ev::Submit { nprocs, run_ms });
    }
    sim.run_until(60_000);
    if let Some(v) = &sim.violation {
        return Err(TestCaseError::fail(v.clone()));
    }
    // Every job accepted ended exactly once (killed by a node failure or not), and no
    // daemon still holds a job.
    for (link, t) in &sim.tools {
        if t.id.is_some() {
            prop_assert_eq!(t.ended, 1, "tool {}: {:?}", link, t);
        } else {
            prop_assert!(t.refused.is_some(), "tool {}: no answer: {:?}", link, t);
        }
    }
    for (r, c) in &sim.nodes {
        let left: Vec<JobId> = c.jobs().map(|(id, _)| id).collect();
        prop_assert!(left.is_empty(), "rank {} still holds jobs {:?}", r, left);
    }
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
    sim.feed(
        0,
        Input::Hello {
            link: TOOL,
            peer: Peer::Tool,
            version: dvmlab_runtime::wire::VERSION,
        },
    );
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
    // A tool stops the DVM: every daemon exits and the tool hears it.
    sim.feed(
        0,
        Input::Tool {
            link: TOOL,
            req: ToolRequest::Stop,
        },
    );
    sim.run_until(sim.now + 20_000);
    prop_assert!(
        sim.exited.iter().all(|&e| e),
        "all exited: {:?}",
        sim.exited
    );
    prop_assert!(
        matches!(sim.tool_replies.last(), Some(ToolReply::Stopped { unconfirmed }) if unconfirmed.is_empty()),
        "{:?}",
        sim.tool_replies
    );
    Ok(())
}

/// The runs are seeded: CI replays the same 48 every time (`DVMLAB_SIM_SEED` picks other
/// ones, `DVMLAB_SIM_SEED=random` new ones each run; `PROPTEST_CASES` sets how many).
fn sim_config() -> ProptestConfig {
    let rng_seed = match std::env::var("DVMLAB_SIM_SEED").as_deref() {
        Ok("random") => RngSeed::Random,
        Ok(s) => RngSeed::Fixed(
            s.parse()
                .unwrap_or_else(|_| panic!("DVMLAB_SIM_SEED={s}: a number, or random")),
        ),
        Err(_) => RngSeed::Fixed(0x5eed_d1ab),
    };
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(48),
        rng_seed,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(sim_config())]
    #[test]
    fn any_boot_order_and_interleaving_forms_the_dvm_and_stops_cleanly(
        n in 2u32..60,
        radix in 2u32..5,
        boots in proptest::collection::vec(0u64..3000, 60),
        // Mostly LAN-fast, with up to two spikes in every 16 messages that let messages on an
        // old path arrive after the new path's. Spikes stay below the 3 s liveness window (a
        // failure detector flaps when latency exceeds its timeout, by design).
        base_latency in proptest::collection::vec(0u64..8, 16),
        spikes in proptest::collection::vec((0usize..16, 100u64..1000), 0..3),
        missing_seed in proptest::option::of(1u32..60),
        crashes in proptest::collection::vec((0u64..20_000, 1u32..60, any::<bool>(), 0u64..5000), 0..4),
        cuts in proptest::collection::vec((0u64..20_000, any::<usize>()), 0..4),
        jobs in proptest::collection::vec(
            (0u64..25_000, proptest::option::of(1u32..130), 0u64..3000),
            0..12,
        ),
    ) {
        let mut latency = base_latency;
        for (at, ms) in spikes {
            latency[at] = ms;
        }
        scenario(n, radix, boots, latency, missing_seed, crashes, cuts, jobs)?;
    }
}

/// Two crashes and three cuts that catch daemons on healed links, shared by two cases.
const HEALED_CRASHES: [(u64, u32, bool, u64); 2] =
    [(9733, 36, true, 2892), (19012, 59, true, 2217)];
const HEALED_CUTS: [(u64, usize); 3] = [
    (11029, 13141958739819678014),
    (13604, 15270424765997675796),
    (9779, 2849009184813696863),
];

#[test]
fn a_daemon_whose_parent_never_boots_rejoins_after_its_healed_link_is_cut() {
    let mut boots = vec![0u64; 60];
    boots[3] = 338;
    scenario(
        5,
        2,
        boots,
        vec![4, 999, 1, 1, 2],
        Some(44),
        HEALED_CRASHES.to_vec(),
        HEALED_CUTS.to_vec(),
        vec![],
    )
    .unwrap();
}

#[test]
fn routes_survive_a_crashed_interior_daemon_whose_old_reports_arrive_late() {
    let boots = vec![
        1886, 2200, 1617, 1581, 1641, 2396, 2976, 306, 2037, 324, 447, 2858, 1094, 1850, 2937, 697,
        213, 2119, 1788, 2007, 835, 442, 1, 1793, 2821, 2919, 1192, 2566, 1233, 65, 1443, 518, 600,
        2976, 604, 2542, 35, 550, 1786, 475, 2937, 206, 753, 2305, 2033, 1674, 1130, 2594, 174,
        1272, 853, 1936, 986, 303, 139, 2613, 1181, 872, 2761, 257,
    ];
    scenario(
        36,
        2,
        boots,
        vec![4, 783, 1, 1, 2],
        Some(44),
        HEALED_CRASHES.to_vec(),
        HEALED_CUTS.to_vec(),
        vec![],
    )
    .unwrap();
}

#[test]
fn a_daemon_that_died_silently_and_restarted_rejoins() {
    let mut boots = vec![0u64; 60];
    boots[..10].copy_from_slice(&[2223, 588, 950, 588, 2078, 105, 271, 145, 1659, 1659]);
    let mut latency = vec![0u64; 16];
    latency[9] = 375;
    scenario(
        10,
        4,
        boots,
        latency,
        None,
        vec![
            (9050, 40, false, 1248),
            (4242, 27, true, 1722),
            (572, 1, false, 0),
        ],
        vec![],
        vec![],
    )
    .unwrap();
}

#[test]
fn routes_stay_right_through_silent_crashes_and_cuts_during_formation() {
    let mut boots = vec![0u64; 60];
    boots[..50].copy_from_slice(&[
        23, 1558, 1714, 346, 672, 1771, 1936, 925, 1431, 297, 0, 251, 256, 1146, 2210, 1906, 519,
        705, 945, 1739, 888, 1456, 49, 1680, 377, 2328, 2076, 511, 1379, 1870, 2252, 2204, 1950,
        460, 2804, 979, 1280, 183, 61, 771, 1670, 251, 716, 1125, 529, 1019, 646, 239, 1895, 339,
    ]);
    let mut latency = vec![7, 0, 1, 1, 3, 2, 1, 4, 2, 1, 0, 0, 0, 1, 0, 2];
    latency[1] = 651;
    latency[10] = 887;
    scenario(
        50,
        2,
        boots,
        latency,
        Some(26),
        vec![
            (12252, 46, false, 2059),
            (1293, 15, false, 1687),
            (16573, 31, false, 2400),
        ],
        vec![
            (2812, 6818756974612832976),
            (2692, 8594656611379197958),
            (3279, 9105750351124898464),
        ],
        vec![],
    )
    .unwrap();
}

#[test]
fn a_connect_to_a_parent_that_dies_before_welcoming_times_out_and_retries() {
    let mut boots = vec![0u64; 60];
    boots[..58].copy_from_slice(&[
        125, 1125, 829, 1125, 1125, 458, 1125, 1125, 501, 396, 1125, 1125, 1125, 1125, 1125, 122,
        1125, 1125, 458, 1125, 1125, 1125, 1125, 986, 1125, 1125, 1125, 579, 302, 1125, 209, 430,
        1125, 818, 152, 818, 1125, 1125, 1125, 918, 153, 1125, 1125, 1125, 769, 984, 984, 984, 984,
        984, 0, 984, 984, 304, 396, 42, 984, 67,
    ]);
    let mut latency = vec![4, 0, 4, 1, 1, 1, 7, 1, 1, 2, 7, 0, 1, 6, 3, 6];
    latency[5] = 647;
    scenario(
        58,
        3,
        boots,
        latency,
        None,
        vec![(985, 2, false, 6)],
        vec![],
        vec![],
    )
    .unwrap();
}

#[test]
fn a_job_on_a_daemon_that_rejoins_mid_job_is_released_everywhere() {
    let boots = vec![
        243, 743, 2510, 356, 2182, 636, 1450, 1170, 232, 551, 1536, 1620, 910, 1546, 281, 39, 2794,
        2636, 1199, 1770, 1591, 964, 92, 2243, 96, 1479, 1942, 1029, 834, 232, 924, 2616, 2100,
        117, 202, 906, 613, 2146, 856, 1345, 888, 1028, 2615, 1257, 401, 693, 1981, 2230, 203, 945,
        2028, 305, 1648, 1959, 2736, 496, 353, 1178, 2357, 1145,
    ];
    let mut latency = vec![7, 6, 3, 2, 4, 3, 4, 5, 5, 2, 6, 4, 1, 7, 4, 6];
    latency[14] = 974;
    scenario(
        32,
        2,
        boots,
        latency,
        None,
        vec![(2635, 6, true, 1446), (7130, 44, false, 128)],
        vec![(12493, 7795190170821894763), (14822, 12196764214323569446)],
        vec![
            (20101, None, 1391),
            (22081, None, 481),
            (13789, None, 1322),
            (10261, Some(36), 1922),
            (8578, Some(15), 199),
            (11368, None, 409),
            (19383, Some(46), 2669),
            (18655, Some(109), 2015),
            (24991, None, 2013),
            (21378, None, 2939),
            (7132, Some(39), 1796),
        ],
    )
    .unwrap();
}

#[test]
fn a_job_placed_on_a_silently_dead_daemon_ends_once_its_loss_is_seen() {
    let mut boots = vec![0u64; 60];
    boots[3] = 2505;
    scenario(
        8,
        2,
        boots,
        vec![5, 2, 1, 6, 3, 0, 6, 1, 3, 1, 7, 7, 3, 0, 4, 2],
        None,
        vec![(13028, 51, true, 2057), (14155, 48, false, 3728)],
        vec![
            (15713, 13720780217998725468),
            (2592, 14175541926777715385),
            (3457, 9582208276037329591),
        ],
        vec![
            (24797, Some(15), 1181),
            (18089, None, 2984),
            (15201, Some(63), 1387),
            (17803, None, 2211),
            (11207, Some(32), 2445),
            (16362, None, 19),
            (15171, None, 478),
            (14730, None, 532),
            (12685, Some(54), 609),
            (2645, Some(81), 1041),
        ],
    )
    .unwrap();
}

#[test]
fn a_job_is_never_started_twice_on_a_daemon_whose_link_was_cut() {
    let mut boots = vec![0u64; 60];
    boots[..35].copy_from_slice(&[
        694, 2515, 2485, 1948, 482, 36, 2315, 1363, 1027, 1177, 529, 267, 2189, 655, 25, 1545, 511,
        730, 1695, 479, 1520, 2189, 1775, 499, 1573, 2149, 190, 1421, 841, 2128, 1530, 648, 2741,
        1293, 1635,
    ]);
    let mut latency = vec![0, 0, 0, 0, 4, 6, 4, 2, 1, 5, 4, 4, 3, 1, 4, 4];
    latency[1] = 454;
    latency[0] = 878;
    scenario(
        35,
        2,
        boots,
        latency,
        None,
        vec![(1059, 56, false, 4170)],
        vec![(16587, 8218364987443450558), (5230, 12953738735973004207)],
        vec![
            (4312, None, 1253),
            (14277, None, 1036),
            (16316, None, 88),
            (5790, None, 571),
        ],
    )
    .unwrap();
}

#[test]
fn a_job_ends_when_a_link_is_cut_while_its_start_travels() {
    let boots = vec![
        694, 2515, 2485, 1965, 966, 32, 2318, 1365, 1055, 2464, 564, 274, 2496, 678, 21, 2028, 511,
        745, 2286, 480, 1544, 2234, 2916, 510, 2148, 2178, 225, 1441, 904, 2897, 1547, 653, 2749,
        1293, 1647, 1568, 2393, 2378, 2813, 1828, 2460, 809, 677, 1282, 624, 1982, 792, 2288, 2747,
        891, 2494, 2750, 690, 1096, 78, 2977, 1780, 2494, 1345, 2928,
    ];
    let mut latency = vec![2, 3, 0, 0, 4, 6, 4, 2, 1, 5, 4, 4, 3, 1, 4, 4];
    latency[1] = 454;
    latency[0] = 879;
    scenario(
        35,
        2,
        boots,
        latency,
        None,
        vec![(1295, 56, false, 4170)],
        vec![(16608, 16442625998044824910), (11531, 15944897248841350186)],
        vec![
            (21925, None, 740),
            (11127, None, 774),
            (11527, Some(24), 1663),
            (13820, None, 1441),
            (18224, None, 599),
            (14418, Some(56), 1139),
            (16584, None, 2506),
            (7891, None, 2715),
        ],
    )
    .unwrap();
}

#[test]
fn a_job_ends_when_links_are_cut_under_it() {
    let boots = vec![
        1380, 2466, 2599, 493, 2280, 1335, 2668, 287, 894, 1434, 1032, 2267, 2711, 9, 174, 883,
        1120, 1153, 2739, 14, 85, 43, 1886, 1058, 952, 2412, 2448, 2496, 314, 867, 532, 1015, 223,
        301, 2147, 2001, 2682, 1912, 245, 207, 847, 1857, 1123, 2494, 422, 454, 1409, 1677, 1522,
        2781, 2542, 2771, 2883, 2657, 2078, 1995, 816, 1531, 67, 2075,
    ];
    let mut latency = vec![4, 5, 2, 5, 6, 2, 4, 4, 5, 5, 0, 3, 2, 6, 0, 3];
    latency[2] = 448;
    latency[6] = 312;
    scenario(
        57,
        2,
        boots,
        latency,
        None,
        vec![],
        vec![
            (11871, 8209040154531536708),
            (18743, 1382576625823768025),
            (10907, 3568967469928974407),
        ],
        vec![
            (8079, None, 2237),
            (24718, Some(58), 181),
            (10009, None, 2593),
            (13526, None, 779),
            (8768, None, 554),
            (12846, None, 2742),
            (12206, None, 176),
            (6547, None, 1715),
            (1831, Some(76), 1861),
            (9005, Some(115), 1218),
            (18042, None, 1970),
        ],
    )
    .unwrap();
}

#[test]
fn a_hundred_thousand_processes_on_128_nodes_travel_in_small_frames() {
    let mut sim = Sim::new(129, 2, None, vec![1]);
    sim.largest_frame = Some(0);
    for r in 0..129 {
        sim.at(0, Ev::Boot(r));
    }
    sim.at(
        5_000,
        Ev::Submit {
            nprocs: Some(100_000),
            run_ms: 100,
        },
    );
    sim.run_until(20_000);
    assert_eq!(sim.violation, None);
    let tool = sim.tools.values().next().unwrap();
    assert_eq!((tool.id, tool.ended), (Some(1), 1), "{tool:?}");
    let largest = sim.largest_frame.unwrap();
    assert!(
        largest < 4096,
        "the largest frame was {largest} bytes: a frame grew with the job"
    );
}

#[test]
fn a_job_ends_when_two_daemons_below_it_crash_and_return() {
    let mut boots = vec![0u64; 60];
    boots[..44].copy_from_slice(&[
        448, 2233, 963, 625, 1378, 936, 2890, 2997, 1822, 1373, 11, 996, 2556, 199, 2897, 758,
        1907, 1791, 1263, 2399, 893, 1459, 350, 1828, 1503, 2000, 829, 132, 1467, 2556, 1791, 392,
        1296, 1305, 2123, 2307, 963, 1694, 2822, 734, 23, 952, 2504, 2171,
    ]);
    let mut latency = vec![7, 3, 6, 4, 0, 6, 7, 4, 2, 7, 0, 5, 1, 4, 3, 5];
    latency[10] = 607;
    scenario(
        44,
        4,
        boots,
        latency,
        None,
        vec![(9407, 32, false, 1568), (9380, 8, true, 1087)],
        vec![],
        vec![(8351, None, 1931), (7802, Some(27), 1704)],
    )
    .unwrap();
}
