//! The upward connection of a non-controller daemon: which ancestor to try next, when, and when
//! to heal past a parent that does not answer.
//!
//! Pure: the caller reports attempt results with the current monotonic time and performs the
//! [`Attempt`]s it is given.

use std::time::Duration;

use crate::tree::{RadixTree, Rank};

/// Reconnect policy: exponential backoff from `initial`, capped at `max`; after `heal_after`
/// without reaching one target, climb to its parent (never past the controller, which is
/// retried forever). `heal_after: None` retries every target forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub initial: Duration,
    pub max: Duration,
    pub heal_after: Option<Duration>,
}

/// The next connection attempt to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub rank: Rank,
    /// Wait this long before connecting.
    pub delay: Duration,
    /// Set when this attempt climbed past an unreachable target.
    pub healed_from: Option<Rank>,
}

/// State of the upward connection.
#[derive(Debug, Clone)]
pub struct Uplink {
    me: Rank,
    tree: RadixTree,
    policy: Policy,
    target: Rank,
    since: Duration,
    failures: u32,
    /// Ancestors that left the DVM (or are leaving it): never tried again.
    gone: std::collections::BTreeSet<Rank>,
}

impl Uplink {
    /// # Panics
    /// Never for a valid daemon: `me` must be a non-zero rank of `tree` (checked by identity
    /// derivation); a root rank gets the controller as target.
    pub fn new(me: Rank, tree: RadixTree, policy: Policy) -> Uplink {
        Uplink {
            me,
            tree,
            policy,
            target: tree.parent(me).unwrap_or(0),
            since: Duration::ZERO,
            failures: 0,
            gone: std::collections::BTreeSet::new(),
        }
    }

    /// The rank currently being tried (or connected to).
    pub fn target(&self) -> Rank {
        self.target
    }

    /// The first attempt: to the tree parent, at once.
    pub fn start(&mut self, now: Duration) -> Attempt {
        self.restart(now, Duration::ZERO)
    }

    /// The connection came up.
    pub fn connected(&mut self) {
        self.failures = 0;
    }

    /// The live connection was lost: start over from the tree parent, which may be back.
    pub fn lost(&mut self, now: Duration) -> Attempt {
        self.restart(now, self.policy.initial)
    }

    /// Ancestor `rank` left the DVM, or is leaving it: connect past it from now on.
    pub fn avoid(&mut self, rank: Rank) {
        if rank != 0 {
            self.gone.insert(rank);
        }
    }

    /// The nearest ancestor of `r` that has not left (the controller never leaves).
    fn above(&self, r: Rank) -> Rank {
        let mut p = self.tree.parent(r).unwrap_or(0);
        while self.gone.contains(&p) {
            p = self.tree.parent(p).unwrap_or(0);
        }
        p
    }

    fn restart(&mut self, now: Duration, delay: Duration) -> Attempt {
        self.target = self.above(self.me);
        self.since = now;
        self.failures = 0;
        Attempt {
            rank: self.target,
            delay,
            healed_from: None,
        }
    }

    /// An attempt failed at `now`.
    pub fn failed(&mut self, now: Duration) -> Attempt {
        if let Some(limit) = self.policy.heal_after {
            if self.target != 0 && now.saturating_sub(self.since) >= limit {
                let from = self.target;
                self.target = self.above(from);
                self.since = now;
                self.failures = 0;
                return Attempt {
                    rank: self.target,
                    delay: Duration::ZERO,
                    healed_from: Some(from),
                };
            }
        }
        self.failures = self.failures.saturating_add(1);
        let factor = 1u32 << (self.failures - 1).min(20);
        Attempt {
            rank: self.target,
            delay: self
                .policy
                .initial
                .saturating_mul(factor)
                .min(self.policy.max),
            healed_from: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy(heal_ms: Option<u64>) -> Policy {
        Policy {
            initial: 20 * MS,
            max: 5000 * MS,
            heal_after: heal_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn backoff_doubles_from_tens_of_ms_up_to_the_cap_and_never_gives_up() {
        let mut u = Uplink::new(5, RadixTree::new(64, 10), policy(None));
        assert_eq!(u.start(Duration::ZERO).delay, Duration::ZERO);
        let delays: Vec<u64> = (0..12)
            .map(|i| u.failed(i * 1000 * MS).delay.as_millis() as u64)
            .collect();
        assert_eq!(&delays[..5], &[20, 40, 80, 160, 320]);
        assert!(delays[9..].iter().all(|&d| d == 5000));
        assert_eq!(u.target(), 0);
    }

    #[test]
    fn an_ancestor_that_left_is_connected_past() {
        let tree = RadixTree::new(2, 16);
        let mut u = Uplink::new(7, tree, policy(None));
        assert_eq!(u.start(Duration::ZERO).rank, 3);
        u.avoid(3);
        assert_eq!(u.lost(Duration::ZERO).rank, 1, "7's parent 3 left");
        u.avoid(1);
        assert_eq!(u.lost(Duration::ZERO).rank, 0);
    }

    #[test]
    fn heals_up_the_tree_one_ancestor_at_a_time() {
        let tree = RadixTree::new(2, 16);
        let mut u = Uplink::new(7, tree, policy(Some(1000)));
        assert_eq!(u.start(Duration::ZERO).rank, 3);
        assert_eq!(u.failed(500 * MS).rank, 3);
        let a = u.failed(1000 * MS);
        assert_eq!(
            (a.rank, a.healed_from, a.delay),
            (1, Some(3), Duration::ZERO)
        );
        assert_eq!(u.failed(1500 * MS).rank, 1);
        assert_eq!(u.failed(2000 * MS).rank, 0);
        assert_eq!(
            u.failed(100_000 * MS).rank,
            0,
            "the controller is retried forever"
        );
        u.connected();
        let a = u.lost(200_000 * MS);
        assert_eq!(
            (a.rank, a.delay),
            (3, 20 * MS),
            "a lost link starts over at the parent"
        );
    }

    proptest! {
        #[test]
        fn targets_are_always_ancestors_and_delays_bounded(
            radix in 2u32..8, size in 2u32..300, me_seed in 1u32..300,
            steps in proptest::collection::vec((0u64..3000, any::<bool>()), 1..60),
            heal in proptest::option::of(1u64..2000),
        ) {
            let me = 1 + me_seed % (size - 1);
            let tree = RadixTree::new(radix, size);
            let mut u = Uplink::new(me, tree, policy(heal));
            let mut now = Duration::ZERO;
            let mut a = u.start(now);
            for (dt, lost) in steps {
                now += Duration::from_millis(dt);
                a = if lost { u.lost(now) } else { u.failed(now) };
                prop_assert!(tree.ancestors(me).contains(&a.rank));
                prop_assert!(a.delay <= 5000 * MS);
                if heal.is_none() {
                    prop_assert_eq!(a.rank, tree.parent(me).unwrap());
                }
            }
            prop_assert!(a.rank < size);
        }
    }
}
