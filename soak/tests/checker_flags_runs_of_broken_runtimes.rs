//! The checker on histories of real soaks (`make soak-broken SOAK_KEEP=1` recorded them):
//! the same seed and workload against the runtime as it is, and against the runtime broken
//! on purpose in one way each (`dvmlab_test_elastic_fault`). The unbroken run passes every
//! property; each broken run fails the property its defect breaks.

use std::path::PathBuf;

use dvmlab_soak::checker::{check, Verdict};
use dvmlab_soak::history::{self, Entry, Record};

fn run(name: &str) -> Vec<Record> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/histories")
        .join(format!("{name}.jsonl"));
    history::read(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn fault_of(h: &[Record]) -> Option<String> {
    h.iter().find_map(|r| match &r.entry {
        Entry::Meta { runtime_fault, .. } => runtime_fault.clone(),
        _ => None,
    })
}

fn failed(verdicts: &[Verdict]) -> Vec<(&'static str, usize)> {
    verdicts
        .iter()
        .filter(|v| !v.violations.is_empty())
        .map(|v| (v.property, v.violations.len()))
        .collect()
}

fn flags(defect: &str, property: &str) {
    let h = run(defect);
    assert_eq!(
        fault_of(&h).as_deref(),
        Some(defect),
        "the run's own record"
    );
    let verdicts = check(&h);
    let bad = failed(&verdicts);
    assert!(
        bad.iter().any(|(p, _)| *p == property),
        "a runtime broken with {defect} must fail {property}; failed: {bad:?}"
    );
}

#[test]
fn the_unbroken_runtime_with_the_same_seed_passes_every_property() {
    let h = run("unbroken");
    assert_eq!(fault_of(&h), None);
    let verdicts = check(&h);
    assert_eq!(failed(&verdicts), vec![], "{verdicts:#?}");
}

#[test]
fn a_runtime_that_launches_on_departing_daemons_is_caught() {
    flags("launch-on-departing", "starts-on-wired-daemons");
}

#[test]
fn a_runtime_that_loses_held_jobs_is_caught() {
    flags("lose-held-jobs", "jobs-end-once");
}

#[test]
fn a_runtime_that_sends_a_terminal_event_twice_is_caught() {
    flags("duplicate-terminal", "one-terminal-event");
}
