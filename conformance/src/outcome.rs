//! Outcomes of items and tests, and the ways a test says something is wrong.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The verdict on a spec item (or one test of it) in one matrix cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// The implementation did what the item demands.
    Pass,
    /// The implementation did something the item forbids (or failed to do what it demands).
    Fail,
    /// The profile declares the feature the item needs absent.
    Unsupported,
    /// The suite could not decide: the harness or environment failed, or a fault could not be
    /// shown to have taken effect.
    Unresolved,
    /// Not run in this invocation (filtered out, or the environment lacks what it needs).
    NotRun,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Pass,
        Outcome::Fail,
        Outcome::Unsupported,
        Outcome::Unresolved,
        Outcome::NotRun,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Unsupported => "UNSUPPORTED",
            Outcome::Unresolved => "UNRESOLVED",
            Outcome::NotRun => "NOT_RUN",
        }
    }

    /// Combines the outcomes of an item's tests: any failure fails the item; otherwise any
    /// unresolved test leaves it unresolved; it passes when every test that ran passed.
    pub fn combine(parts: &[Outcome]) -> Outcome {
        let has = |o| parts.contains(&o);
        if has(Outcome::Fail) {
            Outcome::Fail
        } else if has(Outcome::Unresolved) {
            Outcome::Unresolved
        } else if has(Outcome::Pass) {
            Outcome::Pass
        } else if has(Outcome::Unsupported) {
            Outcome::Unsupported
        } else {
            Outcome::NotRun
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why a test did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The implementation misbehaved: what the spec expects, and what was seen instead.
    Fail { expected: String, observed: String },
    /// The suite could not decide (harness, environment, unverified fault).
    Unresolved(String),
    /// The profile declares a needed feature absent.
    Unsupported(String),
    /// This environment cannot run the test (e.g. no network namespaces without root).
    NotRun(String),
}

impl Problem {
    pub fn outcome(&self) -> Outcome {
        match self {
            Problem::Fail { .. } => Outcome::Fail,
            Problem::Unresolved(_) => Outcome::Unresolved,
            Problem::Unsupported(_) => Outcome::Unsupported,
            Problem::NotRun(_) => Outcome::NotRun,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Fail { expected, observed } => {
                write!(f, "expected: {expected}\nobserved: {observed}")
            }
            Problem::Unresolved(why) => write!(f, "unresolved: {why}"),
            Problem::Unsupported(why) => write!(f, "unsupported: {why}"),
            Problem::NotRun(why) => write!(f, "not run: {why}"),
        }
    }
}

/// What a test returns.
pub type Verdict = Result<(), Problem>;

/// A failure: `expected` versus `observed`.
pub fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Problem {
    Problem::Fail {
        expected: expected.into(),
        observed: observed.into(),
    }
}

/// Fails with `expected`/`observed` unless `cond` holds.
pub fn check(cond: bool, expected: impl Into<String>, observed: impl Into<String>) -> Verdict {
    if cond {
        Ok(())
    } else {
        Err(fail(expected, observed))
    }
}

/// Turns a harness or environment error into an unresolved verdict.
pub trait OrUnresolved<T> {
    fn or_unresolved(self, what: &str) -> Result<T, Problem>;
}

impl<T, E: fmt::Display> OrUnresolved<T> for Result<T, E> {
    fn or_unresolved(self, what: &str) -> Result<T, Problem> {
        self.map_err(|e| Problem::Unresolved(format!("{what}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failing_test_fails_the_item_and_unresolved_beats_pass() {
        use Outcome::*;
        assert_eq!(Outcome::combine(&[Pass, Fail, Unresolved]), Fail);
        assert_eq!(Outcome::combine(&[Pass, Unresolved]), Unresolved);
        assert_eq!(Outcome::combine(&[Pass, Unsupported]), Pass);
        assert_eq!(Outcome::combine(&[Unsupported]), Unsupported);
        assert_eq!(Outcome::combine(&[]), NotRun);
    }
}
