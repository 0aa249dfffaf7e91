//! The daemon core, simulated: many `Node`s wired by an in-memory network with random boot
//! times, random per-message latency (FIFO per link, like TCP) and parents that never boot.
//! No sockets, no clocks: every interleaving is reproducible from the proptest seed.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use dvmlab_runtime::contract::MemberState;
use dvmlab_runtime::identity::{Identity, Role};
use dvmlab_runtime::node::{Input, LinkId, Node, NodeConfig, Output};
use dvmlab_runtime::tree::{RadixTree, Rank};
use dvmlab_runtime::uplink::Policy;
use dvmlab_runtime::wire::{DaemonMsg, Frame, Peer, ToolReply, ToolRequest};
use proptest::prelude::*;

const MS: u64 = 1;
const TOOL: LinkId = u64::MAX;

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
}

struct Sim {
    nodes: BTreeMap<Rank, Node>,
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
                hosts: hosts.clone(),
                tree,
                policy: Policy {
                    initial: Duration::from_millis(20),
                    max: Duration::from_millis(2000),
                    heal_after: heal.map(Duration::from_millis),
                },
                heartbeat: Duration::from_millis(1000),
                incarnation: 0,
                controller_listed: false,
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
        if !self.alive[r as usize] {
            return;
        }
        let Some(node) = self.nodes.get_mut(&r) else {
            return;
        };
        let outs = node.handle(Duration::from_millis(self.now), input);
        for o in outs {
            self.apply(r, o);
        }
    }

    fn apply(&mut self, r: Rank, o: Output) {
        match o {
            Output::Connect { rank, delay } => {
                let t = self.now + delay.as_millis() as u64;
                self.at(t, Ev::Dial { from: r, to: rank });
            }
            Output::Send { link, frame } if link == TOOL => {
                if let Frame::ToolReply(rep) = frame {
                    self.tool_replies.push(rep);
                }
            }
            Output::Send { link, frame } => {
                let Some(&(_, peer, peer_link)) = self.links.get(&link) else {
                    if std::env::var("DVMLAB_SIM_TRACE").is_ok() {
                        eprintln!(
                            "{:>6} ms r{r}: send on closed link {link}: {frame:?}",
                            self.now
                        );
                    }
                    return;
                };
                if std::env::var("DVMLAB_SIM_TRACE").is_ok() {
                    if let Frame::Daemon(m @ DaemonMsg::Routed { .. }) = &frame {
                        eprintln!("{:>6} ms r{r} -> r{peer} (link {link}): {m:?}", self.now);
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
            Output::Close { link } => self.close(link),
            Output::SetTimer { timer, delay } => {
                let t = self.now + delay.as_millis() as u64;
                self.at(t, Ev::Input(r, Input::Timer(timer)));
            }
            Output::Note(note) => {
                if std::env::var("DVMLAB_SIM_TRACE").is_ok_and(|t| t == "all" || t == r.to_string())
                {
                    eprintln!("{:>6} ms r{r}: {note:?}", self.now);
                }
            }
            // No jobs in this simulation: the job-exec module's inputs go nowhere.
            Output::Exec(_) | Output::JobTool { .. } => {}
            Output::Exit => {
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
                    let mut cfg = self.cfg[r as usize].clone();
                    cfg.incarnation = self.now * 1000;
                    self.nodes.insert(r, Node::new(cfg));
                    self.feed(r, Input::Start);
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
    sim.run_until(60_000);
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
            sim.nodes[&0].formed(),
            "formed once the late rank boots: {:?}",
            sim.nodes[&0].status()
        );
    }
    // Every rank answers a ping routed through the tree: no route went stale.
    sim.nodes.get_mut(&0).map(|c| {
        c.handle(
            Duration::from_millis(sim.now),
            Input::Hello {
                link: TOOL,
                peer: Peer::Tool,
                version: dvmlab_runtime::wire::VERSION,
            },
        )
    });
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
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
    ) {
        let mut latency = base_latency;
        for (at, ms) in spikes {
            latency[at] = ms;
        }
        scenario(n, radix, boots, latency, missing_seed, crashes, cuts)?;
    }
}

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
        vec![(9733, 36, true, 2892), (19012, 59, true, 2217)],
        vec![
            (11029, 13141958739819678014),
            (13604, 15270424765997675796),
            (9779, 2849009184813696863),
        ],
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
        vec![(9733, 36, true, 2892), (19012, 59, true, 2217)],
        vec![
            (11029, 13141958739819678014),
            (13604, 15270424765997675796),
            (9779, 2849009184813696863),
        ],
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
    )
    .unwrap();
}
