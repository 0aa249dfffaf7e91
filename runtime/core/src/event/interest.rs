//! Which events a daemon needs from its parent, and when a tool's registration may be
//! answered.
//!
//! A parent sends a child only what can be for someone below it: the environment's events
//! (every daemon keeps the last ones for later registrations), the events of the jobs whose
//! data went down that link (job-exec knows them, and a job process is always one of those),
//! and, once the child said so, every event: a tool on it or below it holds a registration.
//! Without this every job's end woke every daemon of the DVM, however small the job.
//!
//! A tool's registration is answered only once every daemon up to the controller counted
//! the interest it brought (the controller answers `seen`, and each daemon on the way passes
//! that on once its own interest is seen), so an event raised after the tool heard its
//! registration was taken reaches it, as it did when every event went everywhere. Losing
//! interest needs no answer: an event sent down for nobody is dropped below.

use std::collections::BTreeSet;

/// A daemon's link (the overlay's number for it).
pub type DaemonLink = u64;

/// This daemon's link to its parent, as far as interest goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Up {
    /// None now: nothing can be counted above.
    Gone,
    /// A parent older than `wire::EVENT_INTEREST`: it sends every event down.
    Older,
    /// A parent that reads `interest` and answers it.
    Reads,
}

/// What this module has the daemon send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// To the parent: whether a tool here or below holds a registration.
    Up { on: bool, seq: u64 },
    /// To a child: its interest `seq` is counted up to the controller.
    Seen { child: DaemonLink, seq: u64 },
    /// To a child: what it said is counted no further up (this daemon has a new parent, or
    /// none): it is to say it again, and tell its own children the same.
    Again { child: DaemonLink },
}

/// See the module documentation.
#[derive(Debug)]
pub struct Interest {
    root: bool,
    up: Up,
    /// A tool connected here holds a registration.
    tools_here: bool,
    /// Child links that said `on` last, and those too old to say.
    below: BTreeSet<DaemonLink>,
    older: BTreeSet<DaemonLink>,
    /// What was last said upward (or would have been, with no parent that reads it), and
    /// its number.
    on: bool,
    seq: u64,
    /// The parent answered `seq` (while `on`).
    seen: bool,
    /// Children whose `on` waits for this daemon's own to be seen, with its number.
    waiting: Vec<(DaemonLink, u64)>,
}

impl Interest {
    /// The interest of the controller (`root`) or of a daemon with no parent yet.
    pub fn new(root: bool) -> Interest {
        Interest {
            root,
            up: Up::Gone,
            tools_here: false,
            below: BTreeSet::new(),
            older: BTreeSet::new(),
            on: false,
            seq: 0,
            seen: false,
            waiting: Vec::new(),
        }
    }

    /// Whether every daemon from here up to the controller sends this daemon every event a
    /// tool here could want: a tool's registration may be answered.
    pub fn settled(&self) -> bool {
        self.root || self.up == Up::Older || (self.up == Up::Reads && self.on && self.seen)
    }

    /// Whether a tool below `child` holds a registration: it gets every event.
    pub fn wants_all(&self, child: DaemonLink) -> bool {
        self.below.contains(&child)
    }

    /// The upward link changed: a new parent knows nothing of this daemon's interest, and
    /// what the children said is counted no further than here until it knows.
    pub fn uplink(&mut self, up: Up, out: &mut Vec<Said>) {
        self.up = up;
        self.seen = false;
        if self.on && up == Up::Reads && !self.root {
            self.seq += 1;
            out.push(Said::Up {
                on: true,
                seq: self.seq,
            });
        }
        self.waiting.clear();
        let again = self.below.difference(&self.older);
        out.extend(again.map(|&child| Said::Again { child }));
        self.answer(out);
    }

    /// The parent's own interest is counted no further up (it has a new parent): this
    /// daemon's is to be said again, as to a new parent.
    pub fn again(&mut self, out: &mut Vec<Said>) {
        self.uplink(self.up, out);
    }

    /// Whether a tool connected here holds a registration now.
    pub fn tools(&mut self, here: bool, out: &mut Vec<Said>) {
        self.tools_here = here;
        self.reconsider(out);
    }

    /// Child link `child` said `on` with number `seq`.
    pub fn child_said(&mut self, child: DaemonLink, on: bool, seq: u64, out: &mut Vec<Said>) {
        self.waiting.retain(|(c, _)| *c != child);
        if on {
            self.below.insert(child);
            self.waiting.push((child, seq));
        } else {
            self.below.remove(&child);
        }
        self.reconsider(out);
    }

    /// The parent counted this daemon's interest `seq`.
    pub fn seen(&mut self, seq: u64, out: &mut Vec<Said>) {
        if self.on && seq == self.seq {
            self.seen = true;
        }
        self.answer(out);
    }

    /// The child links now, and those of them older than `wire::EVENT_INTEREST`: what gone
    /// ones said is forgotten, and an older one counts as interested for good (it gets every
    /// event, and cannot say whether a tool below it wants them, so this daemon must get
    /// them too).
    pub fn children(
        &mut self,
        live: &BTreeSet<DaemonLink>,
        older: &BTreeSet<DaemonLink>,
        out: &mut Vec<Said>,
    ) {
        self.below.retain(|c| live.contains(c));
        self.older = older.intersection(live).copied().collect();
        self.below.extend(&self.older);
        self.waiting.retain(|(c, _)| live.contains(c));
        self.reconsider(out);
    }

    fn reconsider(&mut self, out: &mut Vec<Said>) {
        let on = self.tools_here || !self.below.is_empty();
        if on != self.on && !self.root {
            self.on = on;
            self.seq += 1;
            self.seen = false;
            if self.up == Up::Reads {
                out.push(Said::Up { on, seq: self.seq });
            }
        }
        self.answer(out);
    }

    /// Children waiting for this daemon's interest to be counted hear theirs is, once it is.
    fn answer(&mut self, out: &mut Vec<Said>) {
        if self.settled() {
            out.extend(
                self.waiting
                    .drain(..)
                    .map(|(child, seq)| Said::Seen { child, seq }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(i: &mut Interest, f: impl FnOnce(&mut Interest, &mut Vec<Said>)) -> Vec<Said> {
        let mut out = Vec::new();
        f(i, &mut out);
        out
    }

    #[test]
    fn a_registered_tool_is_settled_only_once_its_parent_counted_it() {
        let mut i = Interest::new(false);
        assert!(said(&mut i, |i, o| i.uplink(Up::Reads, o)).is_empty());
        assert_eq!(
            said(&mut i, |i, o| i.tools(true, o)),
            [Said::Up { on: true, seq: 1 }]
        );
        assert!(!i.settled());
        assert!(said(&mut i, |i, o| i.seen(1, o)).is_empty());
        assert!(i.settled());
        // Lost interest needs no answer; an answer to an older number settles nothing.
        assert_eq!(
            said(&mut i, |i, o| i.tools(false, o)),
            [Said::Up { on: false, seq: 2 }]
        );
        said(&mut i, |i, o| i.tools(true, o));
        said(&mut i, |i, o| i.seen(1, o));
        assert!(!i.settled());
        said(&mut i, |i, o| i.seen(3, o));
        assert!(i.settled());
    }

    #[test]
    fn a_childs_interest_is_answered_once_its_parents_own_is_counted_above() {
        let mut i = Interest::new(false);
        said(&mut i, |i, o| i.uplink(Up::Reads, o));
        assert_eq!(
            said(&mut i, |i, o| i.child_said(7, true, 4, o)),
            [Said::Up { on: true, seq: 1 }]
        );
        assert!(i.wants_all(7));
        assert_eq!(
            said(&mut i, |i, o| i.seen(1, o)),
            [Said::Seen { child: 7, seq: 4 }]
        );
        // A second child is answered at once: this daemon's interest is counted already.
        assert_eq!(
            said(&mut i, |i, o| i.child_said(8, true, 1, o)),
            [Said::Seen { child: 8, seq: 1 }]
        );
        // Both gone: interest is lost upward.
        said(&mut i, |i, o| i.child_said(7, false, 5, o));
        let none = BTreeSet::new();
        assert_eq!(
            said(&mut i, |i, o| i.children(&none, &none, o)),
            [Said::Up { on: false, seq: 2 }]
        );
        assert!(!i.wants_all(8));
        // A child too old to say is interested for as long as it is a child: what it gets,
        // this daemon must get.
        let old = BTreeSet::from([9]);
        assert_eq!(
            said(&mut i, |i, o| i.children(&old, &old, o)),
            [Said::Up { on: true, seq: 3 }]
        );
        assert!(i.wants_all(9));
    }

    #[test]
    fn the_controller_answers_at_once_and_a_new_parent_is_told_again() {
        let mut root = Interest::new(true);
        assert_eq!(
            said(&mut root, |i, o| i.child_said(3, true, 9, o)),
            [Said::Seen { child: 3, seq: 9 }]
        );
        let mut i = Interest::new(false);
        said(&mut i, |i, o| i.uplink(Up::Reads, o));
        said(&mut i, |i, o| i.tools(true, o));
        said(&mut i, |i, o| i.seen(1, o));
        assert!(i.settled());
        // The parent is lost: nothing is counted above until a new one answers.
        assert!(said(&mut i, |i, o| i.uplink(Up::Gone, o)).is_empty());
        assert!(!i.settled());
        assert_eq!(
            said(&mut i, |i, o| i.uplink(Up::Reads, o)),
            [Said::Up { on: true, seq: 2 }]
        );
        said(&mut i, |i, o| i.seen(2, o));
        assert!(i.settled());
        // Under a parent that sends every event, nothing is said and all is settled.
        assert!(said(&mut i, |i, o| i.uplink(Up::Older, o)).is_empty());
        assert!(i.settled());
        assert!(said(&mut i, |i, o| i.child_said(4, true, 1, o))
            .contains(&Said::Seen { child: 4, seq: 1 }));
    }

    #[test]
    fn a_new_parent_has_the_children_say_their_interest_again_and_answers_wait_for_it() {
        let mut i = Interest::new(false);
        said(&mut i, |i, o| i.uplink(Up::Reads, o));
        said(&mut i, |i, o| i.child_said(7, true, 1, o));
        said(&mut i, |i, o| i.seen(1, o));
        // Child 9 is too old to say: it is never asked.
        said(&mut i, |i, o| {
            i.children(&BTreeSet::from([7, 9]), &BTreeSet::from([9]), o)
        });
        assert_eq!(
            said(&mut i, |i, o| i.uplink(Up::Reads, o)),
            [Said::Up { on: true, seq: 2 }, Said::Again { child: 7 }]
        );
        assert!(said(&mut i, |i, o| i.child_said(7, true, 2, o)).is_empty());
        assert_eq!(
            said(&mut i, |i, o| i.seen(2, o)),
            [Said::Seen { child: 7, seq: 2 }]
        );
        // The parent's own parent changed: the same, one level down.
        assert_eq!(
            said(&mut i, |i, o| i.again(o)),
            [Said::Up { on: true, seq: 3 }, Said::Again { child: 7 }]
        );
        assert!(!i.settled());
    }
}
