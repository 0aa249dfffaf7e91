//! One event's way through a process's handlers (RFC 0002's chain), without IO.
//!
//! The chain calls one handler at a time, in the registry's service order, and waits for it
//! to complete — at once or much later; an asynchronous handler simply completes later. Each
//! handler is given its registration id, the event's code, source and info, and the results
//! of every handler before it. A handler that completes with `ACTION_COMPLETE` ends the
//! chain. A handler deregistered before its turn is skipped; one that deregisters itself
//! while it runs still completes normally.

use std::collections::VecDeque;

use dvmlab_proto::event::{Completion, Event, HandlerResult, Info};

use super::registry::{RegId, Registry};

/// Most results one handler may add (each stays in every later handler's results array).
pub const MAX_RESULTS_PER_HANDLER: usize = 64;

/// A call the caller must make: run handler `reg` with what it is given here.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    pub reg: RegId,
    pub event: Event,
    pub results: Vec<HandlerResult>,
}

/// What the chain wants next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Call this handler, then [`Chain::complete`] it.
    Invoke(Invocation),
    /// A handler is running; wait for it to complete.
    Waiting(RegId),
    /// The chain is over: what every handler that ran returned.
    Done(Vec<HandlerResult>),
}

/// Why a completion was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// Completing a handler that is not the one running.
    NotRunning { reg: RegId },
}

/// One event in service.
#[derive(Debug)]
pub struct Chain {
    event: Event,
    pending: VecDeque<RegId>,
    running: Option<(RegId, String)>,
    results: Vec<HandlerResult>,
    over: bool,
}

impl Chain {
    /// The chain of `event` over the handlers `registry` serves it to now.
    pub fn new(registry: &Registry, event: Event) -> Chain {
        Chain {
            pending: registry.matching(event.code, event.level).into(),
            event,
            running: None,
            results: Vec::new(),
            over: false,
        }
    }

    /// The next thing to do. Handlers deregistered since the chain began are skipped.
    pub fn step(&mut self, registry: &Registry) -> Step {
        if let Some((reg, _)) = &self.running {
            return Step::Waiting(*reg);
        }
        if !self.over {
            while let Some(reg) = self.pending.pop_front() {
                let Some(r) = registry.get(reg) else {
                    continue;
                };
                self.running = Some((reg, r.name().to_string()));
                return Step::Invoke(Invocation {
                    reg,
                    event: self.event.clone(),
                    results: self.results.clone(),
                });
            }
            self.over = true;
        }
        Step::Done(self.results.clone())
    }

    /// Handler `reg` completed with `how` and its results (at most
    /// [`MAX_RESULTS_PER_HANDLER`] kept).
    pub fn complete(
        &mut self,
        reg: RegId,
        how: Completion,
        mut results: Vec<Info>,
    ) -> Result<(), ChainError> {
        match self.running.take() {
            Some((r, name)) if r == reg => {
                results.truncate(MAX_RESULTS_PER_HANDLER);
                self.results.push(HandlerResult {
                    name,
                    status: how.status(),
                    results,
                });
                if how == Completion::ActionComplete {
                    self.over = true;
                    self.pending.clear();
                }
                Ok(())
            }
            other => {
                self.running = other;
                Err(ChainError::NotRunning { reg })
            }
        }
    }

    pub fn is_over(&self) -> bool {
        self.over && self.running.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvmlab_proto::event::{Directives, Level, Status};
    use serde_json::Value;

    fn event(code: Status) -> Event {
        Event {
            code,
            source: None,
            info: vec![],
            level: Level::Job,
        }
    }

    fn reg(r: &mut Registry, codes: Vec<Status>, name: &str) -> RegId {
        r.register(
            codes,
            Directives {
                name: Some(name.into()),
                ..Directives::default()
            },
        )
        .unwrap()
    }

    /// Runs the chain, each handler completing as `how` says; the names called in order.
    fn run(
        r: &mut Registry,
        ev: Event,
        how: impl Fn(&str) -> Completion,
    ) -> (Vec<String>, Vec<HandlerResult>) {
        let mut c = Chain::new(r, ev);
        let mut called = Vec::new();
        loop {
            match c.step(r) {
                Step::Invoke(inv) => {
                    let name = r.get(inv.reg).unwrap().name().to_string();
                    assert_eq!(
                        inv.results.len(),
                        called.len(),
                        "one result per prior handler"
                    );
                    called.push(name.clone());
                    let extra = vec![Info {
                        key: format!("by.{name}"),
                        value: Value::Bool(true),
                    }];
                    c.complete(inv.reg, how(&name), extra).unwrap();
                }
                Step::Waiting(_) => unreachable!("every handler completed at once"),
                Step::Done(res) => return (called, res),
            }
        }
    }

    #[test]
    fn each_handler_sees_every_prior_result_keyed_by_name_with_its_status() {
        let mut r = Registry::new();
        reg(&mut r, vec![-231], "first");
        reg(&mut r, vec![], "second");
        let unnamed = r.register(vec![], Directives::default()).unwrap();
        let (called, res) = run(&mut r, event(-231), |_| Completion::PartialActionTaken);
        assert_eq!(called, ["first", "second", ""]);
        assert_eq!(res.len(), 3);
        let shape = res[0].to_info();
        assert_eq!(shape.key, "first");
        let arr = shape.value.as_array().unwrap();
        assert_eq!(arr[0], serde_json::json!({"key": "first", "value": -332}));
        assert_eq!(
            arr[1],
            serde_json::json!({"key": "by.first", "value": true})
        );
        assert_eq!(
            res[2].name, "",
            "an unnamed handler's entry has an empty key"
        );
        assert!(r.get(unnamed).is_some());
    }

    #[test]
    fn action_complete_ends_the_chain() {
        let mut r = Registry::new();
        reg(&mut r, vec![-231], "a");
        reg(&mut r, vec![-231], "b");
        reg(&mut r, vec![], "c");
        let (called, res) = run(&mut r, event(-231), |n| {
            if n == "b" {
                Completion::ActionComplete
            } else {
                Completion::NoActionTaken
            }
        });
        assert_eq!(called, ["a", "b"]);
        assert_eq!(res.last().unwrap().status, -334);
    }

    #[test]
    fn the_chain_waits_for_a_handler_that_completes_later() {
        let mut r = Registry::new();
        let a = reg(&mut r, vec![], "a");
        let b = reg(&mut r, vec![], "b");
        let mut c = Chain::new(&r, event(-7));
        let Step::Invoke(inv) = c.step(&r) else {
            panic!()
        };
        assert_eq!(inv.reg, a);
        assert_eq!(c.step(&r), Step::Waiting(a));
        assert_eq!(
            c.complete(b, Completion::NoActionTaken, vec![]),
            Err(ChainError::NotRunning { reg: b })
        );
        c.complete(a, Completion::ActionDeferred, vec![]).unwrap();
        let Step::Invoke(inv) = c.step(&r) else {
            panic!()
        };
        assert_eq!((inv.reg, inv.results[0].status), (b, -333));
    }

    #[test]
    fn a_handler_deregistering_itself_completes_and_one_deregistered_before_its_turn_is_skipped() {
        let mut r = Registry::new();
        let a = reg(&mut r, vec![], "a");
        let b = reg(&mut r, vec![], "b");
        let c3 = reg(&mut r, vec![], "c");
        let mut c = Chain::new(&r, event(-7));
        let Step::Invoke(inv) = c.step(&r) else {
            panic!()
        };
        assert_eq!(inv.reg, a);
        assert!(r.deregister(a));
        assert!(r.deregister(b));
        c.complete(a, Completion::NoActionTaken, vec![]).unwrap();
        let Step::Invoke(inv) = c.step(&r) else {
            panic!()
        };
        assert_eq!(inv.reg, c3);
        c.complete(c3, Completion::NoActionTaken, vec![]).unwrap();
        let Step::Done(res) = c.step(&r) else {
            panic!()
        };
        assert_eq!(
            res.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert!(c.is_over());
    }
}
