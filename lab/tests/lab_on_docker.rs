//! The lab end to end on the Docker engine: image built from scratch, a DVM formed in
//! containers, a job on every node, a killed node seen in the status, and `down` leaving
//! nothing behind. Needs Docker and Debian's busybox-static; says so loudly otherwise.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dvmlab_harness::{skip, wait_until};

mod common;
use common::{lab, ok, workspace, Down};

fn docker(args: &[&str]) -> String {
    let o = Command::new("docker").args(args).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_lab_forms_in_containers_runs_jobs_shows_a_killed_node_and_leaves_nothing_behind() {
    let docker_up = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !docker_up {
        return skip("lab_on_docker", "no Docker engine here");
    }
    if !Path::new("/bin/busybox").exists() {
        return skip(
            "lab_on_docker",
            "no /bin/busybox (apt-get install busybox-static)",
        );
    }
    assert!(
        docker(&["ps", "-a", "--filter", "label=dvmlab.lab", "-q"]).is_empty(),
        "a lab is already up here; `lab down` first"
    );
    let make = Command::new("make")
        .args(["-s", "lab-bins"])
        .current_dir(workspace())
        .status()
        .unwrap();
    assert!(make.success(), "make lab-bins");
    let _down = Down(&["ctl", "node01", "node07"]);
    ok(&[
        "image",
        "--bin-dir",
        "target/static/x86_64-unknown-linux-gnu/release",
    ]);
    let up = ok(&["up", "--nodes", "8", "--radix", "2"]);
    assert!(up.contains("9 of 9 daemons joined"), "{up}");

    let out = ok(&["run", "--", "hostname"]);
    let mut names: Vec<&str> = out.lines().collect();
    names.sort();
    let want: Vec<String> = (1..=8).map(|i| format!("node{i:02}")).collect();
    assert_eq!(names, want, "one process per node, each on its own host");

    let job = lab(&["run", "--", "-n", "2", "sh", "-c", "exit 3"]);
    assert_eq!(
        job.status.code(),
        Some(3),
        "lab run exits with the job's status"
    );

    ok(&["kill", "node07"]);
    wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
        let o = lab(&["status", "--json"]);
        let s: serde_json::Value = serde_json::from_slice(&o.stdout)
            .map_err(|e| format!("status: {e}: {}", String::from_utf8_lossy(&o.stderr)))?;
        let node07 = s["members"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["host"] == "node07"))
            .cloned()
            .unwrap_or_default();
        if node07["state"] == "lost" && s["formed"] == false {
            Ok(())
        } else {
            Err(format!("node07: {node07}"))
        }
    })
    .unwrap();
    let table = ok(&["status"]);
    assert!(table.contains("containers not running: node07"), "{table}");

    let gone = ok(&["down"]);
    assert!(gone.contains("removed network dvmlab-lab"), "{gone}");
    assert!(docker(&["ps", "-a", "--filter", "label=dvmlab.lab", "-q"]).is_empty());
    assert!(docker(&["network", "ls", "--filter", "name=dvmlab-lab", "-q"]).is_empty());
    assert!(docker(&["images", "-q", "dvmlab-lab"]).is_empty());
}
