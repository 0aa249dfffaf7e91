//! End to end: the elastic DVM. Daemons started on spare hosts through the harness's launch
//! agent (`plm_ssh_agent`), shrinks, parked jobs, rollback, the two phases `palloc` prints,
//! and a fixed-size DVM refusing all of it.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use dvmlab_harness::IpMode;
use dvmlab_proto::contract::{MemberState, StatusReport};
use serde_json::Value;

pub const PALLOC: &str = env!("CARGO_BIN_EXE_palloc");

/// The harness program, built beside the runtime's binaries (the workspace builds both).
fn harness_bin() -> PathBuf {
    let p = std::path::Path::new(PRTED).with_file_name("dvmlab-harness");
    assert!(
        p.exists(),
        "{} is missing: build the workspace (cargo build) so the launch agent can enter hosts",
        p.display()
    );
    p
}

/// An elastic DVM of `ctl` and `n` nodes, formed, with `spares` spare hosts `g01…` that
/// are in the cluster but not in `DVMNodes`; `extra` are more `--prtemca` pairs for every
/// daemon. `None` after saying why `test` skips.
fn elastic(test: &str, n: usize, spares: usize, extra: &[(&str, &str)]) -> Option<Dvm> {
    let b = backend(test, Needs::AnyBackend)?;
    let (_, mut hosts) = ctl_and_nodes(n);
    hosts.extend((1..=spares).map(|i| format!("g{i:02}")));
    let conf = conf_for(n);
    let mut dvm = Dvm::new(test, b, IpMode::V4, &hosts, &conf);
    let agent = dvm.cluster.write_agent(&harness_bin()).unwrap();
    let mut argv = vec![PRTED.to_string(), "--bootstrap".to_string()];
    let mut pairs = vec![
        ("prte_elastic_mode", "1"),
        ("plm_ssh_agent", agent.to_str().unwrap()),
        ("dvmlab_launch_timeout", "20"),
        ("state_base_verbose", "1"),
    ];
    pairs.extend_from_slice(extra);
    for (k, v) in pairs {
        argv.extend(["--prtemca".to_string(), k.to_string(), v.to_string()]);
    }
    dvm.cluster.set_daemon(argv);
    dvm.cluster.start_many(&hosts[..=n]).unwrap();
    dvm.wait_formed(Duration::from_secs(10));
    Some(dvm)
}

/// Runs `palloc ARGS --json` on the controller's host: (exit code, JSON lines, stderr).
fn palloc(dvm: &Dvm, args: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let mut argv = vec![PALLOC.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    argv.push("--json".into());
    let (st, out, err) = dvm
        .cluster
        .exec_within(&dvm.ctl, &argv, Duration::from_secs(60))
        .unwrap();
    let lines = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    (st.and_then(|s| s.code()), lines, err)
}

fn state_of(s: &StatusReport, host: &str) -> Option<MemberState> {
    s.members
        .iter()
        .rev()
        .find(|m| m.host == host)
        .map(|m| m.state)
}

#[test]
fn a_grow_wires_new_daemons_that_run_jobs_and_a_release_takes_one_out_with_both_phases_seen() {
    let Some(mut dvm) = elastic("elastic-grow", 4, 2, &[]) else {
        return;
    };
    let (code, lines, err) = palloc(&dvm, &["new", "--host", "g01,g02", "--request-id", "r1"]);
    assert_eq!(
        code,
        Some(0),
        "palloc new: {lines:?} {err}\n{}",
        dvm.cluster.logs_tail(40)
    );
    assert_eq!(lines[0]["phase"], "accepted", "{lines:?}");
    assert_eq!(
        lines[0]["ranks"],
        serde_json::json!([5, 6]),
        "ranks after the highest: {lines:?}"
    );
    let alloc = lines[0]["alloc_id"].clone();
    assert_eq!(lines[1]["phase"], "event");
    assert_eq!(lines[1]["code"], -195);
    assert_eq!(lines[1]["name"], "PMIX_DVM_IS_READY");
    assert_eq!(lines[1]["alloc_id"], alloc);
    assert_eq!(lines[1]["req_id"], "r1");
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "g01"), Some(MemberState::Joined), "{s:?}");
    assert_eq!(state_of(&s, "g02"), Some(MemberState::Joined));
    assert!(s.campaigns.is_empty());
    // The new daemons take jobs: one process per compute node, six of them now.
    let (code, out, err) = prun(&dvm, &["--", "hostname"]);
    assert_eq!(code, Some(0), "{err}");
    for h in ["n01", "n04", "g01", "g02"] {
        assert!(
            out.lines().any(|l| l.trim() == h),
            "no process on {h}: {out}"
        );
    }
    let (ok, out, err) = dvm.pctl(&["ping", "--all", "--json"]);
    assert!(ok, "every rank answers through the tree: {out}{err}");

    let (code, lines, err) = palloc(&dvm, &["release", "--host", "g02"]);
    assert_eq!(
        code,
        Some(0),
        "palloc release: {lines:?} {err}\n{}",
        dvm.cluster.logs_tail(40)
    );
    assert_eq!(lines[1]["code"], -195, "{lines:?}");
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "g02"), Some(MemberState::Departed), "{s:?}");
    let (code, out, _) = prun(&dvm, &["--", "hostname"]);
    assert_eq!(code, Some(0));
    assert!(!out.contains("g02"), "a departed node runs nothing: {out}");
    assert_eq!(out.lines().count(), 5, "{out}");
    let (ok, out, err) = dvm.pctl(&["ping", "--all"]);
    assert!(ok, "the tree is whole without g02: {out}{err}");

    let mut all: Vec<String> = ["ctl", "n01", "n02", "n03", "n04"]
        .map(String::from)
        .to_vec();
    all.retain(|h| h != "g02");
    dvm.stop_cleanly(&all);
}

#[test]
fn a_fixed_size_dvm_refuses_to_grow_or_shrink_and_sends_no_event() {
    let Some((mut dvm, hosts)) = Dvm::formed("elastic-off", Needs::AnyBackend, 2, 64) else {
        return;
    };
    let (ok, _, err) = dvm.pctl(&["grow", "--add-host", "g01"]);
    assert!(!ok && err.contains("fixed-size"), "{err}");
    let (ok, _, err) = dvm.pctl(&["shrink", "n02"]);
    assert!(!ok && err.contains("elastic mode"), "{err}");
    let (code, lines, err) = palloc(&dvm, &["new", "--host", "g01", "--timeout", "3"]);
    assert_eq!(code, Some(1), "{lines:?} {err}");
    assert_eq!(lines.len(), 1, "a rejection and no event: {lines:?}");
    assert_eq!(lines[0]["phase"], "rejected");
    let s = dvm.status().unwrap();
    assert!(!s.elastic && s.campaigns.is_empty());
    assert_eq!(s.members.len(), 3);
    dvm.stop_cleanly(&hosts);
}
