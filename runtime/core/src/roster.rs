//! The roster: the one record of the DVM's membership — every rank's host and state. The
//! controller owns it and is the only one to change a state; every daemon holds a copy of
//! the membership part (ranks and hosts), made from `prte.conf` and kept current by the
//! wireup message its parent sends when it joins ([`Roster::wireup`], [`Roster::apply`]).
//!
//! Everything that asks "how big is the DVM", "which host is rank r", "who is wired in" or
//! "which ranks may run jobs" asks the roster; nothing compares with a tree size. Parents
//! come from the tree formula, which does not depend on the size, so ranks appended later
//! keep every existing rank's parent.

use serde::{Deserialize, Serialize};

use crate::tree::Rank;
use dvmlab_proto::limits::{MAX_NODES, MAX_URI_LEN};
pub use dvmlab_proto::wire::Wireup;

/// Where a member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Listed, never heard from.
    Waiting,
    /// Connected to the controller, not yet reported as reachable.
    Joining,
    /// Reachable through the tree: it may run jobs.
    Wired,
    /// Told to leave; still reachable.
    Departing,
    /// Left the DVM for good.
    Departed,
    /// Was wired; its route is gone (it may come back).
    Lost,
}

/// One rank of the DVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub host: String,
    /// Its contact URI as it last reported it (on the controller; a daemon knows its own).
    pub uri: Option<String>,
    pub state: State,
    /// The roster's generation when this member's state last changed.
    pub since: u64,
    /// Controller only: the grow campaign this rank was added by, until that campaign
    /// completes. A tagged rank runs no job even once it is wired: a grow is complete only
    /// when every one of its daemons is.
    pub campaign: Option<u64>,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Roster {
    members: Vec<Member>,
    /// Ranks that came from `prte.conf`; later ones were added.
    configured: u32,
    controller_listed: bool,
    generation: u64,
    epoch: u64,
}

impl Roster {
    /// The roster `prte.conf` defines: rank `r` on `hosts[r]`, all waiting but `me`, which
    /// is wired (a daemon is part of its own DVM).
    pub fn from_conf(hosts: &[String], controller_listed: bool, me: Rank) -> Roster {
        let members = hosts
            .iter()
            .enumerate()
            .map(|(r, h)| Member {
                host: h.clone(),
                uri: None,
                state: if r as Rank == me {
                    State::Wired
                } else {
                    State::Waiting
                },
                since: 0,
                campaign: None,
            })
            .collect();
        let r = Roster {
            members,
            configured: hosts.len() as u32,
            controller_listed,
            generation: 0,
            epoch: 0,
        };
        r.check();
        r
    }

    /// Ranks in the DVM (departed ones included: ranks are never reused).
    pub fn len(&self) -> u32 {
        self.members.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn contains(&self, rank: Rank) -> bool {
        rank < self.len()
    }

    pub fn get(&self, rank: Rank) -> Option<&Member> {
        self.members.get(rank as usize)
    }

    /// The host of `rank` (empty for a rank outside the DVM).
    pub fn host(&self, rank: Rank) -> &str {
        self.get(rank).map_or("", |m| m.host.as_str())
    }

    pub fn state(&self, rank: Rank) -> Option<State> {
        self.get(rank).map(|m| m.state)
    }

    /// The rank whose host is `host`, departed ranks skipped: a host that left and was
    /// added again answers to its new rank.
    pub fn rank_of(&self, host: &str) -> Option<Rank> {
        self.members
            .iter()
            .position(|m| m.host == host && m.state != State::Departed)
            .map(|r| r as Rank)
    }

    /// The membership's version: bumped by every rank added or departed, carried by the
    /// wireup so that a daemon takes only a newer membership.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn controller_listed(&self) -> bool {
        self.controller_listed
    }

    /// Bumped by every change of a member's state.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn iter(&self) -> impl Iterator<Item = (Rank, &Member)> {
        self.members.iter().enumerate().map(|(r, m)| (r as Rank, m))
    }

    /// How many members are in `state`.
    pub fn count(&self, state: State) -> u32 {
        self.members.iter().filter(|m| m.state == state).count() as u32
    }

    /// Members that are expected to be wired: all but the departed.
    pub fn expected(&self) -> u32 {
        self.len() - self.count(State::Departed)
    }

    /// Whether every member that has not departed is wired; a grow in progress does not
    /// count until it completes (the DVM it grows stays formed meanwhile).
    pub fn formed(&self) -> bool {
        self.members.iter().all(|m| {
            matches!(m.state, State::Wired | State::Departed | State::Departing)
                || m.campaign.is_some()
        })
    }

    /// Ranks that may run job processes, in rank order: the wired ones not part of a grow in
    /// progress, the controller only when `prte.conf` lists it as a compute node. A departing
    /// rank is not wired, so it is never among them.
    pub fn compute_ranks(&self) -> Vec<Rank> {
        self.iter()
            .filter(|(r, m)| {
                m.state == State::Wired
                    && m.campaign.is_none()
                    && (*r != 0 || self.controller_listed)
            })
            .map(|(r, _)| r)
            .collect()
    }

    /// Controller: adds `host` as a new rank, after every rank there ever was, on behalf of
    /// grow campaign `campaign`. Refused for a host that is already a member (and has not
    /// departed) and past [`MAX_NODES`] ranks.
    pub fn add(&mut self, host: &str, campaign: u64) -> Result<Rank, String> {
        if let Some(r) = self.rank_of(host) {
            return Err(format!("host {host} is already in the DVM (rank {r})"));
        }
        if self.members.len() >= MAX_NODES {
            return Err(format!(
                "host {host}: the DVM has {MAX_NODES} ranks, the most it may have"
            ));
        }
        self.generation += 1;
        self.epoch += 1;
        self.members.push(Member {
            host: host.to_string(),
            uri: None,
            state: State::Waiting,
            since: self.generation,
            campaign: Some(campaign),
        });
        self.check();
        Ok(self.len() - 1)
    }

    /// Controller: `rank`'s grow completed; it may run jobs once wired.
    pub fn admit(&mut self, rank: Rank) {
        if let Some(m) = self.members.get_mut(rank as usize) {
            m.campaign = None;
        }
    }

    /// Controller: `rank` left the DVM for good (a shrink target gone, a failed grow's
    /// daemon undone). Bumps the epoch so every daemon's membership drops it; returns
    /// whether it was news (a repeated departure changes nothing).
    pub fn depart(&mut self, rank: Rank) -> bool {
        if !self.set(rank, State::Departed) {
            return false;
        }
        self.epoch += 1;
        if let Some(m) = self.members.get_mut(rank as usize) {
            m.campaign = None;
        }
        true
    }

    /// Sets `rank`'s state; returns whether it changed. Ranks outside the DVM are ignored, a
    /// departed rank stays departed, and a departing rank leaves that state only by
    /// departing: its loss is its departure, and a report does not make it a compute rank
    /// again.
    pub fn set(&mut self, rank: Rank, state: State) -> bool {
        let generation = self.generation + 1;
        let Some(m) = self.members.get_mut(rank as usize) else {
            return false;
        };
        if m.state == state
            || m.state == State::Departed
            || (m.state == State::Departing && state != State::Departed)
        {
            return false;
        }
        m.state = state;
        m.since = generation;
        self.generation = generation;
        self.check();
        true
    }

    /// Records the contact URI `rank` reported (the address it is reached at may change when
    /// it restarts elsewhere). Empty (an older peer) or longer than [`MAX_URI_LEN`] is not
    /// recorded; ranks outside the DVM are ignored.
    pub fn set_uri(&mut self, rank: Rank, uri: &str) {
        if uri.is_empty() || uri.len() > MAX_URI_LEN {
            return;
        }
        if let Some(m) = self.members.get_mut(rank as usize) {
            if m.uri.as_deref() != Some(uri) {
                m.uri = Some(uri.to_string());
            }
        }
    }

    /// What a joining child needs beyond `prte.conf`.
    pub fn wireup(&self) -> Wireup {
        Wireup {
            epoch: self.epoch,
            added: self
                .iter()
                .skip(self.configured as usize)
                .map(|(r, m)| (r, m.host.clone()))
                .collect(),
            departed: self
                .iter()
                .filter(|(_, m)| m.state == State::Departed)
                .map(|(r, _)| r)
                .collect(),
        }
    }

    /// The membership as it stands once every grow in progress is undone: what a restarted
    /// controller takes up (its grows in flight end with it, so their ranks count as
    /// departed, and are told to leave if they come).
    pub fn settled(&self) -> Wireup {
        let mut w = self.wireup();
        for (r, m) in self.iter() {
            // A shrink in flight ends with its controller too: its targets are gone.
            if m.campaign.is_some() || m.state == State::Departing {
                w.departed.insert(r);
            }
        }
        // Newer than what the daemons hold, so that they take it from a restarted controller.
        if w != self.wireup() {
            w.epoch += 1;
        }
        w
    }

    /// Takes a parent's membership if it is newer; returns whether it was. Ranks must follow
    /// on from the ones known (a gap or a renamed rank is refused as an error).
    pub fn apply(&mut self, w: &Wireup) -> Result<bool, String> {
        if w.epoch <= self.epoch {
            return Ok(false);
        }
        for (r, host) in &w.added {
            match self.members.get(*r as usize) {
                Some(m) if m.host == *host => {}
                Some(m) => {
                    return Err(format!(
                        "wireup names rank {r} on {host}, known here on {}",
                        m.host
                    ))
                }
                None if *r == self.len() && self.members.len() >= MAX_NODES => {
                    return Err(format!(
                        "wireup adds rank {r}, past the {MAX_NODES} daemons a DVM may have"
                    ))
                }
                None if *r == self.len() => self.members.push(Member {
                    host: host.clone(),
                    uri: None,
                    state: State::Waiting,
                    since: self.generation,
                    campaign: None,
                }),
                None => {
                    return Err(format!(
                        "wireup adds rank {r}, but this DVM has {} ranks",
                        self.len()
                    ))
                }
            }
        }
        for r in w.departed.iter() {
            if let Some(m) = self.members.get_mut(r as usize) {
                m.state = State::Departed;
            }
        }
        self.epoch = w.epoch;
        self.check();
        Ok(true)
    }

    /// The roster's own invariants, checked in debug builds after every change.
    fn check(&self) {
        debug_assert!(self.configured as usize <= self.members.len().max(1));
        debug_assert!(self.members.iter().all(|m| m.since <= self.generation));
        debug_assert!(self.members.len() <= MAX_NODES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvmlab_proto::idset::IdSet;

    fn hosts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h{i}")).collect()
    }

    #[test]
    fn a_conf_roster_is_waiting_but_for_itself_and_forms_when_all_are_wired() {
        let mut r = Roster::from_conf(&hosts(3), false, 0);
        assert_eq!(r.state(0), Some(State::Wired));
        assert!(!r.formed());
        assert!(
            r.compute_ranks().is_empty(),
            "the controller is not a compute node"
        );
        r.set(1, State::Wired);
        r.set(2, State::Joining);
        assert!(!r.formed());
        r.set(2, State::Wired);
        assert!(r.formed());
        assert_eq!(r.compute_ranks(), vec![1, 2]);
        r.set(1, State::Lost);
        assert_eq!(r.compute_ranks(), vec![2]);
        assert_eq!(r.generation(), 4);
        assert_eq!(r.get(1).unwrap().since, 4);
    }

    #[test]
    fn a_reported_uri_is_recorded_per_rank_within_its_length_limit() {
        let mut r = Roster::from_conf(&hosts(3), false, 0);
        r.set_uri(1, "n.1;tcp://10.0.0.2:7817:24");
        assert_eq!(
            r.get(1).unwrap().uri.as_deref(),
            Some("n.1;tcp://10.0.0.2:7817:24")
        );
        r.set_uri(1, "");
        r.set_uri(1, &"x".repeat(MAX_URI_LEN + 1));
        assert_eq!(
            r.get(1).unwrap().uri.as_deref(),
            Some("n.1;tcp://10.0.0.2:7817:24"),
            "an empty or oversized URI changes nothing"
        );
        r.set_uri(9, "n.9;tcp://10.0.0.9:7817:24");
        assert_eq!(r.get(2).unwrap().uri, None);
    }

    #[test]
    fn a_listed_controller_runs_jobs_and_departed_ranks_stay_departed() {
        let mut r = Roster::from_conf(&hosts(2), true, 0);
        r.set(1, State::Wired);
        assert_eq!(r.compute_ranks(), vec![0, 1]);
        r.set(1, State::Departed);
        assert!(!r.set(1, State::Wired));
        assert!(r.formed(), "a departed rank is not expected");
        assert_eq!(r.expected(), 1);
    }

    #[test]
    fn a_wireup_carries_only_what_differs_from_the_conf_and_applies_once() {
        let mut ctl = Roster::from_conf(&hosts(3), false, 0);
        assert_eq!(ctl.wireup().added, vec![]);
        ctl.members.push(Member {
            host: "h3".into(),
            uri: None,
            state: State::Waiting,
            since: 0,
            campaign: None,
        });
        ctl.epoch = 1;
        ctl.set(2, State::Departed);
        let w = ctl.wireup();
        let mut d = Roster::from_conf(&hosts(3), false, 1);
        assert_eq!(d.apply(&w), Ok(true));
        assert_eq!(d.len(), 4);
        assert_eq!(d.host(3), "h3");
        assert_eq!(d.state(2), Some(State::Departed));
        assert_eq!(d.apply(&w), Ok(false), "not newer");
        let bad = Wireup {
            epoch: 2,
            added: vec![(7, "h7".into())],
            departed: IdSet::new(),
        };
        assert!(d.apply(&bad).unwrap_err().contains("adds rank 7"));
    }

    #[test]
    fn an_added_rank_follows_every_rank_and_runs_jobs_only_once_wired_and_admitted() {
        let mut ctl = Roster::from_conf(&hosts(3), false, 0);
        ctl.set(1, State::Wired);
        ctl.set(2, State::Wired);
        let e0 = ctl.epoch();
        assert!(ctl
            .add("h1", 7)
            .unwrap_err()
            .contains("already in the DVM (rank 1)"));
        assert_eq!(ctl.add("n3", 7), Ok(3));
        assert_eq!(ctl.add("n4", 7), Ok(4));
        assert!(ctl.epoch() > e0);
        assert!(ctl.formed(), "a grow in progress leaves the DVM formed");
        ctl.set(3, State::Wired);
        assert_eq!(
            ctl.compute_ranks(),
            vec![1, 2],
            "tagged: its grow is not done"
        );
        let settled = ctl.settled();
        assert!(
            settled.departed.contains(3) && !ctl.wireup().departed.contains(3),
            "a restarted controller undoes a grow in flight"
        );
        assert!(
            settled.epoch > ctl.epoch(),
            "newer than what the daemons hold"
        );
        ctl.admit(3);
        assert_eq!(ctl.compute_ranks(), vec![1, 2, 3]);
        // A failed grow's rank departs; the same host can come back under a new rank.
        let e1 = ctl.epoch();
        assert!(ctl.depart(4));
        assert!(!ctl.depart(4), "a repeated departure is no news");
        assert_eq!(ctl.epoch(), e1 + 1);
        assert_eq!(ctl.rank_of("n4"), None);
        assert_eq!(ctl.add("n4", 8), Ok(5));
        assert_eq!(ctl.rank_of("n4"), Some(5));
        ctl.set(2, State::Departing);
        assert_eq!(
            ctl.compute_ranks(),
            vec![1, 3],
            "a departing rank runs nothing"
        );
        // Every daemon takes the new membership from the wireup.
        let mut d = Roster::from_conf(&hosts(3), false, 1);
        assert_eq!(d.apply(&ctl.wireup()), Ok(true));
        assert_eq!(d.len(), 6);
        assert_eq!(d.state(4), Some(State::Departed));
        assert_eq!(d.rank_of("n4"), Some(5));
    }

    #[test]
    fn a_wireup_cannot_grow_the_dvm_past_its_limit() {
        let mut d = Roster::from_conf(&hosts(MAX_NODES), false, 1);
        let w = Wireup {
            epoch: 1,
            added: vec![(MAX_NODES as Rank, "one-too-many".into())],
            departed: IdSet::new(),
        };
        assert!(d.apply(&w).unwrap_err().contains("past the 65536"));
        assert_eq!(d.len() as usize, MAX_NODES);
    }
}
