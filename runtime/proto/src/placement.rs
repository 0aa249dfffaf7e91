//! Where a job's processes run, in a form whose size does not grow with the job: the node
//! list, the process count and the mapping policy. Every daemon derives its own processes
//! from it; the per-process table exists only at the edge (`pctl jobs --json`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::limits::{MAX_NODES, MAX_PROCS_PER_JOB};
use crate::Rank;

/// How a job's processes are spread over the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MapBy {
    /// Round robin: process i on node i mod N.
    Node,
    /// Fill each node with consecutive processes before the next.
    Slot,
}

/// A job's placement: process `i` runs on [`Placement::rank_of`]`(i)`. One that arrives from
/// the network is checked as it decodes: processes need a node, and there are at most
/// [`MAX_PROCS_PER_JOB`] of them, so nothing computed from it can divide by zero or run away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Unchecked")]
pub struct Placement {
    pub map_by: MapBy,
    pub nprocs: u32,
    /// The nodes in placement order (a rank may repeat when a tool named a host twice).
    pub nodes: RankList,
}

/// A placement as it is written, before [`Placement`]'s checks.
#[derive(Deserialize)]
struct Unchecked {
    map_by: MapBy,
    nprocs: u32,
    nodes: RankList,
}

impl TryFrom<Unchecked> for Placement {
    type Error = String;

    fn try_from(u: Unchecked) -> Result<Placement, String> {
        if u.nprocs > MAX_PROCS_PER_JOB {
            return Err(format!(
                "placement of {} processes: at most {MAX_PROCS_PER_JOB}",
                u.nprocs
            ));
        }
        // No node is a job not mapped yet, which has no process either.
        if u.nodes.0.is_empty() && u.nprocs > 0 {
            return Err("placement with no node".into());
        }
        Ok(Placement {
            map_by: u.map_by,
            nprocs: u.nprocs,
            nodes: u.nodes,
        })
    }
}

/// An ordered list of ranks, written as comma-separated ascending runs (`1-127`, `5,2,2,7`),
/// so the common case (every joined node) costs a few bytes whatever the DVM's size.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RankList(pub Vec<Rank>);

impl Placement {
    /// A placement of `nprocs` processes over `nodes` (not empty).
    pub fn new(nprocs: u32, nodes: Vec<Rank>, map_by: MapBy) -> Placement {
        debug_assert!(!nodes.is_empty(), "a placement needs a node");
        Placement {
            map_by,
            nprocs,
            nodes: RankList(nodes),
        }
    }

    /// The placement of a job not mapped yet: no process anywhere.
    pub fn unmapped(map_by: MapBy) -> Placement {
        Placement {
            map_by,
            nprocs: 0,
            nodes: RankList(Vec::new()),
        }
    }

    fn per_slot(&self) -> u32 {
        let len = self.nodes.0.len().max(1) as u32;
        self.nprocs.div_ceil(len).max(1)
    }

    /// How many processes the node at position `pos` of the list gets.
    fn procs_at(&self, pos: usize) -> u32 {
        let len = self.nodes.0.len() as u32;
        let pos = pos as u32;
        match self.map_by {
            MapBy::Node => self.nprocs / len + u32::from(pos < self.nprocs % len),
            MapBy::Slot => {
                let per = self.per_slot();
                self.nprocs.saturating_sub(pos * per).min(per)
            }
        }
    }

    /// The rank process `proc` runs on.
    pub fn rank_of(&self, proc: u32) -> Rank {
        let len = self.nodes.0.len() as u32;
        let pos = match self.map_by {
            MapBy::Node => proc % len,
            MapBy::Slot => proc / self.per_slot(),
        };
        self.nodes.0[pos as usize]
    }

    /// The indices of the processes that run on `rank`, ascending.
    pub fn procs_on(&self, rank: Rank) -> Vec<u32> {
        let len = self.nodes.0.len() as u32;
        let mut procs = Vec::new();
        for (pos, r) in self.nodes.0.iter().enumerate() {
            if *r != rank {
                continue;
            }
            let pos = pos as u32;
            match self.map_by {
                MapBy::Node => procs.extend((pos..self.nprocs).step_by(len as usize)),
                MapBy::Slot => {
                    let per = self.per_slot();
                    let lo = pos.saturating_mul(per).min(self.nprocs);
                    procs.extend(lo..lo.saturating_add(per).min(self.nprocs));
                }
            }
        }
        procs.sort_unstable();
        procs
    }

    /// Processes per rank, for ranks that get at least one.
    pub fn counts(&self) -> BTreeMap<Rank, u32> {
        let mut m = BTreeMap::new();
        for (pos, r) in self.nodes.0.iter().enumerate() {
            let n = self.procs_at(pos);
            if n > 0 {
                *m.entry(*r).or_insert(0) += n;
            }
        }
        m
    }

    /// The ranks that run at least one process.
    pub fn ranks(&self) -> crate::idset::IdSet {
        self.counts().into_keys().collect()
    }
}

impl Serialize for RankList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for RankList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RankList, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for RankList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let v = &self.0;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j].checked_add(1) == Some(v[j + 1]) {
                j += 1;
            }
            if i > 0 {
                f.write_str(",")?;
            }
            if j == i {
                write!(f, "{}", v[i])?;
            } else {
                write!(f, "{}-{}", v[i], v[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

impl std::str::FromStr for RankList {
    type Err = String;

    /// Strict: decimal ranks, `lo-hi` with `lo < hi`, at most [`MAX_NODES`] ranks in all.
    fn from_str(s: &str) -> Result<RankList, String> {
        let mut v: Vec<Rank> = Vec::new();
        if s.is_empty() {
            return Ok(RankList(v));
        }
        let num = |t: &str| -> Result<Rank, String> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("rank list {s:?}: {t:?} is not a rank"));
            }
            t.parse()
                .map_err(|_| format!("rank list {s:?}: {t} is too large"))
        };
        for part in s.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    let r = num(part)?;
                    (r, r)
                }
            };
            if part.contains('-') && lo >= hi {
                return Err(format!("rank list {s:?}: range {part} is not ascending"));
            }
            if v.len() as u64 + u64::from(hi - lo) + 1 > MAX_NODES as u64 {
                return Err(format!("rank list {s:?} names more than {MAX_NODES} ranks"));
            }
            v.extend(lo..=hi);
        }
        Ok(RankList(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn by_node_is_round_robin_and_by_slot_fills_nodes_in_turn() {
        let p = Placement::new(5, vec![1, 2, 3], MapBy::Node);
        let v: Vec<Rank> = (0..5).map(|i| p.rank_of(i)).collect();
        assert_eq!(v, vec![1, 2, 3, 1, 2]);
        let p = Placement::new(5, vec![1, 2, 3], MapBy::Slot);
        let v: Vec<Rank> = (0..5).map(|i| p.rank_of(i)).collect();
        assert_eq!(v, vec![1, 1, 2, 2, 3]);
        let p = Placement::new(2, vec![1, 2, 3], MapBy::Slot);
        assert_eq!(p.ranks().to_string(), "1-2");
    }

    #[test]
    fn a_hundred_thousand_processes_on_128_nodes_stay_a_few_bytes() {
        let p = Placement::new(100_000, (1..=128).collect(), MapBy::Node);
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.len() < 64, "{json}");
        assert_eq!(p.procs_on(1).len(), 782);
        assert_eq!(p.counts().values().sum::<u32>(), 100_000);
    }

    #[test]
    fn a_placement_that_would_divide_by_zero_or_run_away_does_not_decode() {
        for bad in [
            r#"{"map_by":"node","nprocs":3,"nodes":""}"#,
            r#"{"map_by":"slot","nprocs":4294967295,"nodes":"1-3"}"#,
        ] {
            assert!(serde_json::from_str::<Placement>(bad).is_err(), "{bad}");
        }
        let ok: Placement =
            serde_json::from_str(r#"{"map_by":"node","nprocs":3,"nodes":"1-2"}"#).unwrap();
        assert_eq!(ok.rank_of(2), 1);
    }

    #[test]
    fn rank_lists_keep_order_and_repeats_and_refuse_garbage() {
        let l: RankList = "5,2,2,7-9".parse().unwrap();
        assert_eq!(l.0, vec![5, 2, 2, 7, 8, 9]);
        assert_eq!(l.to_string(), "5,2,2,7-9");
        for bad in ["a", "3-3", "4-2", "1,,2", "-1", "0-4294967295"] {
            assert!(bad.parse::<RankList>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn procs_on_and_rank_of_agree(
            n in 1u32..300,
            nodes in proptest::collection::vec(0u32..6, 1..8),
            slot in any::<bool>(),
        ) {
            let map_by = if slot { MapBy::Slot } else { MapBy::Node };
            let p = Placement::new(n, nodes.clone(), map_by);
            let mut seen = vec![false; n as usize];
            for r in p.ranks().iter() {
                for i in p.procs_on(r) {
                    prop_assert_eq!(p.rank_of(i), r);
                    seen[i as usize] = true;
                }
                prop_assert_eq!(p.procs_on(r).len() as u32, p.counts()[&r]);
            }
            prop_assert!(seen.iter().all(|s| *s));
            let text = RankList(nodes.clone()).to_string();
            prop_assert_eq!(text.parse::<RankList>().unwrap().0, nodes);
        }
    }
}
