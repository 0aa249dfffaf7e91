//! The lab without Docker: `lab up --backend netns` runs the same cluster on netns hosts,
//! kept by a background process, and every command works on it as on containers. Needs
//! root for network namespaces; says so loudly otherwise.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dvmlab_harness::{netns_available, skip, wait_until};

mod common;
use common::{lab, ok, workspace, Down, LAB};

/// The state of `host` in `lab status --json`.
fn member_state(host: &str) -> Result<String, String> {
    let o = lab(&["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|e| format!("status --json: {e}: {}", String::from_utf8_lossy(&o.stderr)))?;
    s["members"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["host"] == host)
        .and_then(|m| m["state"].as_str().map(str::to_string))
        .ok_or_else(|| format!("{host} not in {s}"))
}

fn namespaces() -> String {
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn without_docker_the_lab_runs_on_netns_hosts_and_every_command_works() {
    if !netns_available() {
        return skip("lab_on_netns", "needs root for network namespaces");
    }
    // The keeper runs prted from the directory given; build the runtime there.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "-q", "-p", "dvmlab-runtime", "--bins"])
        .current_dir(workspace())
        .status()
        .unwrap();
    assert!(built.success());
    let bin_dir = Path::new(LAB).parent().unwrap().display().to_string();
    let before = namespaces();
    let _down = Down(&["ctl", "node01", "node03"]);
    let up = ok(&[
        "up",
        "--backend",
        "netns",
        "--nodes",
        "4",
        "--radix",
        "2",
        "--hold",
        "node04",
        "--bin-dir",
        &bin_dir,
    ]);
    assert!(up.contains("lab up on netns hosts: 4 of 5"), "{up}");
    assert!(lab(&["up", "--backend", "netns"]).status.code() == Some(1));

    ok(&["late-boot", "node04"]);
    wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
        (member_state("node04")? == "joined")
            .then_some(())
            .ok_or("node04 not joined yet".to_string())
    })
    .unwrap();

    let names = ok(&["run", "--", "hostname"]);
    let mut names: Vec<&str> = names.lines().collect();
    names.sort_unstable();
    assert_eq!(names, ["node01", "node02", "node03", "node04"]);
    assert_eq!(
        lab(&["run", "-n", "2", "--", "sh", "-c", "exit 3"])
            .status
            .code(),
        Some(3)
    );

    ok(&["freeze", "node02"]);
    assert!(ok(&["status"]).contains("node02 (frozen)"));
    ok(&["thaw", "node02"]);
    ok(&["partition", "node01", "node03"]);
    ok(&["heal"]);

    ok(&["kill", "node03"]);
    wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
        (member_state("node03")? == "lost")
            .then_some(())
            .ok_or("node03 not lost yet".to_string())
    })
    .unwrap();
    ok(&["restart", "node03"]);
    assert!(ok(&["logs", "node03"]).contains("joined the DVM"));

    ok(&["down"]);
    // Other tests make namespaces meanwhile: what `down` must leave is none whose owner (the
    // pid in its name) is gone, as the lab's keeper now is.
    let orphans: Vec<String> = namespaces()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !before.contains(*n))
        .filter(|n| {
            let pid = n
                .strip_prefix("dvl")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            pid.is_some_and(|p| !dvmlab_harness::gc::alive(p))
        })
        .map(String::from)
        .collect();
    assert!(
        orphans.is_empty(),
        "down left namespaces behind: {orphans:?}"
    );
    assert!(lab(&["status"]).status.code() != Some(0));
}
