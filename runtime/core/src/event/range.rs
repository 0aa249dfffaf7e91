//! Where a notification goes, by its range (RFC 0002 with PMIx's `pmix_data_range_t`).
//!
//! A notification from a client travels as little as its range needs: `PROC_LOCAL` never
//! leaves the notifying process, `LOCAL` never leaves its node, `RM` goes to the controller
//! alone, and the rest go to the controller, which sends them down the whole tree; every
//! daemon then hands the event to the local clients the range names (its `Audience`). Client
//! notifications address processes, so they are job events; only events the runtime raises
//! without a target (a lost node) are environment events.

use dvmlab_proto::event::{Audience, Proc, Range};

/// How far a client's notification travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Not past the notifying process (its own handlers only).
    Process,
    /// Not past its node's daemon.
    Node,
    /// Up to the controller, and no further.
    Controller,
    /// Up to the controller, then down to every daemon.
    Everywhere,
}

/// How far a notification with `range` travels. `UNDEF` is taken as PMIx does: the whole
/// session.
pub fn reach(range: Range) -> Reach {
    match range {
        Range::ProcLocal => Reach::Process,
        Range::Local => Reach::Node,
        Range::Rm => Reach::Controller,
        Range::Namespace | Range::Session | Range::Global | Range::Custom | Range::Undef => {
            Reach::Everywhere
        }
    }
}

/// Whom a daemon hands a notification from `source` with `range` (and, for `CUSTOM`,
/// `targets`) to.
pub fn audience(range: Range, source: &Proc, targets: &[Proc]) -> Audience {
    match range {
        Range::ProcLocal => Audience::Nobody,
        Range::Rm => Audience::Runtime,
        Range::Local | Range::Session | Range::Global | Range::Undef => Audience::Everyone,
        Range::Namespace => Audience::Job {
            nspace: source.nspace.clone(),
        },
        Range::Custom => Audience::Procs {
            procs: targets.to_vec(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_range_has_its_reach_and_audience() {
        let me = Proc {
            nspace: "job".into(),
            rank: 3,
        };
        let t = vec![Proc {
            nspace: "other".into(),
            rank: 0,
        }];
        let table = [
            (Range::ProcLocal, Reach::Process, Audience::Nobody),
            (Range::Local, Reach::Node, Audience::Everyone),
            (Range::Rm, Reach::Controller, Audience::Runtime),
            (
                Range::Namespace,
                Reach::Everywhere,
                Audience::Job {
                    nspace: "job".into(),
                },
            ),
            (Range::Session, Reach::Everywhere, Audience::Everyone),
            (Range::Global, Reach::Everywhere, Audience::Everyone),
            (
                Range::Custom,
                Reach::Everywhere,
                Audience::Procs { procs: t.clone() },
            ),
        ];
        for (range, r, a) in table {
            assert_eq!(reach(range), r, "{range:?}");
            assert_eq!(audience(range, &me, &t), a, "{range:?}");
        }
    }
}
