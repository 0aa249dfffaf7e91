//! The daemon core, simulated: many `Node`s wired by an in-memory network with random boot
//! times, random per-message latency (FIFO per link, like TCP) and parents that never boot.
//! No sockets, no clocks: every interleaving is reproducible from the proptest seed.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::Duration;

use dvmlab_runtime::contract::MemberState;
use dvmlab_runtime::identity::{Identity, Role};
use dvmlab_runtime::node::{Input, LinkId, Node, NodeConfig, Output};
use dvmlab_runtime::tree::{RadixTree, Rank};
use dvmlab_runtime::uplink::Policy;
use dvmlab_runtime::wire::{Frame, Peer, ToolReply, ToolRequest};
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
}

struct Sim {
    nodes: HashMap<Rank, Node>,
    alive: Vec<bool>,
    cfg: Vec<NodeConfig>,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Ev>,
    seq: u64,
    now: u64,
    /// link id → (owner, peer rank, peer's link id)
    links: HashMap<LinkId, (Rank, Rank, LinkId)>,
    next_link: LinkId,
    /// per link: time of the last delivery, to keep each link FIFO
    last: HashMap<LinkId, u64>,
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
                controller_listed: false,
                controller_uri: "sim".into(),
            })
            .collect();
        Sim {
            nodes: HashMap::new(),
            alive: vec![false; n as usize],
            cfg,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            seq: 0,
            now: 0,
            links: HashMap::new(),
            next_link: 1,
            last: HashMap::new(),
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
                    return;
                };
                match frame {
                    Frame::Daemon(msg) => self.deliver_on(
                        peer_link,
                        peer,
                        Input::Frame {
                            link: peer_link,
                            msg,
                        },
                    ),
                    Frame::Welcome { .. } => self.deliver_on(
                        peer_link,
                        peer,
                        Input::UplinkUp {
                            link: peer_link,
                            rank: r,
                        },
                    ),
                    Frame::Refuse { reason } => {
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
            Output::Note(_) => {}
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
            self.deliver_on(peer_link, peer, Input::Closed { link: peer_link });
            self.deliver_on(link, owner, Input::Closed { link });
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
                    self.nodes
                        .insert(r, Node::new(self.cfg[r as usize].clone()));
                    self.feed(r, Input::Start);
                }
                Ev::Input(r, input) => self.feed(r, input),
                Ev::Dial { from, to } => {
                    if !self.alive[from as usize] {
                        continue;
                    }
                    if self.alive[to as usize] {
                        let (a, b) = (self.next_link, self.next_link + 1);
                        self.next_link += 2;
                        self.links.insert(a, (from, to, b));
                        self.links.insert(b, (to, from, a));
                        let host = format!("h{from}");
                        self.deliver_on(
                            b,
                            to,
                            Input::Hello {
                                link: b,
                                peer: Peer::Daemon { rank: from, host },
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn any_boot_order_and_interleaving_forms_the_dvm_and_stops_cleanly(
        n in 2u32..60,
        radix in 2u32..5,
        boots in proptest::collection::vec(0u64..3000, 60),
        latency in proptest::collection::vec(0u64..8, 1..16),
        missing_seed in proptest::option::of(1u32..60),
    ) {
        let heal = Some(1000 * MS);
        let mut sim = Sim::new(n, radix, heal, latency);
        let tree = RadixTree::new(radix, n);
        // An interior rank that boots only after the rest has settled.
        let missing = missing_seed.map(|s| 1 + s % (n - 1)).filter(|&m| !tree.children(m).is_empty());
        for r in 0..n {
            if Some(r) != missing {
                sim.at(boots[r as usize], Ev::Boot(r));
            }
        }
        sim.run_until(30_000);
        let status = sim.nodes[&0].status();
        let joined: BTreeMap<Rank, MemberState> = status.members.iter().map(|m| (m.rank, m.state)).collect();
        for r in 0..n {
            let want = if Some(r) == missing { MemberState::Waiting } else { MemberState::Joined };
            prop_assert_eq!(joined[&r], want, "rank {} after 30 s: {:?}", r, status);
        }
        prop_assert_eq!(status.formed, missing.is_none());
        for m in &status.members {
            if let Some(p) = m.parent {
                prop_assert!(tree.ancestors(m.rank).contains(&p), "{:?} joined a non-ancestor", m);
            }
        }
        if let Some(m) = missing {
            sim.at(sim.now, Ev::Boot(m));
            sim.run_until(sim.now + 30_000);
            prop_assert!(sim.nodes[&0].formed(), "formed once the late rank boots: {:?}", sim.nodes[&0].status());
        }
        // A tool stops the DVM: every daemon exits and the tool hears it.
        sim.nodes.get_mut(&0).map(|c| c.handle(Duration::from_millis(sim.now), Input::Hello { link: TOOL, peer: Peer::Tool }));
        sim.feed(0, Input::Tool { link: TOOL, req: ToolRequest::Stop });
        sim.run_until(sim.now + 20_000);
        prop_assert!(sim.exited.iter().all(|&e| e), "all exited: {:?}", sim.exited);
        prop_assert!(
            matches!(sim.tool_replies.last(), Some(ToolReply::Stopped { unconfirmed }) if unconfirmed.is_empty()),
            "{:?}", sim.tool_replies
        );
    }
}
