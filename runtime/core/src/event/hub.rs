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
//! event for a job waits for those that have not connected yet.

use std::collections::{BTreeMap, BTreeSet};

use dvmlab_proto::event::{
    Audience, Event, EventDown, EventUp, Level, Proc, Travelling, RANK_WILDCARD,
};

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
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    ToClient { link: Link, down: EventDown },
    ToParent(Travelling),
    ToChildren(Travelling),
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
}

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
        }
    }

    pub fn handle(&mut self, input: Input) -> Vec<Output> {
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
        }
        out
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
                    self.ids.insert((link, id), reg);
                    out.push(Output::ToClient {
                        link,
                        down: EventDown::Registered { id },
                    });
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

    fn connect(h: &mut EventHub, link: Link, proc: Option<Proc>) {
        assert!(h.handle(Input::Connected { link, proc }).is_empty());
        h.handle(Input::FromClient {
            link,
            up: EventUp::Register {
                id: 1,
                codes: vec![],
                directives: Directives::default(),
            },
        });
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
        let mut h = EventHub::new(1, 512);
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
        let mut daemon = EventHub::new(1, 512);
        connect(&mut daemon, 1, Some(p("a", 0)));
        let out = daemon.handle(Input::FromClient {
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
        let mut other = EventHub::new(1, 512);
        connect(&mut other, 7, Some(p("a", 1)));
        connect(&mut other, 8, Some(p("b", 0)));
        let got = other.handle(Input::FromAbove(t.clone()));
        assert_eq!(delivered_to(&got), [7]);
        assert!(matches!(got.last(), Some(Output::ToChildren(_))));
    }

    #[test]
    fn an_event_for_one_tool_reaches_that_tool_alone_on_its_daemon() {
        let mut h = EventHub::new(3, 512);
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
        let mut h = EventHub::new(3, 512);
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
        let mut h = EventHub::new(1, 512);
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
        let mut h = EventHub::new(1, 512);
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
        let mut h = EventHub::new(1, 512);
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
}
