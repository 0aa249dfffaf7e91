//! The events simulator: one `EventHub` per daemon of a radix tree, wired by FIFO links
//! whose messages are delivered in a seeded random interleaving, with job processes and
//! tools that connect, register, notify with every range, disconnect and exit at random.
//! Each daemon sends a child an event only where the hubs' rule says (a job runs below it,
//! or a tool below it registered and said so up the tree). After every step the safety
//! invariants are checked (nobody outside an event's range hears it; nobody hears one
//! twice); once the network is drained, liveness (every launched process that is
//! registered at the end and never exited heard every job event its range gave it, however
//! late it connected; every tool registered at the end had its registration answered, and
//! heard every event its range gave it that was made after that answer).
//!
//! A daemon's link to its parent can also be cut and made again ([`Step::Cut`],
//! [`Step::Rejoin`]): what was in flight on it is lost, both hubs are told (the child its
//! path up, the parent its children), and the interest below is said again. Liveness then
//! excuses exactly what PMIx allows a failing daemon to lose: an event whose copy was
//! dropped on a cut link, and, for a tool answered before a link on its path was cut, the
//! events in flight at that cut or made after it until the tree is whole again and no
//! interest is in flight (its path being counted again). A tool answered after a cut is owed
//! every later event, and once every link is back and the network drained every answer must
//! have come.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use dvmlab_core::event::hub::{EventHub, Input, Link, Output};
use dvmlab_core::event::interest::Up;
use dvmlab_core::tree::{RadixTree, Rank};
use dvmlab_proto::event::{Directives, EventDown, EventUp, Info, Proc, Range, Travelling};

/// One thing that happens, chosen by the property's strategy.
#[derive(Debug, Clone)]
pub enum Step {
    /// Client `c` (modulo the clients) connects, if it is not connected.
    Connect(usize),
    /// Client `c` registers a default handler, if connected.
    Register(usize),
    /// Client `c` takes its registration back, if it has one.
    Deregister(usize),
    /// Client `c` notifies with range `range` (an index into [`RANGES`]); `target` picks a
    /// CUSTOM target among the job processes.
    Notify {
        c: usize,
        range: usize,
        target: usize,
    },
    /// Client `c` disconnects.
    Disconnect(usize),
    /// Job process `c` exits (and disconnects): its daemon is told.
    Exit(usize),
    /// One message in flight on link `l` (modulo the busy ones) arrives.
    Deliver(usize),
    /// The link of daemon `r` (modulo the daemons, rank 0 having none) to its parent breaks:
    /// what is in flight on it is lost.
    Cut(u32),
    /// One of the cut links (`r` modulo them), if any, is made again.
    Rejoin(u32),
}

pub const RANGES: [Range; 7] = [
    Range::Local,
    Range::Namespace,
    Range::Session,
    Range::Global,
    Range::Custom,
    Range::Rm,
    Range::ProcLocal,
];

/// A client: a job process (with its node) or a tool on a node.
#[derive(Debug, Clone)]
struct Client {
    rank: Rank,
    proc: Option<Proc>,
    link: Option<Link>,
    registered: bool,
    /// Its registration's id (each registration gets a new one).
    reg: u64,
    /// Answers it waits for (to its registrations and notifications).
    owed: usize,
    exited: bool,
    /// A tool: how many notifications had been made when its registration was answered.
    answered: Option<usize>,
    /// A tool answered before a link on its path was cut: the notifications in flight at
    /// each such cut or made after it until the tree was settled again (the last one open
    /// while it is not), which may miss it.
    excused: Vec<(usize, Option<usize>)>,
}

impl Client {
    /// Whether its last excused stretch is still open.
    fn excuse_open(&self) -> bool {
        self.excused.last().is_some_and(|(_, end)| end.is_none())
    }
}

/// What travels between two daemons.
#[derive(Debug, Clone)]
enum Msg {
    Event(Travelling),
    Interest { on: bool, seq: u64 },
    Seen { seq: u64 },
    Again,
}

/// A notification made: by whom, with what range and targets.
#[derive(Debug, Clone)]
struct Made {
    from: usize,
    range: Range,
    targets: Vec<Proc>,
}

/// See the module documentation.
pub struct EventSim {
    tree: RadixTree,
    hubs: Vec<EventHub>,
    clients: Vec<Client>,
    /// (from, to) -> messages in flight, FIFO like TCP.
    net: BTreeMap<(Rank, Rank), VecDeque<Msg>>,
    /// The ranks whose subtree runs a process of a job (a job's add went down to them).
    runs_jobs: BTreeSet<Rank>,
    next_link: Link,
    /// The last registration id given out.
    next_reg: u64,
    made: Vec<Made>,
    /// Event id -> clients (by index) that heard it.
    heard: BTreeMap<u64, BTreeSet<usize>>,
    /// The daemons whose link to their parent is cut.
    cut: BTreeSet<Rank>,
    /// Events of which a copy was dropped on a cut link.
    lost: BTreeSet<u64>,
    /// The first invariant broken.
    pub violation: Option<String>,
}

impl EventSim {
    /// `n` daemons in a tree of `radix`; two jobs of `procs` processes each, placed by
    /// `placement` (rank of each process, in order), and a tool on every node.
    pub fn new(n: u32, radix: u32, procs: u32, placement: &[u32]) -> EventSim {
        let tree = RadixTree::new(radix, n);
        let mut hubs: Vec<EventHub> = (0..n).map(|r| EventHub::new(r, 16)).collect();
        let mut clients = Vec::new();
        let mut local: BTreeMap<(Rank, String), Vec<u32>> = BTreeMap::new();
        for job in 1..=2u64 {
            for p in 0..procs {
                let i = (job as usize - 1) * procs as usize + p as usize;
                let rank = placement.get(i).copied().unwrap_or(0) % n;
                let nspace = format!("dvm@{job}");
                local.entry((rank, nspace.clone())).or_default().push(p);
                clients.push(Client {
                    rank,
                    proc: Some(Proc { nspace, rank: p }),
                    link: None,
                    registered: false,
                    reg: 0,
                    owed: 0,
                    exited: false,
                    answered: None,
                    excused: Vec::new(),
                });
            }
        }
        let mut runs_jobs = BTreeSet::new();
        for (rank, _) in local.keys() {
            let mut r = *rank;
            runs_jobs.insert(r);
            while let Some(p) = tree.parent(r) {
                runs_jobs.insert(p);
                r = p;
            }
        }
        for ((rank, nspace), ranks) in local {
            hubs[rank as usize].handle(Input::LocalProcs { nspace, ranks });
        }
        for (rank, hub) in hubs.iter_mut().enumerate() {
            let rank = rank as Rank;
            let live = tree.children(rank).into_iter().map(u64::from).collect();
            let older = BTreeSet::new();
            assert!(hub.handle(Input::Children { live, older }).is_empty());
            if rank != 0 {
                assert!(hub.handle(Input::Uplink(Up::Reads)).is_empty());
            }
        }
        for rank in 0..n {
            clients.push(Client {
                rank,
                proc: None,
                link: None,
                registered: false,
                reg: 0,
                owed: 0,
                exited: false,
                answered: None,
                excused: Vec::new(),
            });
        }
        EventSim {
            tree,
            hubs,
            clients,
            net: BTreeMap::new(),
            runs_jobs,
            next_link: 1,
            next_reg: 0,
            made: Vec::new(),
            heard: BTreeMap::new(),
            cut: BTreeSet::new(),
            lost: BTreeSet::new(),
            violation: None,
        }
    }

    fn violated(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
        }
    }

    pub fn step(&mut self, s: Step) {
        self.take_step(s);
        self.settle_excuses();
    }

    fn take_step(&mut self, s: Step) {
        let nc = self.clients.len();
        match s {
            Step::Connect(c) => {
                let c = c % nc;
                let cl = self.clients[c].clone();
                if cl.link.is_some() || cl.exited {
                    return;
                }
                let link = self.next_link;
                self.next_link += 1;
                self.clients[c].link = Some(link);
                self.clients[c].registered = false;
                self.clients[c].answered = None;
                self.clients[c].excused.clear();
                let out = self.hubs[cl.rank as usize].handle(Input::Connected {
                    link,
                    proc: cl.proc,
                });
                self.outputs(cl.rank, out);
            }
            Step::Register(c) => {
                let c = c % nc;
                let Some(link) = self.clients[c].link else {
                    return;
                };
                if self.clients[c].registered {
                    return;
                }
                self.next_reg += 1;
                let k = &mut self.clients[c];
                (k.registered, k.reg, k.answered) = (true, self.next_reg, None);
                k.excused.clear();
                let up = EventUp::Register {
                    id: self.next_reg,
                    codes: vec![],
                    directives: Directives::default(),
                };
                self.client_says(c, link, up);
            }
            Step::Deregister(c) => {
                let c = c % nc;
                let k = &mut self.clients[c];
                let (Some(link), true) = (k.link, k.registered) else {
                    return;
                };
                (k.registered, k.answered) = (false, None);
                k.excused.clear();
                let up = EventUp::Deregister { id: k.reg };
                self.client_says(c, link, up);
            }
            Step::Notify { c, range, target } => {
                let c = c % nc;
                let Some(link) = self.clients[c].link else {
                    return;
                };
                let range = RANGES[range % RANGES.len()];
                let procs: Vec<Proc> = self.clients.iter().filter_map(|k| k.proc.clone()).collect();
                let targets = match range {
                    Range::Custom => vec![procs[target % procs.len()].clone()],
                    _ => vec![],
                };
                let id = self.made.len() as u64;
                self.made.push(Made {
                    from: c,
                    range,
                    targets: targets.clone(),
                });
                let up = EventUp::Notify {
                    code: -3000,
                    range,
                    targets,
                    info: vec![Info {
                        key: "id".into(),
                        value: id.into(),
                    }],
                };
                self.client_says(c, link, up);
            }
            Step::Disconnect(c) => self.disconnect(c % nc),
            Step::Exit(c) => {
                let c = c % nc;
                let Some(p) = self.clients[c].proc.clone() else {
                    return;
                };
                if self.clients[c].exited {
                    return;
                }
                self.disconnect(c);
                self.clients[c].exited = true;
                let rank = self.clients[c].rank;
                let out = self.hubs[rank as usize].handle(Input::ProcGone {
                    nspace: p.nspace,
                    rank: p.rank,
                });
                self.outputs(rank, out);
            }
            Step::Deliver(l) => {
                let busy: Vec<(Rank, Rank)> = self
                    .net
                    .iter()
                    .filter(|(_, q)| !q.is_empty())
                    .map(|(k, _)| *k)
                    .collect();
                if busy.is_empty() {
                    return;
                }
                let (from, to) = busy[l % busy.len()];
                let Some(m) = self.net.get_mut(&(from, to)).and_then(VecDeque::pop_front) else {
                    return;
                };
                let above = self.tree.parent(to) == Some(from);
                let input = match m {
                    Msg::Event(t) if above => Input::FromAbove(t),
                    Msg::Event(t) => Input::FromBelow(t),
                    Msg::Interest { on, seq } => Input::ChildInterest {
                        child: from.into(),
                        on,
                        seq,
                    },
                    Msg::Seen { seq } => Input::InterestSeen { seq },
                    Msg::Again => Input::InterestAgain,
                };
                let out = self.hubs[to as usize].handle(input);
                self.outputs(to, out);
            }
            Step::Cut(r) => {
                let r = r % self.tree.size();
                let Some(parent) = self.tree.parent(r) else {
                    return;
                };
                if !self.cut.insert(r) {
                    return;
                }
                for q in [(r, parent), (parent, r)] {
                    for m in self.net.remove(&q).unwrap_or_default() {
                        if let Msg::Event(t) = m {
                            self.lost.extend(id_of(&t.event));
                        }
                    }
                }
                // What is on its way may have to pass the cut path too.
                let made = self
                    .net
                    .values()
                    .flatten()
                    .filter_map(|m| match m {
                        Msg::Event(t) => id_of(&t.event),
                        _ => None,
                    })
                    .map(|id| id as usize)
                    .fold(self.made.len(), usize::min);
                let tree = self.tree;
                for k in &mut self.clients {
                    if k.proc.is_none()
                        && k.answered.is_some()
                        && !k.excuse_open()
                        && tree.is_ancestor_or_self(r, k.rank)
                    {
                        k.excused.push((made, None));
                    }
                }
                let out = self.hubs[r as usize].handle(Input::Uplink(Up::Gone));
                self.outputs(r, out);
                self.children_changed(parent);
            }
            Step::Rejoin(r) => {
                let cut: Vec<Rank> = self.cut.iter().copied().collect();
                let Some(&r) = cut.get(r as usize % cut.len().max(1)) else {
                    return;
                };
                let Some(parent) = self.tree.parent(r) else {
                    return;
                };
                self.cut.remove(&r);
                self.children_changed(parent);
                let out = self.hubs[r as usize].handle(Input::Uplink(Up::Reads));
                self.outputs(r, out);
            }
        }
    }

    /// Tells daemon `at` which of its children's links are up.
    fn children_changed(&mut self, at: Rank) {
        let live = self
            .tree
            .children(at)
            .into_iter()
            .filter(|c| !self.cut.contains(c))
            .map(u64::from)
            .collect();
        let older = BTreeSet::new();
        let out = self.hubs[at as usize].handle(Input::Children { live, older });
        self.outputs(at, out);
    }

    /// Makes every cut link again and drains the network.
    pub fn calm(&mut self) {
        while !self.cut.is_empty() {
            self.step(Step::Rejoin(0));
        }
        self.drain();
    }

    /// Once the tree is whole and no interest is in flight, every path is counted again:
    /// the tools' excused stretches end.
    fn settle_excuses(&mut self) {
        let open = self.clients.iter().any(Client::excuse_open);
        let interest_in_flight = self
            .net
            .values()
            .flatten()
            .any(|m| !matches!(m, Msg::Event(_)));
        if !open || !self.cut.is_empty() || interest_in_flight {
            return;
        }
        let made = self.made.len();
        for k in &mut self.clients {
            if let Some((_, end @ None)) = k.excused.last_mut() {
                *end = Some(made);
            }
        }
    }

    fn disconnect(&mut self, c: usize) {
        let Some(link) = self.clients[c].link.take() else {
            return;
        };
        let k = &mut self.clients[c];
        (k.registered, k.answered, k.owed) = (false, None, 0);
        k.excused.clear();
        let rank = self.clients[c].rank;
        let out = self.hubs[rank as usize].handle(Input::Gone { link });
        self.outputs(rank, out);
    }

    fn client_says(&mut self, c: usize, link: Link, up: EventUp) {
        if !matches!(up, EventUp::Deregister { .. }) {
            self.clients[c].owed += 1;
        }
        let rank = self.clients[c].rank;
        let out = self.hubs[rank as usize].handle(Input::FromClient { link, up });
        self.outputs(rank, out);
    }

    fn outputs(&mut self, at: Rank, out: Vec<Output>) {
        for o in out {
            match o {
                Output::ToClient { link, down } => self.delivered(link, down),
                Output::ToParent(t) => self.up(at, Msg::Event(t)),
                Output::InterestUp { on, seq } => self.up(at, Msg::Interest { on, seq }),
                Output::ToChildren(t) => {
                    for ch in self.tree.children(at) {
                        let jobs = self.runs_jobs.contains(&ch);
                        if !self.hubs[at as usize].goes_down(&t, ch.into(), jobs, true) {
                            continue;
                        }
                        if self.cut.contains(&ch) {
                            self.lost.extend(id_of(&t.event));
                        } else {
                            let m = Msg::Event(t.clone());
                            self.net.entry((at, ch)).or_default().push_back(m);
                        }
                    }
                }
                Output::InterestSeen { child, seq } => self.down(at, child, Msg::Seen { seq }),
                Output::InterestAgain { child } => self.down(at, child, Msg::Again),
                Output::Log(_) => {}
            }
        }
    }

    fn down(&mut self, at: Rank, child: u64, m: Msg) {
        match Rank::try_from(child) {
            Ok(ch) if self.cut.contains(&ch) => self.violated(format!(
                "rank {at} sent {m:?} to {child}, whose link is cut"
            )),
            Ok(ch) if self.tree.parent(ch) == Some(at) => {
                self.net.entry((at, ch)).or_default().push_back(m)
            }
            _ => self.violated(format!("rank {at} sent {m:?} to {child}, no child of it")),
        }
    }

    fn up(&mut self, at: Rank, m: Msg) {
        match self.tree.parent(at) {
            // Sent into a link that is down: lost, as on a broken connection.
            Some(_) if self.cut.contains(&at) => {
                if let Msg::Event(t) = &m {
                    self.lost.extend(id_of(&t.event));
                }
            }
            Some(p) => self.net.entry((at, p)).or_default().push_back(m),
            None => self.violated(format!("rank {at} has no parent but sent up")),
        }
    }

    /// Safety, as each delivery happens: the client is in the event's range, and never
    /// hears it twice.
    fn delivered(&mut self, link: Link, down: EventDown) {
        let Some(c) = self.clients.iter().position(|k| k.link == Some(link)) else {
            return self.violated(format!("{down:?} to link {link}, which no client holds"));
        };
        if !matches!(down, EventDown::Deliver { .. }) {
            let k = &mut self.clients[c];
            match k.owed.checked_sub(1) {
                Some(n) => k.owed = n,
                None => return self.violated(format!("client {c} got {down:?}, unasked")),
            }
        }
        let event = match down {
            EventDown::Deliver { event } => event,
            EventDown::Registered { id } => {
                let made = self.made.len();
                let k = &mut self.clients[c];
                if k.registered && id == k.reg {
                    k.answered.get_or_insert(made);
                }
                return;
            }
            _ => return,
        };
        let Some(id) = id_of(&event) else {
            return;
        };
        let m = self.made[id as usize].clone();
        if !self.in_range(&m, c) {
            return self.violated(format!(
                "event {id} ({:?} from client {}) reached client {c} ({:?} on rank {}), outside its range",
                m.range, m.from, self.clients[c].proc, self.clients[c].rank
            ));
        }
        if !self.heard.entry(id).or_default().insert(c) {
            self.violated(format!("client {c} heard event {id} twice"));
        }
    }

    /// Whether client `c` is in the range of notification `m`.
    fn in_range(&self, m: &Made, c: usize) -> bool {
        let (from, to) = (&self.clients[m.from], &self.clients[c]);
        match m.range {
            Range::Local => from.rank == to.rank,
            Range::Namespace => {
                matches!((&from.proc, &to.proc), (Some(a), Some(b)) if a.nspace == b.nspace)
            }
            Range::Session | Range::Global | Range::Undef => true,
            Range::Custom => to.proc.as_ref().is_some_and(|p| m.targets.contains(p)),
            Range::Rm | Range::ProcLocal => false,
        }
    }

    /// Delivers everything in flight.
    pub fn drain(&mut self) {
        while self.net.values().any(|q| !q.is_empty()) && self.violation.is_none() {
            self.step(Step::Deliver(0));
        }
    }

    /// Once drained, every connected client has every answer it asked for: nothing is held
    /// back for a tool once nothing is in flight.
    pub fn check_answered(&mut self) {
        let owed: Vec<String> = self
            .clients
            .iter()
            .enumerate()
            .filter(|(_, k)| k.link.is_some() && k.owed > 0)
            .map(|(c, k)| {
                format!(
                    "client {c} on rank {} waits for {} answer(s)",
                    k.rank, k.owed
                )
            })
            .collect();
        if let Some(first) = owed.first() {
            self.violated(format!("{first} with nothing in flight"));
        }
    }

    /// Liveness, once drained: every job process that never exited and is connected and
    /// registered now heard every job event addressed to it. Those events were kept on its
    /// node for it, however late it came. Every tool registered now had its registration
    /// answered, and heard every event addressed to it that was made after that. Excused:
    /// an event a copy of which was dropped on a cut link, and for a tool answered before a
    /// cut on its path the events in flight at it or made while that path was counted again
    /// (see the module documentation).
    pub fn check_liveness(&mut self) {
        for c in 0..self.clients.len() {
            let k = &self.clients[c];
            if k.exited || !k.registered {
                continue;
            }
            let since = match (&k.proc, k.answered) {
                (Some(_), _) => 0,
                (None, Some(a)) => a,
                (None, None) => {
                    return self.violated(format!(
                        "tool {c} on rank {} registered and was never answered",
                        k.rank
                    ))
                }
            };
            for (id, m) in self.made.clone().into_iter().enumerate().skip(since) {
                let excused = self.lost.contains(&(id as u64))
                    || self.clients[c]
                        .excused
                        .iter()
                        .any(|&(from, to)| id >= from && to.is_none_or(|to| id < to));
                let addressed = !matches!(m.range, Range::Rm | Range::ProcLocal)
                    && self.in_range(&m, c)
                    && !excused;
                let heard = self.heard.get(&(id as u64)).is_some_and(|h| h.contains(&c));
                if addressed && !heard {
                    return self.violated(format!(
                        "client {c} ({:?} on rank {}) never heard event {id} ({:?} from client {})",
                        self.clients[c].proc, self.clients[c].rank, m.range, m.from
                    ));
                }
            }
        }
    }
}

/// The number the simulator gave a notification (its `id` info).
fn id_of(event: &dvmlab_proto::event::Event) -> Option<u64> {
    event
        .info
        .iter()
        .find(|i| i.key == "id")
        .and_then(|i| i.value.as_u64())
}
