//! The elastic controller, model-checked: every interleaving of small worlds explored to a
//! bound with every invariant after every step, and larger worlds as seeded random walks.
//! A failure prints the invariant and the actions that broke it.

use dvmlab_sim::elastic_model::{explore, walk, Bounds};

/// The search's depth: `DVMLAB_MODEL_DEPTH` explores deeper by hand (the default keeps the
/// default suite's run short).
fn depth(default: usize) -> usize {
    std::env::var("DVMLAB_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(default)
}

fn small() -> Bounds {
    Bounds {
        initial: 3,
        spare: vec!["g1".into(), "g2".into()],
        requests: 3,
        jobs: 2,
        unrelated_losses: 1,
        components: 2,
        requester: true,
        depth: depth(7),
    }
}

fn report(name: &str, b: &Bounds) {
    let cov = explore(b).unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!(
        "{name}: {} states, {} transitions, {} drained; actions {:?}",
        cov.states, cov.transitions, cov.drained, cov.actions
    );
    for kind in [
        "Grow",
        "Shrink",
        "Report",
        "LaunchFails",
        "LoseTarget",
        "Depart",
        "DepartAgain",
        "LoseUnrelated",
        "Timeout",
        "ReleaseDone",
        "Teardown",
        "Submit",
        "Kill",
    ] {
        assert!(
            cov.actions.contains_key(kind),
            "{name}: the search never took {kind}"
        );
    }
}

#[test]
fn every_interleaving_of_two_grows_a_shrink_and_two_jobs_keeps_the_invariants() {
    report("requester", &small());
}

#[test]
fn every_interleaving_of_pushes_without_requester_keeps_the_invariants() {
    report(
        "push",
        &Bounds {
            requester: false,
            depth: depth(7),
            ..small()
        },
    );
}

#[test]
fn seeded_random_walks_through_a_larger_dvm_keep_the_invariants() {
    let b = Bounds {
        initial: 8,
        spare: (1..=6).map(|i| format!("g{i}")).collect(),
        requests: 12,
        jobs: 10,
        unrelated_losses: 2,
        components: 2,
        requester: true,
        depth: 0,
    };
    for seed in 1..=2000 {
        walk(&b, seed, 200).unwrap();
    }
}
