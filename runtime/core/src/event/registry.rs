//! One process's event handler registrations and the order RFC 0002 gives them.
//!
//! Order of service for an event: handlers registered for exactly that code, then handlers
//! registered for a group of codes containing it, then default handlers (no codes); inside
//! each class, first come first served, except that a handler registered with `prepend` goes
//! first in its class (the latest prepend first of all).
//!
//! The RFC also says a registration with no directives beyond its name "is considered a
//! default registration for purposes of servicing order". Read against the rules above, that
//! cannot move a handler registered for one code behind the group and default handlers (the
//! precedence rules put specific codes first, without exception). The reading taken here:
//! such a registration gets the *default position* — appended, first come first served, in
//! the class its codes give it — as opposed to one whose directives (prepend) move it.

use std::collections::VecDeque;

use dvmlab_proto::event::{Directives, Level, Status};

/// Most registrations one process may hold: a client registering thousands of handlers
/// gets an error, never unbounded memory in the daemon.
pub const MAX_REGISTRATIONS: usize = 1024;

/// Most codes one registration may name.
pub const MAX_CODES: usize = 64;

/// A registration's id, returned to the registrant and given to its handler.
pub type RegId = u64;

/// The precedence class of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Exactly one code.
    Specific,
    /// Several codes.
    Group,
    /// No codes: every event.
    Default,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub id: RegId,
    pub codes: Vec<Status>,
    pub directives: Directives,
}

impl Registration {
    pub fn class(&self) -> Class {
        match self.codes.len() {
            0 => Class::Default,
            1 => Class::Specific,
            _ => Class::Group,
        }
    }

    /// The name later handlers see: the one given, or empty.
    pub fn name(&self) -> &str {
        self.directives.name.as_deref().unwrap_or("")
    }

    fn matches(&self, code: Status, level: Level) -> bool {
        (self.codes.is_empty() || self.codes.contains(&code)) && self.directives.accepts(level)
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterError {
    TooMany { limit: usize },
    TooManyCodes { given: usize, limit: usize },
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterError::TooMany { limit } => {
                write!(f, "at most {limit} event registrations per process")
            }
            RegisterError::TooManyCodes { given, limit } => {
                write!(f, "{given} codes in one registration; at most {limit}")
            }
        }
    }
}

/// Every registration of one process, by class, in service order.
#[derive(Debug, Default)]
pub struct Registry {
    specific: VecDeque<Registration>,
    group: VecDeque<Registration>,
    default: VecDeque<Registration>,
    next: RegId,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    fn class_mut(&mut self, c: Class) -> &mut VecDeque<Registration> {
        match c {
            Class::Specific => &mut self.specific,
            Class::Group => &mut self.group,
            Class::Default => &mut self.default,
        }
    }

    fn len(&self) -> usize {
        self.specific.len() + self.group.len() + self.default.len()
    }

    /// Whether it holds no registration.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a handler for `codes` (none: every code); its id. Repeated codes count once.
    pub fn register(
        &mut self,
        mut codes: Vec<Status>,
        directives: Directives,
    ) -> Result<RegId, RegisterError> {
        if self.len() >= MAX_REGISTRATIONS {
            return Err(RegisterError::TooMany {
                limit: MAX_REGISTRATIONS,
            });
        }
        if codes.len() > MAX_CODES {
            return Err(RegisterError::TooManyCodes {
                given: codes.len(),
                limit: MAX_CODES,
            });
        }
        codes.sort_unstable();
        codes.dedup();
        self.next += 1;
        let r = Registration {
            id: self.next,
            codes,
            directives,
        };
        let prepend = r.directives.prepend;
        let class = self.class_mut(r.class());
        if prepend {
            class.push_front(r);
        } else {
            class.push_back(r);
        }
        Ok(self.next)
    }

    /// Removes registration `id`; whether it was there.
    pub fn deregister(&mut self, id: RegId) -> bool {
        for c in [Class::Specific, Class::Group, Class::Default] {
            let list = self.class_mut(c);
            if let Some(i) = list.iter().position(|r| r.id == id) {
                list.remove(i);
                return true;
            }
        }
        false
    }

    pub fn get(&self, id: RegId) -> Option<&Registration> {
        self.specific
            .iter()
            .chain(&self.group)
            .chain(&self.default)
            .find(|r| r.id == id)
    }

    /// The registrations an event of `code` at `level` is served to, in service order.
    pub fn matching(&self, code: Status, level: Level) -> Vec<RegId> {
        self.specific
            .iter()
            .chain(&self.group)
            .chain(&self.default)
            .filter(|r| r.matches(code, level))
            .map(|r| r.id)
            .collect()
    }

    /// Whether any registration would be served an event of `code` at `level`.
    pub fn wants(&self, code: Status, level: Level) -> bool {
        self.specific
            .iter()
            .chain(&self.group)
            .chain(&self.default)
            .any(|r| r.matches(code, level))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn named(n: &str) -> Directives {
        Directives {
            name: Some(n.into()),
            ..Directives::default()
        }
    }

    #[test]
    fn specific_codes_come_before_groups_before_defaults_whatever_the_registration_order() {
        let mut r = Registry::new();
        let d = r.register(vec![], named("default")).unwrap();
        let g = r.register(vec![-7, -231], named("group")).unwrap();
        let s = r.register(vec![-231], named("specific")).unwrap();
        assert_eq!(r.matching(-231, Level::Job), [s, g, d]);
        assert_eq!(r.matching(-7, Level::Job), [g, d]);
        assert_eq!(r.matching(-1, Level::Job), [d]);
    }

    #[test]
    fn prepend_goes_first_in_its_class_only() {
        let mut r = Registry::new();
        let a = r.register(vec![-231], named("a")).unwrap();
        let b = r.register(vec![-231], named("b")).unwrap();
        let p = r
            .register(
                vec![],
                Directives {
                    prepend: true,
                    ..named("p")
                },
            )
            .unwrap();
        let q = r
            .register(
                vec![-231],
                Directives {
                    prepend: true,
                    ..named("q")
                },
            )
            .unwrap();
        assert_eq!(r.matching(-231, Level::Job), [q, a, b, p]);
    }

    #[test]
    fn environment_events_reach_only_handlers_that_asked_for_them() {
        let mut r = Registry::new();
        let plain = r.register(vec![], named("plain")).unwrap();
        let job_only = r
            .register(
                vec![],
                Directives {
                    job_level: Some(true),
                    ..named("job")
                },
            )
            .unwrap();
        let env_only = r
            .register(
                vec![],
                Directives {
                    enviro_level: Some(true),
                    ..named("env")
                },
            )
            .unwrap();
        let both = r
            .register(
                vec![],
                Directives {
                    job_level: Some(true),
                    enviro_level: Some(true),
                    ..named("both")
                },
            )
            .unwrap();
        assert_eq!(r.matching(-231, Level::Environment), [env_only, both]);
        assert_eq!(r.matching(-7, Level::Job), [plain, job_only, both]);
    }

    #[test]
    fn registrations_are_bounded() {
        let mut r = Registry::new();
        for _ in 0..MAX_REGISTRATIONS {
            r.register(vec![-7], Directives::default()).unwrap();
        }
        assert_eq!(
            r.register(vec![-7], Directives::default()),
            Err(RegisterError::TooMany {
                limit: MAX_REGISTRATIONS
            })
        );
        assert_eq!(
            Registry::new().register((0..65).collect(), Directives::default()),
            Err(RegisterError::TooManyCodes {
                given: 65,
                limit: MAX_CODES
            })
        );
    }

    proptest! {
        /// The service order, stated independently: by class, then prepended handlers
        /// (latest first), then the others (earliest first); deregistered ones gone.
        #[test]
        fn service_order_is_the_rfcs(
            regs in proptest::collection::vec((0usize..4, any::<bool>()), 0..24),
            gone in proptest::collection::vec(any::<bool>(), 24),
            code in prop_oneof![Just(-7), Just(-231)],
        ) {
            let mut r = Registry::new();
            let mut model = Vec::new();
            for (seq, (shape, prepend)) in regs.iter().enumerate() {
                let codes = match shape {
                    0 => vec![],
                    1 => vec![-7],
                    2 => vec![-231],
                    _ => vec![-7, -231],
                };
                let id = r.register(codes.clone(), Directives { prepend: *prepend, ..Directives::default() }).unwrap();
                model.push((id, codes, *prepend, seq));
            }
            for (i, (id, ..)) in model.iter().enumerate() {
                if gone[i] {
                    prop_assert!(r.deregister(*id));
                }
            }
            let mut want: Vec<_> = model
                .iter()
                .enumerate()
                .filter(|(i, (_, codes, ..))| !gone[*i] && (codes.is_empty() || codes.contains(&code)))
                .map(|(_, (id, codes, prepend, seq))| {
                    let class = match codes.len() { 0 => 2, 1 => 0, _ => 1 };
                    let within = if *prepend { -(*seq as i64) - 1_000 } else { *seq as i64 };
                    ((class, within), *id)
                })
                .collect();
            want.sort();
            let want: Vec<RegId> = want.into_iter().map(|(_, id)| id).collect();
            prop_assert_eq!(r.matching(code, Level::Job), want);
        }
    }
}
