//! The lab end to end on the Docker engine (the harness's docker backend): every lab
//! command, and `down` leaving no container or network of the lab's run behind. Needs root
//! and a Docker engine; says so loudly otherwise.

use std::process::Command;

use dvmlab_harness::{netns_available, skip};

mod common;
use common::{every_command_works, Down};

fn docker(args: &[&str]) -> String {
    let o = Command::new("docker").args(args).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether `test` can run here (root to enter the containers, and an engine); says loudly
/// why not.
fn docker_here(test: &str) -> bool {
    if !netns_available() {
        skip(test, "needs root to enter the containers");
        return false;
    }
    if !dvmlab_harness::docker::Engine::available() {
        skip(test, "no Docker engine here");
        return false;
    }
    true
}

#[test]
fn the_lab_on_docker_forms_runs_jobs_takes_every_fault_and_leaves_nothing_behind() {
    if !docker_here("the_lab_on_docker_forms_runs_jobs_takes_every_fault_and_leaves_nothing_behind")
    {
        return;
    }
    // `down` removes the directory with the keeper.
    let dir = std::env::temp_dir().join(format!("dvmlab-lab-test-docker-{}", std::process::id()));
    let _down = Down(dir.clone(), &["ctl", "node01", "node03"]);
    let run = every_command_works(&dir, "docker");
    let label = format!("label=dvmlab.harness.run={run}");
    assert!(
        docker(&["ps", "-a", "-q", "--filter", &label]).is_empty(),
        "down left containers of {run}"
    );
    assert!(
        docker(&["network", "ls", "-q", "--filter", &label]).is_empty(),
        "down left networks of {run}"
    );
}

#[test]
fn the_elastic_lab_on_docker_grows_onto_spares_parks_jobs_during_a_shrink_and_allocates() {
    if !docker_here(
        "the_elastic_lab_on_docker_grows_onto_spares_parks_jobs_during_a_shrink_and_allocates",
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "dvmlab-lab-test-docker-elastic-{}",
        std::process::id()
    ));
    let _down = Down(dir.clone(), &["ctl", "node02", "spare01", "spare03"]);
    common::elastic_commands_work(&dir, "docker");
}
