//! The lab on netns hosts (`lab up --backend netns`, the harness's netns backend): every
//! lab command, and `down` leaving no namespace of the lab's run behind. Needs root for
//! network namespaces; says so loudly otherwise.

use std::process::Command;

use dvmlab_harness::{netns_available, skip};

mod common;
use common::{every_command_works, Down};

#[test]
fn the_lab_on_netns_hosts_forms_runs_jobs_takes_every_fault_and_leaves_nothing_behind() {
    if !netns_available() {
        return skip("lab_on_netns", "needs root for network namespaces");
    }
    // `down` removes the directory with the keeper.
    let dir = std::env::temp_dir().join(format!("dvmlab-lab-test-netns-{}", std::process::id()));
    let _down = Down(dir.clone(), &["ctl", "node01", "node03"]);
    let run = every_command_works(&dir, "netns");
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with(&format!("{run}-")))
        .map(String::from)
        .collect();
    assert!(left.is_empty(), "down left namespaces of {run}: {left:?}");
}

#[test]
fn the_elastic_lab_on_netns_hosts_grows_onto_spares_parks_jobs_during_a_shrink_and_allocates() {
    if !netns_available() {
        return skip("lab_on_netns", "needs root for network namespaces");
    }
    let dir = std::env::temp_dir().join(format!(
        "dvmlab-lab-test-netns-elastic-{}",
        std::process::id()
    ));
    let _down = Down(dir.clone(), &["ctl", "node02", "spare01", "spare03"]);
    common::elastic_commands_work(&dir, "netns");
}
