//! The suite can fail: pointed at deliberately broken variants of the reference runtime
//! (wrapped through their profiles), the items they break come out FAIL, with what was
//! expected and what was observed. A suite that only ever says PASS proves nothing.

use std::path::{Path, PathBuf};

use conformance::knobs::{Cell, Knobs};
use conformance::outcome::Outcome;
use conformance::runner::{run, Overrides};
use dvmlab_harness::BackendKind;
use libtest_mimic::Arguments;

/// Writes a profile that is the reference one with `daemon` and `status` commands replaced.
fn broken_profile(dir: &Path, name: &str, daemon: &str, status: &str) -> PathBuf {
    broken_profile_reporting(dir, name, daemon, status, None)
}

/// As [`broken_profile`], the status reporting only `reports` when given.
fn broken_profile_reporting(
    dir: &Path,
    name: &str,
    daemon: &str,
    status: &str,
    reports: Option<&str>,
) -> PathBuf {
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/reference.toml");
    let text = std::fs::read_to_string(&reference).unwrap();
    let mut out = String::new();
    let mut section = String::new();
    for line in text.lines() {
        if line.starts_with('[') {
            section = line.to_string();
        }
        let line = match (section.as_str(), line.starts_with("command =")) {
            ("[daemon]", true) => format!("command = {daemon}"),
            ("[status]", true) => format!("command = {status}"),
            ("[status]", false) if line.starts_with("reports =") => match reports {
                Some(r) => format!("reports = {r}"),
                None => line.to_string(),
            },
            // The profile lives elsewhere now: build from the workspace explicitly.
            ("[implementation]", false) if line.starts_with("build =") => format!(
                "build = [\"cargo\", \"build\", \"--quiet\", \"--manifest-path\", \"{}/../Cargo.toml\", \"-p\", \"dvmlab-runtime\", \"--bins\", \"--profile\", \"{{cargo_profile}}\"]",
                env!("CARGO_MANIFEST_DIR")
            ),
            _ => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, out).unwrap();
    path
}

const DAEMON: &str = r#"["{build_dir}/prted", "--bootstrap"]"#;
const STATUS: &str = r#"["{build_dir}/pctl", "status", "--json", "--timeout", "5"]"#;

/// Runs exactly `item` against `profile`; returns its outcome and reason.
fn judge(profile: &Path, item: &str) -> (Outcome, String) {
    let results = profile.with_extension("results");
    let args = Arguments::from_iter(["suite", "--exact", item]);
    let (_, res) = run(
        &args,
        &Overrides {
            profile: Some(profile.to_path_buf()),
            results: Some(results),
            // One cell whatever the environment's matrix, so the item's trial name is its id.
            knobs: Some(Knobs {
                cells: vec![Cell {
                    ip: 4,
                    radix: 3,
                    backend: BackendKind::from_env().unwrap(),
                    nodes: 4,
                }],
                seed: 1,
                seed_given: true,
            }),
            write_traceability: false,
            filters: Vec::new(),
        },
    )
    .unwrap();
    let res = res.expect("the item ran");
    let it = res
        .items
        .iter()
        .find(|i| i.id == item)
        .expect("the item is in the results");
    (it.outcome, it.reason.clone().unwrap_or_default())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dvl-suite-selftest-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_runtime_that_reports_formed_too_early_fails_c6() {
    let dir = scratch("liar");
    let liar = r#"["sh", "-c", "{build_dir}/pctl status --json --timeout 5 | sed 's/\"formed\":false/\"formed\":true/'"]"#;
    let p = broken_profile(&dir, "liar", DAEMON, liar);
    let (o, why) = judge(&p, "bootstrap.C6");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(
        why.contains("expected:") && why.contains("observed:"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_daemon_that_lingers_on_a_malformed_conf_fails_the_no_equals_item() {
    let dir = scratch("lingerer");
    let lingerer = r#"["sh", "-c", "{build_dir}/prted --bootstrap || exec sleep 600"]"#;
    let p = broken_profile(&dir, "lingerer", lingerer, STATUS);
    let (o, why) = judge(&p, "bootstrap.conf.no-equals");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(why.contains("still running"), "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Daemons that read the configuration but connect straight to the controller: every
/// DVMRadix is read as 64.
const FLAT: &str = r#"["sh", "-c", "c=${PRTE_MCA_prte_bootstrap_conf:-/etc/prte.conf}; sed 's/^DVMRadix *=.*/DVMRadix=64/' \"$c\" > \"$TMPDIR/flat.conf\" && PRTE_MCA_prte_bootstrap_conf=\"$TMPDIR/flat.conf\" exec {build_dir}/prted --bootstrap"]"#;

#[test]
fn a_runtime_whose_daemons_skip_their_tree_parent_fails_the_tree_item_from_the_network() {
    let dir = scratch("flat");
    // Its status reports no parents: only the network can show where the daemons connect.
    let p = broken_profile_reporting(
        &dir,
        "flat",
        FLAT,
        STATUS,
        Some(r#"["namespace", "expected", "controller_uri", "ranks", "states"]"#),
    );
    let (o, why) = judge(&p, "bootstrap.radix.tree");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(
        why.contains("as the network shows it") && why.contains("n04 -> ctl"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_status_that_claims_parents_its_sockets_contradict_fails_the_tree_item_showing_both() {
    let dir = scratch("parent-liar");
    // The daemons follow the tree; the status says every joined daemon hangs off rank 0.
    let liar = r#"["sh", "-c", "{build_dir}/pctl status --json --timeout 5 | sed 's/\"parent\":[0-9][0-9]*/\"parent\":0/g'"]"#;
    let p = broken_profile(&dir, "parent-liar", DAEMON, liar);
    let (o, why) = judge(&p, "bootstrap.radix.tree");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(
        why.contains("the status says n04's parent is rank Some(0) (ctl)")
            && why.contains("its sockets say it is connected up to [\"n01\"]"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_runtime_that_never_heals_fails_the_heal_item_from_the_network_alone() {
    let dir = scratch("noheal");
    // Every DVMConnectMaxTime is read as 0 (never heal); the status reports neither states
    // nor parents, so only the network can show the orphans never reach an ancestor.
    let stubborn = r#"["sh", "-c", "c=${PRTE_MCA_prte_bootstrap_conf:-/etc/prte.conf}; sed 's/^DVMConnectMaxTime *=.*/DVMConnectMaxTime=0/' \"$c\" > \"$TMPDIR/stubborn.conf\" && PRTE_MCA_prte_bootstrap_conf=\"$TMPDIR/stubborn.conf\" exec {build_dir}/prted --bootstrap"]"#;
    let p = broken_profile_reporting(
        &dir,
        "noheal",
        stubborn,
        STATUS,
        Some(r#"["namespace", "expected", "controller_uri", "ranks"]"#),
    );
    let (o, why) = judge(&p, "bootstrap.wireup.heal");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(why.contains("nearest booted ancestor"), "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The reference daemon given one deliberate elastic defect (the runtime's test-only
/// parameter `dvmlab_test_elastic_fault`).
fn faulty(fault: &str) -> String {
    format!(
        r#"["{{build_dir}}/prted", "--bootstrap", "--prtemca", "dvmlab_test_elastic_fault", "{fault}"]"#
    )
}

#[test]
fn a_runtime_that_parks_nothing_fails_deferral() {
    let dir = scratch("parks-nothing");
    let p = broken_profile(&dir, "parks-nothing", &faulty("park-nothing"), STATUS);
    let (o, why) = judge(&p, "elastic.admission.deferral");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(why.contains("held for the change"), "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_runtime_that_admits_jobs_before_its_new_daemons_are_wired_fails_grow_completion() {
    let dir = scratch("early-admit");
    let p = broken_profile(&dir, "early-admit", &faulty("complete-on-launch"), STATUS);
    let (o, why) = judge(&p, "elastic.grow.park-map");
    assert_eq!(o, Outcome::Fail, "{why}");
    let (o, why) = judge(&p, "elastic.grow.complete-def");
    assert_eq!(o, Outcome::Fail, "{why}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_runtime_that_rolls_a_failed_grow_back_partly_fails_rollback() {
    let dir = scratch("partial-rollback");
    let p = broken_profile(
        &dir,
        "partial-rollback",
        &faulty("partial-rollback"),
        STATUS,
    );
    let (o, why) = judge(&p, "elastic.grow.rollback");
    assert_eq!(o, Outcome::Fail, "{why}");
    assert!(
        why.contains("exactly the membership before the grow"),
        "{why}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
