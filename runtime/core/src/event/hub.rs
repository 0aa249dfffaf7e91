//! One daemon's events, without IO: its [`LocalServer`] for the clients on its node, and
//! the way events travel the tree between daemons.
//!
//! A client's notification is handed to the clients of this node at once when its range
//! stays on the node; otherwise it goes up, hop by hop, to the controller. The controller
//! logs what is for the runtime alone and sends the rest down to every daemon, each handing
//! it to the clients its audience names. Events the runtime raises (a process that aborted,
//! a lost node) start at the controller the same way.
//!
//! The hub knows which processes of each job run on its node (job-exec tells it), so an
//! event for a job waits for those that have not connected yet. It also keeps this daemon's
//! [`Interest`]: which child links have a tool below them that registered (the daemon sends
//! those every event), and whether a tool registering here may be answered yet.

use std::collections::{BTreeMap, BTreeSet};

use dvmlab_proto::event::{
    Audience, Event, EventDown, EventUp, Level, Proc, Travelling, RANK_WILDCARD,
};

use super::interest::{DaemonLink, Interest, Said, Up};
use super::range::{audience, reach, Reach};
use super::registry::RegId;
use super::server::{Delivery, LocalServer};

/// A client's connection (the shell's link id).
pub type Link = u64;

/// What happened that concerns events.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A job process (`proc`) or a tool (`None`) connected for events on `link`.
    Connected {
        link: Link,
        proc: Option<Proc>,
    },
    FromClient {
        link: Link,
        up: EventUp,
    },
    Gone {
        link: Link,
    },
    /// From a child: on its way to the controller.
    FromBelow(Travelling),
    /// From the parent: for this daemon's clients and those below.
    FromAbove(Travelling),
    /// These processes of job `nspace` run on this node.
    LocalProcs {
        nspace: String,
        ranks: Vec<u32>,
    },
    /// Process `rank` of job `nspace` exited on this node.
    ProcGone {
        nspace: String,
        rank: u32,
    },
    /// Job `nspace` has no process left on this node.
    JobGone {
        nspace: String,
    },
    /// The runtime raises an event (on the controller).
    Raise(Travelling),
    /// The upward link changed.
    Uplink(Up),
    /// The child links now, and those of them older than `wire::EVENT_INTEREST`.
    Children {
        live: BTreeSet<DaemonLink>,
        older: BTreeSet<DaemonLink>,
    },
    /// A child said whether a tool below it holds a registration.
    ChildInterest {
        child: DaemonLink,
        on: bool,
        seq: u64,
    },
    /// The parent counted this daemon's interest `seq`.
    InterestSeen {
        seq: u64,
    },
    /// The parent's path to the controller changed: say this daemon's interest again.
    InterestAgain,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    ToClient {
        link: Link,
        down: EventDown,
    },
    ToParent(Travelling),
    ToChildren(Travelling),
    /// To the parent: whether a tool here or below holds a registration.
    InterestUp {
        on: bool,
        seq: u64,
    },
    /// To a child: its interest `seq` is counted up to the controller.
    InterestSeen {
        child: DaemonLink,
        seq: u64,
    },
    /// To a child: what it said is counted no further than this daemon; it is to say it
    /// again.
    InterestAgain {
        child: DaemonLink,
    },
    Log(String),
}

/// See the module documentation.
#[derive(Debug)]
pub struct EventHub {
    /// This daemon's rank (0: the controller); a tool's PMIx name is `tool@RANK.LINK` (tools
    /// have no job, but what they notify has a source, unlike the runtime's own events).
    rank: u32,
    server: LocalServer,
    procs: BTreeMap<Link, Proc>,
    local: BTreeMap<String, BTreeSet<u32>>,
    /// A client's registration id (its own numbering) -> the server's.
    ids: BTreeMap<(Link, u64), RegId>,
    interest: Interest,
    /// What waits for a tool until its registration may be answered (its answer first),
    /// in order; `held_events` of it are events (at most [`MAX_HELD_EVENTS`]).
    held: Vec<(Link, EventDown)>,
    held_events: usize,
}

/// Most events held for tools whose registration waits to be answered (a daemon cut off
/// from its parent, its local processes notifying): later ones are dropped, and logged.
pub const MAX_HELD_EVENTS: usize = 512;
/// Most answers held for one such tool (its registration's, and those to what it sent
/// after without waiting): later ones are dropped, and logged.
pub const MAX_HELD_ANSWERS: usize = 16;

impl EventHub {
    /// The hub of the daemon of `rank` (0: the controller), keeping the last `ring`
    /// environment events.
    pub fn new(rank: u32, ring: usize) -> EventHub {
        EventHub {
            rank,
            server: LocalServer::new(ring),
            procs: BTreeMap::new(),
            local: BTreeMap::new(),
            ids: BTreeMap::new(),
            interest: Interest::new(rank == 0),
            held: Vec::new(),
            held_events: 0,
        }
    }

    /// Whether event `t`, on its way down, goes to the child on `link` (see
    /// [`super::interest`]): the environment's events go everywhere (each daemon keeps the
    /// last ones for later registrations); the others only where a job runs (`runs_jobs`:
    /// its processes, and the kept events of those not connected yet, are there) or a tool
    /// registered, and to every child too old to say (`says` false).
    pub fn goes_down(&self, t: &Travelling, link: DaemonLink, runs_jobs: bool, says: bool) -> bool {
        t.event.level == Level::Environment || !says || runs_jobs || self.interest.wants_all(link)
    }

    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        let mut out = self.handle_inner(input);
        let here = self.server.tool_registered();
        self.said(|i, o| i.tools(here, o), &mut out);
        self.hold(&mut out);
        out
    }

    /// Keeps back what goes to a tool whose registration waits to be answered (everything
    /// for it after its answer, too, so it comes in order), and lets it all go once this
    /// daemon's interest is counted up to the controller.
    fn hold(&mut self, out: &mut Vec<Output>) {
        if !self.held.is_empty() {
            // Every tool held has its answer first, so each is a key here.
            let mut answers: BTreeMap<Link, usize> = BTreeMap::new();
            for (link, down) in &self.held {
                let n = answers.entry(*link).or_default();
                *n += usize::from(!matches!(down, EventDown::Deliver { .. }));
            }
            let mut kept = Vec::with_capacity(out.len());
            let mut dropped = 0;
            for o in out.drain(..) {
                let Output::ToClient { link, down } = o else {
                    kept.push(o);
                    continue;
                };
                let Some(n) = answers.get_mut(&link) else {
                    kept.push(Output::ToClient { link, down });
                    continue;
                };
                let room = if matches!(down, EventDown::Deliver { .. }) {
                    let room = self.held_events < MAX_HELD_EVENTS;
                    self.held_events += usize::from(room);
                    room
                } else {
                    let room = *n < MAX_HELD_ANSWERS;
                    *n += usize::from(room);
                    room
                };
                if room {
                    self.held.push((link, down));
                } else {
                    dropped += 1;
                }
            }
            *out = kept;
            if dropped > 0 {
                out.push(Output::Log(format!(
                    "{dropped} message(s) for tools waiting for their registration's answer dropped: at most {MAX_HELD_EVENTS} events, and {MAX_HELD_ANSWERS} answers a tool, wait"
                )));
            }
        }
        // With no tool registered any more, nothing held has an answer to wait for.
        if self.interest.settled() || !self.server.tool_registered() {
            self.held_events = 0;
            out.extend(
                self.held
                    .drain(..)
                    .map(|(link, down)| Output::ToClient { link, down }),
            );
        }
    }

    fn handle_inner(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        match input {
            Input::Connected { link, proc } => {
                if let Err(e) = self.server.connect(link, proc.clone()) {
                    out.push(Output::ToClient {
                        link,
                        down: EventDown::Refused {
                            id: 0,
                            reason: e.to_string(),
                        },
                    });
                } else if let Some(p) = proc {
                    self.procs.insert(link, p);
                }
            }
            Input::Gone { link } => {
                self.server.disconnect(link);
                // A process the runtime did not launch here (started by hand with a job's
                // name) will not exit through job-exec: nothing may wait for it.
                if let Some(p) = self.procs.remove(&link) {
                    let launched = self
                        .local
                        .get(&p.nspace)
                        .is_some_and(|r| r.contains(&p.rank));
                    let again = self.procs.values().any(|q| *q == p);
                    if !launched && !again {
                        self.server.proc_gone(&p.nspace, p.rank);
                    }
                }
                self.ids.retain(|(l, _), _| *l != link);
                self.held.retain(|(l, _)| *l != link);
                self.held_events = self
                    .held
                    .iter()
                    .filter(|(_, d)| matches!(d, EventDown::Deliver { .. }))
                    .count();
            }
            Input::FromClient { link, up } => self.client_said(link, up, &mut out),
            Input::FromBelow(t) => self.arrived_up(t, &mut out),
            Input::FromAbove(t) => {
                self.deliver(&t, &mut out);
                out.push(Output::ToChildren(t));
            }
            Input::LocalProcs { nspace, ranks } => {
                self.local.entry(nspace).or_default().extend(ranks);
            }
            Input::ProcGone { nspace, rank } => {
                if let Some(r) = self.local.get_mut(&nspace) {
                    r.remove(&rank);
                }
                self.server.proc_gone(&nspace, rank);
            }
            Input::JobGone { nspace } => {
                self.local.remove(&nspace);
                self.server.job_ended(&nspace);
            }
            Input::Raise(t) => self.arrived_up(t, &mut out),
            Input::Uplink(up) => self.said(|i, o| i.uplink(up, o), &mut out),
            Input::Children { live, older } => {
                self.said(|i, o| i.children(&live, &older, o), &mut out)
            }
            Input::ChildInterest { child, on, seq } => {
                self.said(|i, o| i.child_said(child, on, seq, o), &mut out)
            }
            Input::InterestSeen { seq } => self.said(|i, o| i.seen(seq, o), &mut out),
            Input::InterestAgain => self.said(|i, o| i.again(o), &mut out),
        }
        out
    }

    fn said(&mut self, f: impl FnOnce(&mut Interest, &mut Vec<Said>), out: &mut Vec<Output>) {
        let mut said = Vec::new();
        f(&mut self.interest, &mut said);
        out.extend(said.into_iter().map(|s| match s {
            Said::Up { on, seq } => Output::InterestUp { on, seq },
            Said::Seen { child, seq } => Output::InterestSeen { child, seq },
            Said::Again { child } => Output::InterestAgain { child },
        }));
    }

    fn client_said(&mut self, link: Link, up: EventUp, out: &mut Vec<Output>) {
        if let Err(reason) = up.check() {
            let down = match up {
                EventUp::Register { id, .. } => EventDown::Refused { id, reason },
                _ => EventDown::NotifyRefused { reason },
            };
            return out.push(Output::ToClient { link, down });
        }
        match up {
            EventUp::Register {
                id,
                codes,
                directives,
            } => match self.server.register(link, codes, directives) {
                Ok((reg, cached)) => {
                    let answer = EventDown::Registered { id };
                    // A tool's answer waits until its daemon gets every event (`hold`);
                    // a job process's job already brings it those of its job.
                    if self.server.is_tool(link) && !self.interest.settled() {
                        let waiting = self
                            .held
                            .iter()
                            .filter(|(l, d)| *l == link && !matches!(d, EventDown::Deliver { .. }))
                            .count();
                        if waiting >= MAX_HELD_ANSWERS {
                            // A tool that does not wait for its answers: the registration is
                            // not taken, or answers held for it would grow without end.
                            self.server.deregister(link, reg);
                            return out.push(Output::Log(format!(
                                "event tool on link {link}: registration {id} dropped: {MAX_HELD_ANSWERS} answers wait for it already"
                            )));
                        }
                        self.held.push((link, answer));
                    } else {
                        out.push(Output::ToClient { link, down: answer });
                    }
                    self.ids.insert((link, id), reg);
                    deliveries(cached, out)
                }
                Err(e) => out.push(Output::ToClient {
                    link,
                    down: EventDown::Refused {
                        id,
                        reason: e.to_string(),
                    },
                }),
            },
            EventUp::Deregister { id } => {
                if let Some(reg) = self.ids.remove(&(link, id)) {
                    self.server.deregister(link, reg);
                }
            }
            EventUp::Notify {
                code,
                range,
                targets,
                info,
            } => {
                let from = self.procs.get(&link).cloned().unwrap_or_else(|| Proc {
                    nspace: format!("tool@{}.{link}", self.rank),
                    rank: 0,
                });
                let source = Some(from.clone());
                let t = Travelling {
                    audience: audience(range, &from, &targets),
                    event: Event {
                        code,
                        source,
                        info,
                        level: Level::Job,
                    },
                };
                out.push(Output::ToClient {
                    link,
                    down: EventDown::Notified,
                });
                match reach(range) {
                    Reach::Process => {}
                    Reach::Node => self.deliver(&t, out),
                    Reach::Controller | Reach::Everywhere => self.arrived_up(t, out),
                }
            }
        }
    }

    /// An event on its way up: the controller sends it down (or keeps it, if it is for the
    /// runtime); any other daemon passes it on.
    fn arrived_up(&mut self, t: Travelling, out: &mut Vec<Output>) {
        if self.rank != 0 {
            out.push(Output::ToParent(t));
            return;
        }
        if t.audience == Audience::Runtime {
            out.push(Output::Log(format!(
                "event {} for the runtime from {:?}: {:?}",
                t.event.code, t.event.source, t.event.info
            )));
            return;
        }
        self.deliver(&t, out);
        out.push(Output::ToChildren(t));
    }

    /// Hands `t` to the clients of this node its audience names.
    fn deliver(&mut self, t: &Travelling, out: &mut Vec<Output>) {
        let ev = t.event.clone();
        if ev.level == Level::Environment {
            return deliveries(self.server.environment_event(ev), out);
        }
        match &t.audience {
            Audience::Nobody | Audience::Runtime => {}
            Audience::Everyone => {
                let jobs: BTreeSet<String> = self
                    .local
                    .keys()
                    .cloned()
                    .chain(self.procs.values().map(|p| p.nspace.clone()))
                    .collect();
                for ns in jobs {
                    let ranks = self.ranks_here(&ns);
                    deliveries(self.server.job_event(&ns, &ranks, ev.clone()), out);
                }
                deliveries(self.server.tools_event(ev), out);
            }
            Audience::Job { nspace } => {
                let ranks = self.ranks_here(nspace);
                if !ranks.is_empty() {
                    deliveries(self.server.job_event(nspace, &ranks, ev), out);
                }
            }
            Audience::Procs { procs } => {
                let mut by_job: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
                let tools_here = format!("tool@{}.", self.rank);
                for p in procs {
                    // A client connected here by its connection's name (a tool, or a job
                    // process that made a request), as the controller names requesters.
                    if let Some(link) = p
                        .nspace
                        .strip_prefix(&tools_here)
                        .and_then(|l| l.parse::<u64>().ok())
                    {
                        deliveries(self.server.tool_event(link, ev.clone()), out);
                        continue;
                    }
                    let here = self.ranks_here(&p.nspace);
                    if p.rank == RANK_WILDCARD {
                        by_job.entry(&p.nspace).or_default().extend(here);
                    } else if here.contains(&p.rank) {
                        by_job.entry(&p.nspace).or_default().insert(p.rank);
                    }
                }
                by_job.retain(|_, ranks| !ranks.is_empty());
                for (ns, ranks) in by_job {
                    deliveries(self.server.job_event(ns, &ranks, ev.clone()), out);
                }
            }
        }
    }

    /// The processes of job `nspace` on this node: those job-exec named, and any connected.
    fn ranks_here(&self, nspace: &str) -> BTreeSet<u32> {
        let mut r = self.local.get(nspace).cloned().unwrap_or_default();
        r.extend(self.server.connected_ranks(nspace));
        r
    }
}

fn deliveries(ds: Vec<Delivery>, out: &mut Vec<Output>) {
    out.extend(ds.into_iter().map(|d| Output::ToClient {
        link: d.client,
        down: EventDown::Deliver { event: d.event },
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvmlab_proto::event::{Directives, EventDown, Range};

    fn p(ns: &str, rank: u32) -> Proc {
        Proc {
            nspace: ns.into(),
            rank,
        }
    }

    /// The hub of daemon `rank` under a parent that sends it every event, so that its tools'
    /// registrations are answered at once (the tests of interest below lift that).
    fn daemon(rank: u32) -> EventHub {
        let mut h = EventHub::new(rank, 512);
        assert!(h.handle(Input::Uplink(Up::Older)).is_empty());
        h
    }

    fn connect(h: &mut EventHub, link: Link, proc: Option<Proc>) {
        assert!(h.handle(Input::Connected { link, proc }).is_empty());
        register(h, link);
    }

    /// Client `link` registers a handler for every event; what the hub says.
    fn register(h: &mut EventHub, link: Link) -> Vec<Output> {
        h.handle(Input::FromClient {
            link,
            up: EventUp::Register {
                id: 1,
                codes: vec![],
                directives: Directives::default(),
            },
        })
    }

    fn notify(range: Range, targets: Vec<Proc>) -> EventUp {
        EventUp::Notify {
            code: -3001,
            range,
            targets,
            info: vec![],
        }
    }

    fn delivered_to(out: &[Output]) -> Vec<Link> {
        out.iter()
            .filter_map(|o| match o {
                Output::ToClient {
                    link,
                    down: EventDown::Deliver { .. },
                } => Some(*link),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_local_range_stays_on_the_node_and_reaches_everyone_there() {
        let mut h = daemon(1);
        connect(&mut h, 1, Some(p("a", 0)));
        connect(&mut h, 2, Some(p("b", 0)));
        connect(&mut h, 3, None);
        let out = h.handle(Input::FromClient {
            link: 1,
            up: notify(Range::Local, vec![]),
        });
        assert_eq!(delivered_to(&out), [1, 2, 3]);
        assert!(!out
            .iter()
            .any(|o| matches!(o, Output::ToParent(_) | Output::ToChildren(_))));
    }

    #[test]
    fn a_namespace_event_goes_up_then_down_and_reaches_only_that_job() {
        let mut first = daemon(1);
        connect(&mut first, 1, Some(p("a", 0)));
        let out = first.handle(Input::FromClient {
            link: 1,
            up: notify(Range::Namespace, vec![]),
        });
        let [Output::ToClient {
            down: EventDown::Notified,
            ..
        }, Output::ToParent(t)] = &out[..]
        else {
            panic!("{out:?}")
        };
        let mut ctl = EventHub::new(0, 512);
        let down = ctl.handle(Input::FromBelow(t.clone()));
        let [Output::ToChildren(t)] = &down[..] else {
            panic!("{down:?}")
        };
        let mut other = daemon(1);
        connect(&mut other, 7, Some(p("a", 1)));
        connect(&mut other, 8, Some(p("b", 0)));
        let got = other.handle(Input::FromAbove(t.clone()));
        assert_eq!(delivered_to(&got), [7]);
        assert!(matches!(got.last(), Some(Output::ToChildren(_))));
    }

    #[test]
    fn an_event_for_one_tool_reaches_that_tool_alone_on_its_daemon() {
        let mut h = daemon(3);
        connect(&mut h, 4, None);
        connect(&mut h, 5, None);
        connect(&mut h, 6, Some(p("a", 0)));
        let ev = |who: &str| {
            Input::FromAbove(Travelling {
                audience: Audience::Procs {
                    procs: vec![p(who, 0)],
                },
                event: Event {
                    code: -195,
                    source: None,
                    info: vec![],
                    level: Level::Job,
                },
            })
        };
        assert_eq!(delivered_to(&h.handle(ev("tool@3.5"))), [5]);
        assert!(
            delivered_to(&h.handle(ev("tool@2.5"))).is_empty(),
            "another daemon's tool"
        );
        h.handle(Input::Connected {
            link: 7,
            proc: None,
        });
        assert!(
            delivered_to(&h.handle(ev("tool@3.7"))).is_empty(),
            "a tool that did not register hears nothing"
        );
    }

    #[test]
    fn a_custom_event_reaches_its_targets_and_a_late_target_gets_it_on_registering() {
        let mut h = EventHub::new(0, 512);
        h.handle(Input::LocalProcs {
            nspace: "a".into(),
            ranks: vec![0, 1, 2],
        });
        connect(&mut h, 1, Some(p("a", 0)));
        connect(&mut h, 2, Some(p("a", 1)));
        let out = h.handle(Input::Raise(Travelling {
            audience: Audience::Procs {
                procs: vec![p("a", 1), p("a", 2)],
            },
            event: Event {
                code: -7,
                source: None,
                info: vec![],
                level: Level::Job,
            },
        }));
        assert_eq!(delivered_to(&out), [2], "rank 0 is not a target");
        h.handle(Input::Connected {
            link: 3,
            proc: Some(p("a", 2)),
        });
        let late = h.handle(Input::FromClient {
            link: 3,
            up: EventUp::Register {
                id: 1,
                codes: vec![-7],
                directives: Directives::default(),
            },
        });
        assert_eq!(delivered_to(&late), [3]);
    }

    #[test]
    fn an_rm_event_stops_at_the_controller_and_proc_local_never_leaves_the_client() {
        let mut ctl = EventHub::new(0, 512);
        connect(&mut ctl, 1, Some(p("a", 0)));
        let out = ctl.handle(Input::FromClient {
            link: 1,
            up: notify(Range::Rm, vec![]),
        });
        assert!(
            matches!(&out[..], [Output::ToClient { down: EventDown::Notified, .. }, Output::Log(l)] if l.contains("for the runtime"))
        );
        let out = ctl.handle(Input::FromClient {
            link: 1,
            up: notify(Range::ProcLocal, vec![]),
        });
        assert!(matches!(
            &out[..],
            [Output::ToClient {
                down: EventDown::Notified,
                ..
            }]
        ));
    }

    #[test]
    fn a_custom_event_to_a_wildcard_rank_reaches_every_process_of_that_job_and_names_its_tool() {
        let mut h = daemon(3);
        h.handle(Input::LocalProcs {
            nspace: "a".into(),
            ranks: vec![0, 1],
        });
        connect(&mut h, 1, Some(p("a", 0)));
        connect(&mut h, 2, Some(p("a", 1)));
        connect(&mut h, 3, Some(p("b", 0)));
        connect(&mut h, 4, None);
        let t = |up: EventUp| {
            let EventUp::Notify {
                code,
                range,
                targets,
                info,
            } = up
            else {
                unreachable!()
            };
            Travelling {
                audience: crate::event::range::audience(range, &p("x", 0), &targets),
                event: Event {
                    code,
                    source: None,
                    info,
                    level: Level::Job,
                },
            }
        };
        let out = h.handle(Input::FromAbove(t(notify(
            Range::Custom,
            vec![p("a", dvmlab_proto::event::RANK_WILDCARD)],
        ))));
        assert_eq!(delivered_to(&out), [1, 2]);
        // A tool's notification names it as its source.
        let out = h.handle(Input::FromClient {
            link: 4,
            up: notify(Range::Local, vec![]),
        });
        let sources: Vec<Option<Proc>> = out
            .iter()
            .filter_map(|o| match o {
                Output::ToClient {
                    down: EventDown::Deliver { event },
                    ..
                } => Some(event.source.clone()),
                _ => None,
            })
            .collect();
        assert!(
            !sources.is_empty() && sources.iter().all(|s| *s == Some(p("tool@3.4", 0))),
            "{sources:?}"
        );
    }

    #[test]
    fn an_oversized_notification_is_refused_and_goes_nowhere() {
        let mut h = daemon(1);
        connect(&mut h, 1, Some(p("a", 0)));
        let out = h.handle(Input::FromClient {
            link: 1,
            up: EventUp::Notify {
                code: -3001,
                range: Range::Global,
                targets: vec![],
                info: vec![dvmlab_proto::event::Info {
                    key: "big".into(),
                    value: "x".repeat(dvmlab_proto::event::MAX_EVENT_BYTES).into(),
                }],
            },
        });
        assert!(
            matches!(&out[..], [Output::ToClient { link: 1, down: EventDown::NotifyRefused { reason } }] if reason.contains("at most")),
            "{out:?}"
        );
    }

    #[test]
    fn an_event_kept_for_a_process_the_runtime_did_not_launch_goes_when_it_disconnects() {
        let mut h = EventHub::new(0, 512);
        h.handle(Input::Connected {
            link: 1,
            proc: Some(p("stray", 0)),
        });
        h.handle(Input::Raise(Travelling {
            audience: Audience::Job {
                nspace: "stray".into(),
            },
            event: Event {
                code: -7,
                source: None,
                info: vec![],
                level: Level::Job,
            },
        }));
        assert_eq!(h.server.kept().len(), 1, "kept for its registration");
        h.handle(Input::Gone { link: 1 });
        assert!(h.server.kept().is_empty());
    }

    #[test]
    fn environment_events_reach_environment_registrations_on_every_node() {
        let mut h = daemon(1);
        connect(&mut h, 1, Some(p("a", 0)));
        h.handle(Input::Connected {
            link: 2,
            proc: None,
        });
        h.handle(Input::FromClient {
            link: 2,
            up: EventUp::Register {
                id: 1,
                codes: vec![-231],
                directives: Directives {
                    enviro_level: Some(true),
                    ..Directives::default()
                },
            },
        });
        let out = h.handle(Input::FromAbove(Travelling {
            audience: Audience::Everyone,
            event: Event {
                code: -231,
                source: None,
                info: vec![],
                level: Level::Environment,
            },
        }));
        assert_eq!(delivered_to(&out), [2]);
    }

    #[test]
    fn a_client_deregisters_by_its_own_ids() {
        let mut h = daemon(1);
        h.handle(Input::Connected {
            link: 1,
            proc: None,
        });
        for id in [40, 41] {
            h.handle(Input::FromClient {
                link: 1,
                up: EventUp::Register {
                    id,
                    codes: vec![-3001 - (id as i32 - 40)],
                    directives: Directives::default(),
                },
            });
        }
        h.handle(Input::FromClient {
            link: 1,
            up: EventUp::Deregister { id: 40 },
        });
        let local = |code| EventUp::Notify {
            code,
            range: Range::Local,
            targets: vec![],
            info: vec![],
        };
        let gone = h.handle(Input::FromClient {
            link: 1,
            up: local(-3001),
        });
        assert!(delivered_to(&gone).is_empty());
        let kept = h.handle(Input::FromClient {
            link: 1,
            up: local(-3002),
        });
        assert_eq!(delivered_to(&kept), [1]);
    }

    /// Daemon 2, under a parent that reads interest, with tool 5 registered and its answer
    /// held: nothing is counted above yet.
    fn waiting_tool() -> EventHub {
        let mut h = EventHub::new(2, 512);
        assert!(h.handle(Input::Uplink(Up::Reads)).is_empty());
        let tool = Input::Connected {
            link: 5,
            proc: None,
        };
        assert!(h.handle(tool).is_empty());
        assert_eq!(
            register(&mut h, 5),
            [Output::InterestUp { on: true, seq: 1 }]
        );
        h
    }

    /// An event for everyone, of `level`.
    fn everyone(code: i32, level: Level) -> Travelling {
        Travelling {
            audience: Audience::Everyone,
            event: Event {
                code,
                source: None,
                info: vec![],
                level,
            },
        }
    }

    #[test]
    fn a_tools_registration_is_answered_once_the_controller_counted_it_and_what_came_meanwhile_follows(
    ) {
        let mut h = waiting_tool();
        // An event for the tool while it waits is held behind its answer.
        let job_end = everyone(-145, Level::Job);
        let out = h.handle(Input::FromAbove(job_end));
        assert!(
            out.iter().all(|o| !matches!(o, Output::ToClient { .. })),
            "{out:?}"
        );
        let out = h.handle(Input::InterestSeen { seq: 1 });
        let downs: Vec<&EventDown> = out
            .iter()
            .filter_map(|o| match o {
                Output::ToClient { link: 5, down } => Some(down),
                _ => None,
            })
            .collect();
        assert!(
            matches!(
                downs[..],
                [EventDown::Registered { id: 1 }, EventDown::Deliver { .. }]
            ),
            "{out:?}"
        );
        // Registered from now on, the next tool is answered at once; the last one gone, the
        // interest goes with it.
        h.handle(Input::Connected {
            link: 6,
            proc: None,
        });
        assert!(register(&mut h, 6).contains(&Output::ToClient {
            link: 6,
            down: EventDown::Registered { id: 1 }
        }));
        assert!(h.handle(Input::Gone { link: 5 }).is_empty());
        assert_eq!(
            h.handle(Input::Gone { link: 6 }),
            [Output::InterestUp { on: false, seq: 2 }]
        );
    }

    #[test]
    fn a_job_process_is_answered_at_once_and_brings_no_interest() {
        let mut h = EventHub::new(2, 512);
        h.handle(Input::Uplink(Up::Reads));
        h.handle(Input::LocalProcs {
            nspace: "dvm@1".into(),
            ranks: vec![0],
        });
        h.handle(Input::Connected {
            link: 5,
            proc: Some(p("dvm@1", 0)),
        });
        assert_eq!(
            register(&mut h, 5),
            [Output::ToClient {
                link: 5,
                down: EventDown::Registered { id: 1 }
            }]
        );
    }

    #[test]
    fn a_job_event_goes_down_only_where_a_job_runs_or_a_tool_registered_and_the_environments_everywhere(
    ) {
        let mut h = EventHub::new(0, 512);
        let job = everyone(-145, Level::Job);
        assert!(!h.goes_down(&job, 4, false, true));
        assert!(h.goes_down(&job, 4, true, true));
        // A child too old to say gets everything.
        assert!(h.goes_down(&job, 4, false, false));
        assert!(h.goes_down(&everyone(-100, Level::Environment), 4, false, true));
        assert_eq!(
            h.handle(Input::ChildInterest {
                child: 4,
                on: true,
                seq: 1
            }),
            [Output::InterestSeen { child: 4, seq: 1 }]
        );
        assert!(h.goes_down(&job, 4, false, true));
        assert!(!h.goes_down(&job, 5, false, true));
        // A child link gone takes its interest with it.
        h.handle(Input::Children {
            live: BTreeSet::from([5]),
            older: BTreeSet::new(),
        });
        assert!(!h.goes_down(&job, 4, false, true));
    }

    #[test]
    fn events_held_for_a_tool_waiting_for_its_answer_are_bounded_and_the_rest_logged() {
        let mut h = waiting_tool();
        let mut logged = 0;
        for _ in 0..MAX_HELD_EVENTS + 10 {
            let out = h.handle(Input::FromAbove(everyone(-145, Level::Job)));
            assert!(out.iter().all(|o| !matches!(o, Output::ToClient { .. })));
            logged += out.iter().filter(|o| matches!(o, Output::Log(_))).count();
        }
        assert_eq!(logged, 10);
        let out = h.handle(Input::InterestSeen { seq: 1 });
        let delivered = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::ToClient {
                        link: 5,
                        down: EventDown::Deliver { .. }
                    }
                )
            })
            .count();
        assert_eq!(delivered, MAX_HELD_EVENTS);
        assert!(matches!(
            out.first(),
            Some(Output::ToClient {
                link: 5,
                down: EventDown::Registered { id: 1 }
            })
        ));
    }

    #[test]
    fn a_tool_that_takes_its_registration_back_before_the_answer_has_it_at_once() {
        let mut h = waiting_tool();
        let out = h.handle(Input::FromClient {
            link: 5,
            up: EventUp::Deregister { id: 1 },
        });
        assert_eq!(
            out,
            [
                Output::InterestUp { on: false, seq: 2 },
                Output::ToClient {
                    link: 5,
                    down: EventDown::Registered { id: 1 }
                }
            ]
        );
    }

    #[test]
    fn answers_held_for_a_tool_that_does_not_wait_for_them_are_bounded() {
        let mut h = waiting_tool();
        let mut logged = 0;
        for _ in 0..MAX_HELD_ANSWERS + 10 {
            let out = h.handle(Input::FromClient {
                link: 5,
                up: notify(Range::Local, vec![]),
            });
            assert!(out.iter().all(|o| !matches!(o, Output::ToClient { .. })));
            logged += out.iter().filter(|o| matches!(o, Output::Log(_))).count();
        }
        assert!(logged > 0);
        let out = h.handle(Input::InterestSeen { seq: 1 });
        let answers = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::ToClient {
                        link: 5,
                        down: EventDown::Registered { .. } | EventDown::Notified
                    }
                )
            })
            .count();
        assert_eq!(answers, MAX_HELD_ANSWERS);
    }

    #[test]
    fn registrations_of_a_tool_that_does_not_wait_for_their_answers_are_bounded() {
        let mut h = waiting_tool();
        let mut logged = 0;
        for _ in 0..MAX_HELD_ANSWERS + 10 {
            let out = register(&mut h, 5);
            logged += out.iter().filter(|o| matches!(o, Output::Log(_))).count();
        }
        assert_eq!(logged, 11);
        let out = h.handle(Input::InterestSeen { seq: 1 });
        let answers = out
            .iter()
            .filter(|o| matches!(o, Output::ToClient { link: 5, .. }))
            .count();
        assert_eq!(answers, MAX_HELD_ANSWERS);
    }
}
