//! The events side of one job process or tool, without IO: its registrations, the events
//! waiting to be served, the one chain in service, and what must be told to its daemon.
//!
//! Events are served one at a time, in arrival order, each through its whole chain. A
//! registration is kept here and mirrored to the daemon (which needs it to know what to
//! send, and what it kept that now matches). `PROC_LOCAL` notifications and the internal
//! lost-server event are served here and never sent anywhere.

use std::collections::VecDeque;

use dvmlab_proto::event::{
    Completion, Directives, Event, EventUp, HandlerResult, Info, Level, Proc, Range, Status,
    ERR_LOST_CONNECTION,
};

use super::chain::{Chain, Invocation, Step};
use super::registry::{RegId, RegisterError, Registry};

/// Most events waiting to be served in one process; past it the oldest waiting is dropped
/// (and counted), so a flood cannot grow a process without bound.
pub const MAX_WAITING: usize = 1024;

/// Something the process's IO shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Run this handler, then report [`EventClient::handler_done`].
    Invoke(Invocation),
    Send(EventUp),
    /// An event's chain ended: every handler that ran, and what it returned; `internal`
    /// for the lost-server event this process raised itself.
    Served {
        event: Event,
        results: Vec<HandlerResult>,
        internal: bool,
    },
}

/// One process's events.
#[derive(Debug)]
pub struct EventClient {
    me: Option<Proc>,
    registry: Registry,
    /// Events to serve, each with whether this process raised it itself.
    waiting: VecDeque<(Event, bool)>,
    serving: Option<(Event, bool, Chain)>,
    connected: bool,
    /// Events dropped from a full queue.
    pub dropped: u64,
}

impl EventClient {
    /// The events of process `me` (`None` for a tool).
    pub fn new(me: Option<Proc>) -> EventClient {
        EventClient {
            me,
            registry: Registry::new(),
            waiting: VecDeque::new(),
            serving: None,
            connected: true,
            dropped: 0,
        }
    }

    /// The job process this is (`None` for a tool).
    pub fn me(&self) -> Option<&Proc> {
        self.me.as_ref()
    }

    pub fn register(
        &mut self,
        codes: Vec<Status>,
        directives: Directives,
    ) -> Result<(RegId, Vec<Output>), RegisterError> {
        let id = self.registry.register(codes.clone(), directives.clone())?;
        let out = if self.connected {
            vec![Output::Send(EventUp::Register {
                id,
                codes,
                directives,
            })]
        } else {
            Vec::new()
        };
        Ok((id, out))
    }

    /// Removes a registration, also from inside its own handler.
    pub fn deregister(&mut self, id: RegId) -> Vec<Output> {
        if self.registry.deregister(id) && self.connected {
            vec![Output::Send(EventUp::Deregister { id })]
        } else {
            Vec::new()
        }
    }

    /// This process notifies an event: `PROC_LOCAL` is served here only; anything else
    /// goes to the daemon, which delivers it (back here too, if the range includes us).
    pub fn notify(
        &mut self,
        code: Status,
        range: Range,
        targets: Vec<Proc>,
        info: Vec<Info>,
    ) -> Vec<Output> {
        if range == Range::ProcLocal {
            let ev = Event {
                code,
                source: self.me.clone(),
                info,
                level: Level::Job,
            };
            return self.arrived(ev);
        }
        if !self.connected {
            return Vec::new();
        }
        vec![Output::Send(EventUp::Notify {
            code,
            range,
            targets,
            info,
        })]
    }

    /// An event from the daemon.
    pub fn arrived(&mut self, ev: Event) -> Vec<Output> {
        self.queue(ev, false)
    }

    fn queue(&mut self, ev: Event, internal: bool) -> Vec<Output> {
        if self.waiting.len() >= MAX_WAITING {
            self.waiting.pop_front();
            self.dropped += 1;
        }
        self.waiting.push_back((ev, internal));
        self.pump()
    }

    /// The connection to the daemon is gone: the internal lost-connection event, served
    /// here and never sent.
    pub fn server_lost(&mut self) -> Vec<Output> {
        if !self.connected {
            return Vec::new();
        }
        self.connected = false;
        let ev = Event {
            code: ERR_LOST_CONNECTION,
            source: None,
            info: Vec::new(),
            level: Level::Job,
        };
        self.queue(ev, true)
    }

    /// Handler `reg` completed (now or long after it was invoked).
    pub fn handler_done(&mut self, reg: RegId, how: Completion, results: Vec<Info>) -> Vec<Output> {
        if let Some((_, _, chain)) = &mut self.serving {
            if chain.complete(reg, how, results).is_err() {
                return Vec::new();
            }
        }
        self.pump()
    }

    /// Serves events until a handler is running or none is waiting.
    fn pump(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        loop {
            if self.serving.is_none() {
                let Some((ev, internal)) = self.waiting.pop_front() else {
                    return out;
                };
                let chain = Chain::new(&self.registry, ev.clone());
                self.serving = Some((ev, internal, chain));
            }
            let Some((ev, internal, chain)) = &mut self.serving else {
                return out;
            };
            match chain.step(&self.registry) {
                Step::Invoke(inv) => {
                    out.push(Output::Invoke(inv));
                    return out;
                }
                Step::Waiting(_) => return out,
                Step::Done(results) => {
                    out.push(Output::Served {
                        event: ev.clone(),
                        results,
                        internal: *internal,
                    });
                    self.serving = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Option<Proc> {
        Some(Proc {
            nspace: "job".into(),
            rank: 0,
        })
    }

    #[test]
    fn proc_local_and_lost_server_events_are_served_here_and_never_sent() {
        let mut c = EventClient::new(me());
        let (id, sent) = c.register(vec![], Directives::default()).unwrap();
        assert!(matches!(sent[..], [Output::Send(EventUp::Register { .. })]));
        let out = c.notify(-3001, Range::ProcLocal, vec![], vec![]);
        assert!(
            matches!(&out[..], [Output::Invoke(inv)] if inv.reg == id && inv.event.source == me())
        );
        let out = c.handler_done(id, Completion::NoActionTaken, vec![]);
        assert!(matches!(&out[..], [Output::Served { .. }]));
        let out = c.server_lost();
        assert!(matches!(&out[..], [Output::Invoke(inv)] if inv.event.code == ERR_LOST_CONNECTION));
        assert!(out.iter().all(|o| !matches!(o, Output::Send(_))));
        assert!(
            c.notify(-3001, Range::Global, vec![], vec![]).is_empty(),
            "nothing is sent once the server is gone"
        );
    }

    #[test]
    fn events_are_served_one_chain_at_a_time_in_arrival_order() {
        let mut c = EventClient::new(me());
        let (a, _) = c.register(vec![], Directives::default()).unwrap();
        let ev = |code| Event {
            code,
            source: None,
            info: vec![],
            level: Level::Job,
        };
        let first = c.arrived(ev(-1));
        assert!(matches!(&first[..], [Output::Invoke(i)] if i.event.code == -1));
        assert!(c.arrived(ev(-2)).is_empty(), "waits for the running chain");
        let next = c.handler_done(a, Completion::ActionComplete, vec![]);
        assert!(
            matches!(&next[..], [Output::Served { event, .. }, Output::Invoke(i)] if event.code == -1 && i.event.code == -2)
        );
    }

    #[test]
    fn a_flood_of_events_is_bounded() {
        let mut c = EventClient::new(me());
        c.register(vec![], Directives::default()).unwrap();
        for i in 0..(MAX_WAITING + 10) as i32 {
            c.arrived(Event {
                code: -i,
                source: None,
                info: vec![],
                level: Level::Job,
            });
        }
        assert_eq!(
            c.dropped, 9,
            "one is in service, the queue holds the newest"
        );
    }
}
