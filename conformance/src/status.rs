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

/// The parts of the status JSON beyond `formed` and the joined members' hosts, which a
/// runtime may not be able to report; its profile says which it does (`[status] reports`).
/// A test whose only evidence is a field the runtime does not report, and that the suite
/// cannot observe itself, is UNSUPPORTED for that runtime, never FAIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// `namespace`.
    Namespace,
    /// `expected`: how many daemons the DVM has, controller included.
    Expected,
    /// `controller_uri`.
    ControllerUri,
    /// Each member's `rank`.
    Ranks,
    /// Each member's `parent`: the rank it is connected through.
    Parents,
    /// Every member listed with its `state` at all times, also while the DVM is not formed
    /// (without it, only members known to be joined are listed).
    States,
    /// `job_messages`.
    JobMessages,
}

impl Field {
    /// What the status JSON holds when the profile says nothing: the documented shape.
    pub const DOCUMENTED: [Field; 6] = [
        Field::Namespace,
        Field::Expected,
        Field::ControllerUri,
        Field::Ranks,
        Field::Parents,
        Field::States,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Field::Namespace => "namespace",
            Field::Expected => "expected",
            Field::ControllerUri => "controller_uri",
            Field::Ranks => "ranks",
            Field::Parents => "parents",
            Field::States => "states",
            Field::JobMessages => "job_messages",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Member {
    #[serde(default)]
    pub rank: Option<u32>,
    pub host: String,
    /// The rank it is connected through (`null` for the controller and members not joined).
    #[serde(default)]
    pub parent: Option<u32>,
    /// Without `states` a listed member is a joined one.
    #[serde(default = "joined")]
    pub state: MemberState,
}

fn joined() -> MemberState {
    MemberState::Joined
}

/// What the status command prints. Only `formed` is always there; the rest is what the
/// profile declares (checked by [`Status::parse`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub namespace: Option<String>,
    pub formed: bool,
    #[serde(default)]
    pub expected: Option<u32>,
    #[serde(default)]
    pub controller_uri: Option<String>,
    #[serde(default)]
    pub members: Vec<Member>,
    /// Upward job-exec requests the controller received, by kind.
    #[serde(default)]
    pub job_messages: Option<JobMessages>,
    /// When the DVM formed (milliseconds since the Unix epoch, the controller's clock): the
    /// benches time formation by it when reported, else by their own status reads.
    #[serde(default)]
    pub formed_at_unix_ms: Option<u64>,
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
    /// Parses the status JSON, which must carry every field in `reports`; the error says
    /// which is missing.
    pub fn parse(text: &str, reports: &[Field]) -> Result<Status, String> {
        let v: serde_json::Value =
            serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e}): {text}"))?;
        let lacks =
            |what: &str| format!("it lacks {what}, which the profile says it reports: {text}");
        for f in reports {
            let ok = match f {
                Field::Namespace => v["namespace"].is_string(),
                Field::Expected => v["expected"].is_u64(),
                Field::ControllerUri => v["controller_uri"].is_string(),
                Field::JobMessages => v["job_messages"].is_object(),
                Field::Ranks | Field::Parents | Field::States => {
                    let key = match f {
                        Field::Ranks => "rank",
                        Field::Parents => "parent",
                        _ => "state",
                    };
                    v["members"]
                        .as_array()
                        .is_some_and(|ms| ms.iter().all(|m| m.get(key).is_some()))
                }
            };
            if !ok {
                return Err(lacks(f.key()));
            }
        }
        serde_json::from_value(v).map_err(|e| format!("not the status JSON ({e}): {text}"))
    }

    pub fn joined(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Joined)
            .count()
    }

    pub fn member(&self, rank: u32) -> Option<&Member> {
        self.members.iter().find(|m| m.rank == Some(rank))
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
            self.namespace.as_deref().unwrap_or("(not reported)"),
            self.formed,
            self.joined(),
            self.expected.map_or("?".into(), |e| e.to_string()),
            self.controller_uri.as_deref().unwrap_or("(not reported)")
        );
        for m in &self.members {
            s.push_str(&format!(
                "  rank {:>3} {:<12} parent {:<5} {:?}\n",
                m.rank.map_or("?".into(), |r| r.to_string()),
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
