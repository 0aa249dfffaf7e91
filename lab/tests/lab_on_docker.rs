//! The lab end to end on the Docker engine: on the harness's docker backend every lab
//! command, and `down` leaving no container or network of the lab's run behind; and on the
//! engine's swarm mode (`lab up --swarm`, one-node swarm) the same commands, grow and
//! shrink through the tasks' launch service, a killed task replaced by the swarm, and the
//! swarm left as found. Needs root and a Docker engine (and,
//! for the swarm, the docker CLI and a static busybox); says so loudly otherwise.

use std::process::Command;
use std::time::Duration;

use dvmlab_harness::{netns_available, skip, wait_until};

mod common;
use common::{every_command_works, lab_in, ok_in, wait_state, workspace, Down, LAB};

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

/// The bridge `docker swarm init` makes for a node's containers; leaving keeps it.
const GWBRIDGE: &str = "docker_gwbridge";

const SWARM_TEST: &str =
    "the_lab_on_a_one_node_swarm_forms_runs_jobs_takes_faults_and_leaves_the_swarm_as_found";

fn docker_out(args: &[&str]) -> std::process::Output {
    Command::new("docker").args(args).output().unwrap()
}

fn stdout(args: &[&str]) -> String {
    String::from_utf8_lossy(&docker_out(args).stdout)
        .trim()
        .to_string()
}

/// Leaves the swarm if the test made it (with the `docker_gwbridge` network its init made,
/// which leaving keeps), and removes the test's image tag.
struct SwarmAsFound {
    initialized: bool,
    /// The engine had no `docker_gwbridge` before the test's `swarm init`.
    made_gwbridge: bool,
    image: String,
}

impl Drop for SwarmAsFound {
    fn drop(&mut self) {
        if self.initialized {
            let o = docker_out(&["swarm", "leave", "--force"]);
            eprintln!(
                "left the swarm the test made: {}",
                String::from_utf8_lossy(&o.stdout).trim()
            );
            if self.made_gwbridge {
                let o = docker_out(&["network", "rm", GWBRIDGE]);
                if !o.status.success() {
                    eprintln!(
                        "LEAKED Docker network {GWBRIDGE}, made by the test's swarm init: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    );
                }
            }
        }
        let _ = docker_out(&["rmi", &self.image]);
    }
}

/// The id of the running container of `service`'s task on this machine.
fn task_container(service: &str) -> String {
    stdout(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=com.docker.swarm.service.name={service}"),
        "--filter",
        "status=running",
    ])
}

#[test]
fn the_lab_on_a_one_node_swarm_forms_runs_jobs_takes_faults_and_leaves_the_swarm_as_found() {
    if !docker_here(SWARM_TEST) {
        return;
    }
    if !Command::new("docker")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return skip(
            SWARM_TEST,
            "no docker CLI here (docker stack deploy is the CLI's)",
        );
    }
    if !std::path::Path::new("/bin/busybox").exists() {
        return skip(
            SWARM_TEST,
            "the image needs /bin/busybox (apt-get install busybox-static)",
        );
    }
    let pid = std::process::id();
    let image = format!("dvmlab-lab:swarm-test-{pid}");
    let state = stdout(&["info", "--format", "{{.Swarm.LocalNodeState}}"]);
    let made_gwbridge = !docker_out(&["network", "inspect", GWBRIDGE])
        .status
        .success();
    let initialized = match state.as_str() {
        "inactive" => {
            let o = docker_out(&["swarm", "init", "--advertise-addr", "127.0.0.1"]);
            assert!(
                o.status.success(),
                "docker swarm init: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            true
        }
        "active" => false,
        other => panic!("the engine's swarm is {other:?}: neither in one nor out of one"),
    };
    let _swarm = SwarmAsFound {
        initialized,
        made_gwbridge: initialized && made_gwbridge,
        image: image.clone(),
    };
    let make = Command::new("make")
        .args(["-s", "lab-bins"])
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(
        make.status.success(),
        "make lab-bins: {}",
        String::from_utf8_lossy(&make.stderr)
    );
    // For a swarm of several machines the image goes to a registry; none is reachable here,
    // so the image is built and its push to a closed loopback port must fail saying where,
    // leaving the image but no registry tag behind.
    let pushed = Command::new(LAB)
        .args([
            "image",
            "--tag",
            &image,
            "--push",
            "127.0.0.1:9",
            "--bin-dir",
            "target/static/x86_64-unknown-linux-gnu/release",
        ])
        .current_dir(workspace())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&pushed.stderr);
    assert_eq!(pushed.status.code(), Some(1), "{err}");
    assert!(err.contains("pushing to registry 127.0.0.1:9"), "{err}");
    assert!(
        !docker_out(&["image", "inspect", &format!("127.0.0.1:9/{image}")])
            .status
            .success(),
        "the registry's tag is removed after a failed push"
    );
    assert!(
        docker_out(&["image", "inspect", &image]).status.success(),
        "the image was built: {err}"
    );

    let dir = std::env::temp_dir().join(format!("dvmlab-lab-test-swarm-{pid}"));
    let stack = format!("dvmlab-swarm-test-{pid}");
    let _down = Down(
        dir.clone(),
        &["ctl", "node01", "node02", "node07", "node15", "spare01"],
    );
    let up = ok_in(
        &dir,
        &[
            "up",
            "--swarm",
            "--image",
            &image,
            "--stack",
            &stack,
            "--nodes",
            "16",
            "--radix",
            "4",
            "--hold",
            "node16",
            "--spares",
            "2",
            "--timeout",
            "180",
        ],
    );
    assert!(
        up.contains("16 of 17 daemons joined")
            && up.contains("spares for `lab grow` and `lab alloc`: spare01, spare02"),
        "{up}"
    );
    // The local image runs by its ID, so no task's agent asks a registry for it.
    let id = stdout(&["image", "inspect", "--format", "{{.Id}}", &image]);
    let task_image = stdout(&[
        "service",
        "inspect",
        "--format",
        "{{.Spec.TaskTemplate.ContainerSpec.Image}}",
        &format!("{stack}_node01"),
    ]);
    assert!(id.starts_with("sha256:"), "the image's ID: {id:?}");
    assert_eq!(
        task_image, id,
        "node01's task runs the local image by its ID"
    );
    let again = lab_in(&dir, &["up", "--swarm", "--image", &image]);
    assert_eq!(again.status.code(), Some(1), "a second up is refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already up"));

    ok_in(&dir, &["late-boot", "node16"]);
    wait_state(&dir, "node16", "joined");

    let names = ok_in(&dir, &["run", "--", "hostname"]);
    let mut names: Vec<&str> = names.lines().collect();
    names.sort_unstable();
    let want: Vec<String> = (1..=16).map(|i| format!("node{i:02}")).collect();
    assert_eq!(names, want, "one process on every node");
    assert_eq!(
        lab_in(&dir, &["run", "-n", "2", "--", "sh", "-c", "exit 3"])
            .status
            .code(),
        Some(3),
        "lab run exits with the job's status"
    );

    // Elastic: the controller starts daemons in other tasks through their launch service
    // (plaunch), as the keeper's lab does through its agent.
    let grown = ok_in(&dir, &["grow", "1"]);
    assert!(grown.contains("done: allocation"), "{grown}");
    wait_state(&dir, "spare01", "joined");
    let names = ok_in(&dir, &["run", "--", "hostname"]);
    assert!(names.lines().any(|l| l == "spare01"), "{names}");
    let shrunk = ok_in(&dir, &["shrink", "spare01,node15"]);
    assert!(shrunk.contains("done: allocation"), "{shrunk}");
    let s = ok_in(&dir, &["status"]);
    assert!(
        s.contains("left the DVM (`lab grow --host` adds them again): node15")
            && s.contains("spares not in the DVM: spare01, spare02"),
        "{s}"
    );
    // node15's daemon left cleanly, so its task stayed and serves launches: it comes back.
    ok_in(&dir, &["grow", "--host", "node15"]);
    wait_state(&dir, "node15", "joined");
    let alloc = ok_in(&dir, &["alloc", "new", "--host", "spare02", "--json"]);
    assert!(alloc.contains("PMIX_DVM_IS_READY"), "{alloc}");
    wait_state(&dir, "spare02", "joined");

    // A killed task: the DVM loses the node, the swarm starts a new task in its place
    // (another container, the same name, another address), its daemon joins again, and
    // its children, which knew it by its old address, find it under its name: at radix 4
    // node01 is the parent of node05 … node08, and they are its children again.
    let service = format!("{stack}_node01");
    let before = task_container(&service);
    assert!(!before.is_empty(), "node01 has a running task");
    ok_in(&dir, &["kill", "node01"]);
    wait_state(&dir, "node01", "lost");
    wait_until(Duration::from_secs(60), Duration::from_millis(250), || {
        let s: serde_json::Value =
            serde_json::from_str(&ok_in(&dir, &["status", "--json"])).map_err(|e| e.to_string())?;
        let under_node01 = s["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["tree_parent"] == 1 && m["state"] != "departed")
            .all(|m| m["parent"] == 1 && m["state"] == "joined");
        (s["formed"] == true && under_node01)
            .then_some(())
            .ok_or(format!("node01's subtree not back under it: {s}"))
    })
    .unwrap();
    let after = task_container(&service);
    assert!(
        !after.is_empty() && after != before,
        "the swarm replaced the task: {before} -> {after}"
    );

    ok_in(&dir, &["freeze", "node02"]);
    assert!(ok_in(&dir, &["status"]).contains("node02 (frozen)"));
    wait_state(&dir, "node02", "lost");
    ok_in(&dir, &["thaw", "node02"]);
    wait_state(&dir, "node02", "joined");

    // node07 cut from its tree parent (both ways, in the tasks' own network namespaces):
    // the parent finds it silent and the controller hears it is lost; healed and restarted
    // (a new task), it joins again.
    let status: serde_json::Value =
        serde_json::from_str(&ok_in(&dir, &["status", "--json"])).unwrap();
    let members = status["members"].as_array().unwrap();
    let node07 = members.iter().find(|m| m["host"] == "node07").unwrap();
    let parent = members
        .iter()
        .find(|m| m["rank"] == node07["tree_parent"])
        .and_then(|m| m["host"].as_str())
        .unwrap()
        .to_string();
    ok_in(&dir, &["partition", &parent, "node07"]);
    wait_state(&dir, "node07", "lost");
    // The swarm's service logs reach `lab logs` a moment after the daemon wrote them.
    wait_until(Duration::from_secs(20), Duration::from_millis(250), || {
        ok_in(&dir, &["logs", &parent])
            .contains("silent for 3 heartbeats")
            .then_some(())
            .ok_or(format!("{parent}'s log does not show node07 silent yet"))
    })
    .unwrap();
    ok_in(&dir, &["heal"]);
    ok_in(&dir, &["restart", "node07"]);
    wait_state(&dir, "node07", "joined");
    // `lab logs` is the service's: every task it had, the restarted one too.
    wait_until(Duration::from_secs(20), Duration::from_millis(250), || {
        let log = ok_in(&dir, &["logs", "node07"]);
        let started = log.matches("(Daemon) on node07 listening").count();
        (started >= 2)
            .then_some(())
            .ok_or(format!("node07's log shows {started} daemon starts, not 2"))
    })
    .unwrap();
    wait_until(Duration::from_secs(60), Duration::from_millis(250), || {
        let s: serde_json::Value =
            serde_json::from_str(&ok_in(&dir, &["status", "--json"])).map_err(|e| e.to_string())?;
        (s["formed"] == true)
            .then_some(())
            .ok_or(format!("not formed again: {s}"))
    })
    .unwrap();

    let gone = ok_in(&dir, &["down"]);
    assert!(gone.contains(&format!("swarm stack {stack}")), "{gone}");
    let label = format!("label=com.docker.stack.namespace={stack}");
    for what in [
        &["service", "ls", "-q", "--filter"][..],
        &["ps", "-a", "-q", "--filter"][..],
        &["network", "ls", "-q", "--filter"][..],
        &["config", "ls", "-q", "--filter"][..],
        &["secret", "ls", "-q", "--filter"][..],
    ] {
        let mut args = what.to_vec();
        args.push(&label);
        assert!(stdout(&args).is_empty(), "down left: docker {args:?}");
    }
    let after = lab_in(&dir, &["status"]);
    assert_eq!(after.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&after.stderr).contains("no lab is up"));
}
