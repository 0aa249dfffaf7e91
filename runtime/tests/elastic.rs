//! End to end: the elastic DVM. Daemons started on spare hosts through the harness's launch
//! agent (`plm_ssh_agent`), shrinks, parked jobs, rollback, the two phases `palloc` prints,
//! and a fixed-size DVM refusing all of it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use dvmlab_harness::{wait_until, IpMode};
use dvmlab_proto::contract::{MemberState, StatusReport};
use serde_json::Value;

pub const PALLOC: &str = env!("CARGO_BIN_EXE_palloc");
pub const PLAUNCH: &str = env!("CARGO_BIN_EXE_plaunch");

/// How an elastic test DVM is set up.
#[derive(Default)]
struct Setup<'a> {
    /// More `--prtemca` pairs for every daemon.
    extra: &'a [(&'a str, &'a str)],
    /// The launch agent waits for `RUN_DIR/open-HOST` (or fails at `RUN_DIR/fail-HOST`)
    /// before it hands over, and writes the daemon's pid to `RUN_DIR/pid-HOST`: a grow
    /// stays in progress until the test lets it go.
    gated: bool,
    /// More `prte.conf` keys.
    conf: &'a [(&'a str, &'a str)],
    needs: Option<Needs>,
    /// The launch agent's words in place of the harness's.
    agent: Option<&'a str>,
}

/// An elastic DVM of `ctl` and `n` nodes, formed, with `spares` spare hosts `g01…` that
/// are in the cluster but not in `DVMNodes`. `None` after saying why `test` skips.
fn elastic(test: &str, n: usize, spares: usize, extra: &[(&str, &str)]) -> Option<Dvm> {
    elastic_with(
        test,
        n,
        spares,
        Setup {
            extra,
            ..Setup::default()
        },
    )
}

fn elastic_with(test: &str, n: usize, spares: usize, setup: Setup) -> Option<Dvm> {
    let extra = setup.extra;
    let b = backend(test, setup.needs.unwrap_or(Needs::AnyBackend))?;
    let (_, mut hosts) = ctl_and_nodes(n);
    hosts.extend((1..=spares).map(|i| format!("g{i:02}")));
    let mut conf = conf_for(n);
    for (k, v) in setup.conf {
        conf = conf.set(k, *v);
    }
    let mut dvm = Dvm::new(test, b, IpMode::V4, &hosts, &conf);
    let mut agent = dvm
        .cluster
        .write_agent(&dvmlab_harness::agent::program().unwrap())
        .unwrap();
    if setup.gated {
        agent = dvmlab_harness::agent::write_gated(dvm.cluster.run_dir(), &agent).unwrap();
    }
    let mut argv = vec![PRTED.to_string(), "--bootstrap".to_string()];
    let mut pairs = vec![
        ("prte_elastic_mode", "1"),
        (
            "plm_ssh_agent",
            setup.agent.unwrap_or(agent.to_str().unwrap()),
        ),
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

#[test]
fn a_grow_naming_a_host_that_does_not_resolve_is_refused_at_once_with_no_event_and_no_launch() {
    let Some(mut dvm) = elastic("elastic-unknown", 2, 1, &[]) else {
        return;
    };
    let before = membership(&dvm.status().unwrap());
    let (code, lines, err) = palloc(
        &dvm,
        &["new", "--host", "g01,nosuch-host", "--timeout", "3"],
    );
    assert_eq!(code, Some(1), "{lines:?} {err}");
    assert_eq!(lines.len(), 1, "a rejection and no event: {lines:?}");
    assert_eq!(lines[0]["phase"], "rejected");
    let why = lines[0]["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("unknown host") && why.contains("nosuch-host") && !why.contains("g01 "),
        "names the host that does not resolve: {why}"
    );
    let (ok, _, err) = dvm.pctl(&["grow", "--add-host", "nosuch-host"]);
    assert!(!ok && err.contains("unknown host"), "{err}");
    let s = dvm.status().unwrap();
    assert_eq!(membership(&s), before, "nothing launched, nothing added");
    assert!(s.campaigns.is_empty());
    assert!(
        !dvm.cluster.log("ctl").contains("launching rank"),
        "no launch was tried"
    );
    dvm.stop_cleanly(&["n01".to_string(), "n02".to_string()]);
}

/// Lets the gated agent hand `host` over (or, with `fail`, fail it).
fn gate(dvm: &Dvm, host: &str, fail: bool) {
    dvmlab_harness::agent::gate(dvm.cluster.run_dir(), host, !fail).unwrap();
}

/// Starts `palloc ARGS --json` on the controller's host, its stdout to `out`.
fn spawn_palloc(dvm: &Dvm, args: &[&str], out: &Path) -> std::process::Child {
    let mut argv = vec![PALLOC.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    argv.push("--json".into());
    dvm.cluster
        .command(&dvm.ctl, &argv)
        .unwrap()
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Waits for a background tool to exit (at most a minute): its exit code.
fn finish(child: &mut std::process::Child, what: &str) -> Option<i32> {
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(20),
        || match child.try_wait() {
            Ok(Some(st)) => Ok(st.code()),
            Ok(None) => Err(format!("{what} still running")),
            Err(e) => panic!("{what}: {e}"),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn json_lines(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// Waits until `pctl jobs` shows job `id` in `state`.
fn wait_job_state(dvm: &Dvm, id: u64, state: &str) {
    wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
        let js = jobs(dvm);
        match js.iter().find(|j| j.id == id) {
            Some(j) if j.state == state => Ok(()),
            other => Err(format!("job {id} not yet {state}: {other:?}")),
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", dvm.cluster.logs_tail(30)));
}

fn wait_campaigns(dvm: &Dvm, n: usize) -> StatusReport {
    dvm.wait_status(Duration::from_secs(20), "campaigns in progress", |s| {
        s.campaigns.len() == n
    })
}

/// The non-departed members: (rank, host).
fn membership(s: &StatusReport) -> Vec<(u32, String)> {
    s.members
        .iter()
        .filter(|m| m.state != MemberState::Departed)
        .map(|m| (m.rank, m.host.clone()))
        .collect()
}

#[test]
fn jobs_submitted_during_a_grow_wait_unharmed_by_an_unrelated_loss_then_use_the_new_nodes() {
    let Some(mut dvm) = elastic_with(
        "elastic-park",
        4,
        2,
        Setup {
            gated: true,
            ..Setup::default()
        },
    ) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    let mut alloc = spawn_palloc(&dvm, &["new", "--host", "g01,g02"], &dir.join("palloc.out"));
    let s = wait_campaigns(&dvm, 1);
    assert_eq!(s.campaigns[0].kind, "grow");
    let mut job = spawn_prun(&dvm, &["--", "hostname"], &dir.join("job.out"));
    wait_job_state(&dvm, 1, "WAITING FOR DAEMON CAMPAIGN");
    // A daemon no campaign targets dies: the grow goes on, the job stays held.
    dvm.cluster.kill("n02").unwrap();
    dvm.wait_status(Duration::from_secs(10), "n02 lost", |s| {
        state_of(s, "n02") == Some(MemberState::Lost)
    });
    wait_job_state(&dvm, 1, "WAITING FOR DAEMON CAMPAIGN");
    assert_eq!(dvm.status().unwrap().campaigns.len(), 1);
    gate(&dvm, "g01", false);
    gate(&dvm, "g02", false);
    assert_eq!(
        finish(&mut alloc, "palloc"),
        Some(0),
        "{}",
        dvm.cluster.logs_tail(40)
    );
    let lines = json_lines(&dir.join("palloc.out"));
    assert_eq!(lines[1]["code"], -195, "{lines:?}");
    assert_eq!(
        finish(&mut job, "prun"),
        Some(0),
        "{}",
        dvm.cluster.logs_tail(40)
    );
    let out = std::fs::read_to_string(dir.join("job.out")).unwrap();
    let mut ran: Vec<&str> = out.lines().map(str::trim).collect();
    ran.sort();
    assert_eq!(
        ran,
        ["g01", "g02", "n01", "n03", "n04"],
        "mapped after the grow, onto the DVM as it then was"
    );
    let log = dvm.cluster.log("ctl");
    assert!(
        log.contains("job 1 state WAITING FOR DAEMON CAMPAIGN (17)"),
        "state 17 in the verbose log:\n{log}"
    );
    dvm.stop_cleanly(&["ctl".into(), "n01".into(), "n03".into(), "n04".into()]);
}

#[test]
fn a_grow_whose_launch_fails_is_undone_exactly_and_the_jobs_held_for_it_end_unlaunched() {
    let Some(mut dvm) = elastic_with(
        "elastic-fail",
        3,
        1,
        Setup {
            gated: true,
            ..Setup::default()
        },
    ) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    let before = membership(&dvm.status().unwrap());
    let mut alloc = spawn_palloc(
        &dvm,
        &["new", "--host", "g01", "--request-id", "mine"],
        &dir.join("palloc.out"),
    );
    wait_campaigns(&dvm, 1);
    let (ok, _, _) = dvm.pctl(&["status"]);
    assert!(ok);
    let mut job = spawn_prun(&dvm, &["--", "hostname"], &dir.join("job.out"));
    wait_job_state(&dvm, 1, "WAITING FOR DAEMON CAMPAIGN");
    gate(&dvm, "g01", true);
    assert_eq!(finish(&mut alloc, "palloc"), Some(1));
    let lines = json_lines(&dir.join("palloc.out"));
    assert_eq!(lines[0]["phase"], "accepted", "{lines:?}");
    assert_eq!(lines[1]["code"], -196, "{lines:?}");
    assert_eq!(lines[1]["name"], "PMIX_ERR_DVM_MOD");
    assert_eq!(lines[1]["cause"], -3001, "the launch failed: {lines:?}");
    assert_eq!(lines[1]["req_id"], "mine");
    assert_eq!(lines[1]["alloc_id"], lines[0]["alloc_id"]);
    assert_eq!(
        finish(&mut job, "prun"),
        Some(1),
        "a held job of a failed grow fails"
    );
    let j = jobs(&dvm).into_iter().find(|j| j.id == 1).unwrap();
    assert_eq!(j.state, "INACTIVE");
    assert!(
        j.exception
            .as_deref()
            .is_some_and(|e| e.starts_with("grow-failed")),
        "{j:?}"
    );
    assert!(j.placement.is_empty(), "it never ran anywhere: {j:?}");
    let s = dvm.status().unwrap();
    assert_eq!(
        membership(&s),
        before,
        "exactly the membership before the grow"
    );
    assert!(s.campaigns.is_empty());
    // The DVM is whole and takes jobs as before.
    let (code, out, err) = prun(&dvm, &["--", "hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 3);
    dvm.stop_cleanly(&ctl_and_nodes(3).1);
}

#[test]
fn a_new_daemon_killed_before_it_is_wired_rolls_its_grow_back_and_the_other_grow_completes() {
    let Some(mut dvm) = elastic_with(
        "elastic-kill",
        2,
        2,
        Setup {
            gated: true,
            needs: Some(Needs::Netns),
            ..Setup::default()
        },
    ) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    // g01's daemon starts, but cannot reach its parent: it never reports in.
    dvm.cluster.set_connected("g01", false).unwrap();
    let mut a = spawn_palloc(&dvm, &["new", "--host", "g01"], &dir.join("a.out"));
    let mut b = spawn_palloc(&dvm, &["new", "--host", "g02"], &dir.join("b.out"));
    wait_campaigns(&dvm, 2);
    gate(&dvm, "g01", false);
    let pid = wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
        dvmlab_harness::agent::gated_pid(&dir, "g01").ok_or("no pid yet".to_string())
    })
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(finish(&mut a, "palloc a"), Some(1));
    let lines = json_lines(&dir.join("a.out"));
    assert_eq!(lines[1]["code"], -196, "{lines:?}");
    assert_eq!(lines[1]["cause"], -3001, "{lines:?}");
    assert_eq!(
        dvm.status().unwrap().campaigns.len(),
        1,
        "the other grow goes on"
    );
    gate(&dvm, "g02", false);
    assert_eq!(
        finish(&mut b, "palloc b"),
        Some(0),
        "{}",
        dvm.cluster.logs_tail(30)
    );
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "g01"), Some(MemberState::Departed));
    assert_eq!(state_of(&s, "g02"), Some(MemberState::Joined));
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "nothing of the failed grow runs"
    );
    dvm.stop_cleanly(&ctl_and_nodes(2).1);
}

#[test]
fn a_shrink_target_that_crashes_instead_of_leaving_completes_the_shrink() {
    let Some(mut dvm) = elastic("elastic-crash", 3, 0, &[]) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    dvm.cluster.freeze("n03").unwrap();
    let mut alloc = spawn_palloc(&dvm, &["release", "--host", "n03"], &dir.join("p.out"));
    let s = wait_campaigns(&dvm, 1);
    assert_eq!(s.campaigns[0].kind, "shrink");
    assert_eq!(state_of(&s, "n03"), Some(MemberState::Departing));
    dvm.cluster.kill("n03").unwrap();
    assert_eq!(
        finish(&mut alloc, "palloc"),
        Some(0),
        "{}",
        dvm.cluster.logs_tail(30)
    );
    assert_eq!(json_lines(&dir.join("p.out"))[1]["code"], -195);
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "n03"), Some(MemberState::Departed));
    let (ok, out, err) = dvm.pctl(&["ping", "--all"]);
    assert!(ok, "{out}{err}");
    dvm.stop_cleanly(&["ctl".into(), "n01".into(), "n02".into()]);
}

#[test]
fn a_job_mapped_onto_a_departing_node_is_mapped_again_onto_the_survivors_not_failed() {
    // Job 1's prolog holds the one launch slot until the test lets it go; job 2 is mapped
    // onto every node meanwhile and waits for its turn, then for the shrink.
    let Some(mut dvm) = elastic_with(
        "elastic-remap",
        4,
        0,
        Setup {
            extra: &[("dvmlab_max_launching", "1")],
            conf: &[(
                "JobProlog",
                "[ \"$DVMLAB_JOB_ID\" != 1 ] || while [ ! -e \"$TMPDIR/../../go\" ]; do sleep 0.02; done",
            )],
            ..Setup::default()
        },
    ) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    let mut first = spawn_prun(
        &dvm,
        &["-n", "1", "--host", "n01", "--", "true"],
        &dir.join("1.out"),
    );
    wait_job_state(&dvm, 1, "STARTING");
    let mut second = spawn_prun(&dvm, &["--", "hostname"], &dir.join("2.out"));
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let j = jobs(&dvm).into_iter().find(|j| j.id == 2);
        match j {
            Some(j) if j.placement.iter().any(|p| p.host == "n04") => Ok(()),
            other => Err(format!("job 2 not mapped onto n04 yet: {other:?}")),
        }
    })
    .unwrap();
    let (ok, out, err) = dvm.pctl(&["shrink", "n04", "--wait"]);
    assert!(ok, "{out}{err}\n{}", dvm.cluster.logs_tail(30));
    std::fs::write(dir.join("go"), "").unwrap();
    assert_eq!(finish(&mut first, "prun 1"), Some(0));
    assert_eq!(
        finish(&mut second, "prun 2"),
        Some(0),
        "{}",
        dvm.cluster.logs_tail(30)
    );
    let out = std::fs::read_to_string(dir.join("2.out")).unwrap();
    let mut ran: Vec<&str> = out.lines().map(str::trim).collect();
    ran.sort();
    assert_eq!(ran, ["n01", "n02", "n03"], "remapped off n04");
    dvm.stop_cleanly(&ctl_and_nodes(3).1);
}

#[test]
fn a_dvm_grows_from_8_to_16_while_jobs_keep_arriving_and_none_fails() {
    let Some(mut dvm) = elastic("elastic-busy", 8, 8, &[]) else {
        return;
    };
    let spares: Vec<String> = (1..=8).map(|i| format!("g{i:02}")).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let results = std::thread::scope(|sc| {
        let submitter = sc.spawn(|| {
            let mut codes = Vec::new();
            let mut hosts = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || codes.len() < 3 {
                let (code, out, err) = prun(&dvm, &["--", "hostname"]);
                codes.push((code, err));
                hosts.extend(out.lines().map(|l| l.trim().to_string()));
            }
            (codes, hosts)
        });
        let (code, lines, err) = palloc(&dvm, &["new", "--host", &spares.join(",")]);
        assert_eq!(code, Some(0), "{lines:?} {err}");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        submitter.join().unwrap()
    });
    let (codes, hosts) = results;
    for (code, err) in &codes {
        assert_eq!(*code, Some(0), "a job failed during the grow: {err}");
    }
    let (code, out, _) = prun(&dvm, &["--", "hostname"]);
    assert_eq!(code, Some(0));
    assert_eq!(out.lines().count(), 16, "{out}");
    assert!(hosts.len() >= 8, "{hosts:?}");
    let s = dvm.status().unwrap();
    assert_eq!(
        s.members
            .iter()
            .filter(|m| m.state == MemberState::Joined)
            .count(),
        17
    );
    let mut all = ctl_and_nodes(8).1;
    all.retain(|h| !h.starts_with('g'));
    dvm.stop_cleanly(&all);
}

/// Two shrinks at once, one target below the other: n01 and n07 (radix 2: 7 is below 3,
/// which is below 1). n01's departure cuts n03's subtree off, n07 included, for a moment;
/// that passing loss is not n07's departure, or the shrink of n07 would end before n07 left
/// and the job on its children n15 and n23 would fail when they move. (The simulator's
/// `a_shrink_below_a_departing_daemon_ends_on_its_own_targets_departure` pins the
/// interleaving; this runs it on real daemons, in whatever order it comes.)
#[test]
fn two_shrinks_at_once_one_below_the_other_fail_no_job_and_end_on_the_departures() {
    let Some(mut dvm) = elastic_with(
        "elastic-nested",
        24,
        0,
        Setup {
            conf: &[("DVMRadix", "2")],
            ..Setup::default()
        },
    ) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    let mut long = spawn_prun(
        &dvm,
        &["--host", "n15,n23", "--", "sh", "-c", "sleep 2; hostname"],
        &dir.join("long.out"),
    );
    wait_job_state(&dvm, 1, "RUNNING");
    let held = &dvm;
    let (shrinks, others) = std::thread::scope(|sc| {
        let shrinks: Vec<_> = ["n01", "n07"]
            .map(|h| sc.spawn(move || held.pctl(&["shrink", h, "--wait"])))
            .into_iter()
            .collect();
        let mut others = Vec::new();
        while others.len() < 4 || shrinks.iter().any(|t| !t.is_finished()) {
            // On survivors that move (below n01 and n03), never on a target: a release
            // of a host that runs job processes is refused.
            others.push(prun(held, &["--host", "n05,n11", "--", "true"]));
        }
        let shrinks: Vec<_> = shrinks.into_iter().map(|t| t.join().unwrap()).collect();
        (shrinks, others)
    });
    for (ok, out, err) in &shrinks {
        assert!(ok, "{out}{err}\n{}", dvm.cluster.logs_tail(40));
    }
    // Ended by the departures, not cut off at the launch timeout (the controller logs
    // each target it cut off and each survivor it stopped waiting for).
    let log = dvm.cluster.log("ctl");
    assert!(
        !log.contains("did not leave within") && !log.contains("not waiting any longer"),
        "{log}"
    );
    for (code, _, err) in &others {
        assert_eq!(*code, Some(0), "a job failed during the shrinks: {err}");
    }
    assert_eq!(
        finish(&mut long, "the job on n15 and n23"),
        Some(0),
        "{}",
        dvm.cluster.logs_tail(40)
    );
    let mut ran: Vec<String> = std::fs::read_to_string(dir.join("long.out"))
        .unwrap()
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    ran.sort();
    assert_eq!(ran, ["n15", "n23"]);
    let s = dvm.status().unwrap();
    assert!(s.formed, "{s:?}");
    for m in &s.members {
        let want = if ["n01", "n07"].contains(&m.host.as_str()) {
            MemberState::Departed
        } else {
            MemberState::Joined
        };
        assert_eq!(m.state, want, "{}: {s:?}", m.host);
    }
    let mut stay = ctl_and_nodes(24).1;
    stay.retain(|h| h != "n01" && h != "n07");
    dvm.stop_cleanly(&stay);
}

#[test]
fn a_job_process_asks_for_an_allocation_and_alone_hears_its_event() {
    let Some(mut dvm) = elastic("elastic-proc", 2, 1, &[]) else {
        return;
    };
    // A listener on the controller's node registered for both codes, as a bystander.
    let dir = dvm.cluster.run_dir().to_path_buf();
    let mut argv = vec![PEVENT.to_string()];
    argv.extend(
        [
            "listen",
            "--handler",
            "name=b,codes=-195:-196",
            "--timeout",
            "20",
        ]
        .map(String::from),
    );
    let mut bystander = dvm
        .cluster
        .command("ctl", &argv)
        .unwrap()
        .stdout(std::fs::File::create(dir.join("b.out")).unwrap())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let t = std::fs::read_to_string(dir.join("b.out")).unwrap_or_default();
        if t.contains("\"ready\"") {
            Ok(())
        } else {
            Err("bystander not ready".to_string())
        }
    })
    .unwrap();
    let (code, out, err) = prun(
        &dvm,
        &[
            "-n", "1", "--host", "n01", "--", PALLOC, "new", "--host", "g01", "--json",
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}\n{}", dvm.cluster.logs_tail(30));
    let lines: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(lines[0]["phase"], "accepted", "{out}");
    assert_eq!(
        lines[1]["code"], -195,
        "the job process hears its event: {out}"
    );
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "g01"), Some(MemberState::Joined));
    let _ = bystander.kill();
    let _ = bystander.wait();
    let heard = std::fs::read_to_string(dir.join("b.out")).unwrap_or_default();
    assert!(
        !heard.contains("\"handler\""),
        "a bystander hears nothing: {heard}"
    );
    dvm.stop_cleanly(&ctl_and_nodes(2).1);
}

#[test]
fn a_restarted_controller_takes_up_the_grown_membership_and_the_grown_daemons_run_jobs() {
    let Some(mut dvm) = elastic("elastic-restart", 2, 1, &[]) else {
        return;
    };
    let (code, lines, err) = palloc(&dvm, &["new", "--host", "g01"]);
    assert_eq!(code, Some(0), "{lines:?} {err}");
    dvm.cluster.kill("ctl").unwrap();
    dvm.cluster.start("ctl").unwrap();
    let s = dvm.wait_status(Duration::from_secs(20), "the grown daemon back", |s| {
        s.formed && state_of(s, "g01") == Some(MemberState::Joined)
    });
    assert_eq!(s.members.len(), 4, "{s:?}");
    let (code, out, err) = prun(&dvm, &["-n", "1", "--host", "g01", "--", "hostname"]);
    assert_eq!((code, out.trim()), (Some(0), "g01"), "{err}");
    let log = dvm.cluster.log("ctl");
    assert!(log.contains("took up the membership"), "{log}");
    dvm.stop_cleanly(&["n01".to_string(), "n02".to_string()]);
}

#[test]
fn a_grow_with_one_daemon_wired_and_one_failed_is_undone_and_the_wired_one_leaves() {
    let Some(mut dvm) = elastic_with(
        "elastic-half",
        2,
        2,
        Setup {
            gated: true,
            ..Setup::default()
        },
    ) else {
        return;
    };
    let dir = dvm.cluster.run_dir().to_path_buf();
    let mut alloc = spawn_palloc(&dvm, &["new", "--host", "g01,g02"], &dir.join("p.out"));
    wait_campaigns(&dvm, 1);
    gate(&dvm, "g01", false);
    dvm.wait_status(Duration::from_secs(20), "g01 wired", |s| {
        s.campaigns.first().is_some_and(|c| c.done.len() == 1)
    });
    gate(&dvm, "g02", true);
    assert_eq!(finish(&mut alloc, "palloc"), Some(1));
    let pid = dvmlab_harness::agent::gated_pid(&dir, "g01").unwrap();
    wait_until(
        Duration::from_secs(20),
        Duration::from_millis(20),
        || match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
            Err(_) => Ok(()),
            Ok(()) => Err("g01's daemon still runs".to_string()),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", dvm.cluster.logs_tail(30)));
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "g01"), Some(MemberState::Departed));
    assert_eq!(state_of(&s, "g02"), Some(MemberState::Departed));
    assert!(s.formed && s.campaigns.is_empty(), "{s:?}");
    dvm.stop_cleanly(&ctl_and_nodes(2).1);
}

/// A host with no way in but the launch service: the controller's agent is `plaunch run`,
/// and the spare serves `plaunch serve` (no harness agent, no ssh), as swarm tasks and pods
/// do. The DVM grows onto it, runs a job there, shrinks off it (the service sees its daemon
/// end) and grows onto it again.
#[test]
fn a_dvm_grows_through_the_launch_service_onto_a_host_with_no_other_way_in_and_off_it_again() {
    let agent = format!("{PLAUNCH} run");
    let Some(dvm) = elastic_with(
        "elastic-plaunch",
        2,
        1,
        Setup {
            agent: Some(&agent),
            needs: Some(Needs::Netns),
            ..Setup::default()
        },
    ) else {
        return;
    };
    let log = dvm.cluster.run_dir().join("g01-plaunch.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut serve = dvm
        .cluster
        .command(
            "g01",
            &[
                PLAUNCH.into(),
                "serve".into(),
                "--allow".into(),
                PRTED.into(),
            ],
        )
        .unwrap();
    serve
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    let mut serve = serve.spawn().unwrap();
    let said = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        (said("serving on") == 1)
            .then_some(())
            .ok_or("plaunch serve never said it serves".to_string())
    })
    .unwrap();
    let show = |dvm: &Dvm| {
        format!(
            "plaunch on g01:\n{}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            dvm.cluster.logs_tail(40)
        )
    };

    let (ok, out, err) = dvm.pctl(&["grow", "--add-host", "g01", "--wait"]);
    assert!(ok, "grow: {out} {err}\n{}", show(&dvm));
    assert_eq!(
        state_of(&dvm.status().unwrap(), "g01"),
        Some(MemberState::Joined)
    );
    assert_eq!(said("started pid"), 1, "{}", show(&dvm));
    let (code, out, err) = prun(&dvm, &["--", "hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines().any(|l| l.trim() == "g01"),
        "no process on g01: {out}"
    );

    let (ok, out, err) = dvm.pctl(&["shrink", "g01", "--wait"]);
    assert!(ok, "shrink: {out} {err}\n{}", show(&dvm));
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        (said("ended: exit status: 0") == 1)
            .then_some(())
            .ok_or("the service never saw its daemon leave cleanly".to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", show(&dvm)));

    let (ok, out, err) = dvm.pctl(&["grow", "--add-host", "g01", "--wait"]);
    assert!(ok, "grow again: {out} {err}\n{}", show(&dvm));
    assert_eq!(said("started pid"), 2, "{}", show(&dvm));
    let s = dvm.status().unwrap();
    assert_eq!(state_of(&s, "g01"), Some(MemberState::Joined), "{s:?}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = serve.wait().unwrap();
    assert!(st.success(), "plaunch serve: {st}\n{}", show(&dvm));
    assert_eq!(
        said("ended"),
        2,
        "the service took its daemon with it\n{}",
        show(&dvm)
    );
}
