//! The shapes the suite reads from an implementation: the status JSON its status command
//! prints, and the identity JSON its optional identity command prints. Only the fields below
//! are read; an implementation may print more.

use serde::Deserialize;

/// A member's state as the controller reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Joined,
    Waiting,
    /// Connected, not yet reported in (transient).
    Joining,
    Lost,
    /// Told to leave the DVM (an elastic DVM shrinking).
    Departing,
    /// Left the DVM.
    Departed,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Member {
    pub rank: u32,
    pub host: String,
    /// The rank it is connected through (`null` for the controller and members not joined).
    pub parent: Option<u32>,
    pub state: MemberState,
}

/// What the status command prints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Status {
    pub namespace: String,
    pub formed: bool,
    pub expected: u32,
    pub controller_uri: String,
    pub members: Vec<Member>,
    /// Upward job-exec requests the controller received, by kind (optional).
    #[serde(default)]
    pub job_messages: Option<JobMessages>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct JobMessages {
    pub start: u64,
    pub finish: u64,
    pub release: u64,
}

/// Where one process of a job runs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Place {
    pub proc: u32,
    pub rank: u32,
    pub host: String,
}

/// One job of the job list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobView {
    pub id: u64,
    /// `STARTING`, `RUNNING`, `CLEANUP` or `INACTIVE`.
    pub state: String,
    pub placement: Vec<Place>,
    pub status: Option<i32>,
    pub exception: Option<String>,
}

impl Status {
    pub fn joined(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Joined)
            .count()
    }

    pub fn member(&self, rank: u32) -> Option<&Member> {
        self.members.iter().find(|m| m.rank == rank)
    }

    /// Whether every one of `ranks` is joined.
    pub fn all_joined(&self, ranks: &[u32]) -> bool {
        ranks.iter().all(|r| {
            self.member(*r)
                .is_some_and(|m| m.state == MemberState::Joined)
        })
    }

    /// Whether none of `ranks` is joined.
    pub fn none_joined(&self, ranks: &[u32]) -> bool {
        ranks.iter().all(|r| {
            self.member(*r)
                .is_some_and(|m| m.state != MemberState::Joined)
        })
    }

    /// One line per member, for failure messages.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "namespace {}, formed {}, {}/{} joined, controller {}\n",
            self.namespace,
            self.formed,
            self.joined(),
            self.expected,
            self.controller_uri
        );
        for m in &self.members {
            s.push_str(&format!(
                "  rank {:>3} {:<12} parent {:<5} {:?}\n",
                m.rank,
                m.host,
                m.parent.map_or("-".to_string(), |p| p.to_string()),
                m.state
            ));
        }
        s
    }
}

/// What the identity command prints on one host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Identity {
    pub namespace: String,
    pub rank: u32,
    /// `controller` or `daemon`.
    pub role: String,
}

/// The radix-tree parent of `r` (the strided layout of the specs README), written here
/// independently of any implementation.
pub fn tree_parent(r: u32, radix: u32) -> Option<u32> {
    if r == 0 {
        return None;
    }
    let (r, radix) = (u64::from(r), u64::from(radix));
    let (mut off, mut width) = (0u64, 1u64);
    let mut prev = (0u64, 1u64);
    while r >= off + width {
        prev = (off, width);
        off += width;
        width *= radix;
    }
    Some((prev.0 + (r - off) % prev.1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_parent_matches_the_worked_examples_of_the_specs_readme() {
        assert_eq!(tree_parent(3, 2), Some(1));
        assert_eq!(tree_parent(5, 2), Some(1));
        assert_eq!(tree_parent(6, 2), Some(2));
        assert_eq!(tree_parent(11, 2), Some(3));
        assert_eq!(tree_parent(14, 3), Some(5));
        assert_eq!(tree_parent(31, 3), Some(4));
        assert_eq!(tree_parent(65, 64), Some(1));
        assert_eq!(tree_parent(129, 64), Some(1));
        assert_eq!(tree_parent(0, 2), None);
    }
}
