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
