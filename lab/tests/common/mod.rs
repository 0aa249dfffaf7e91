//! What the lab's end-to-end tests share: running `lab` from the workspace, with a lab
//! directory of the test's own, and the one scenario every backend must pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use dvmlab_harness::wait_until;

pub const LAB: &str = env!("CARGO_BIN_EXE_lab");

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `lab ARGS` with the lab kept in `dir` (`DVMLAB_LAB_DIR`), so that labs of tests running
/// side by side do not meet.
pub fn lab_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(LAB)
        .args(args)
        .env("DVMLAB_LAB_DIR", dir)
        .current_dir(workspace())
        .output()
        .unwrap()
}

/// `lab ARGS` with the lab kept in `dir`, which must succeed; its stdout.
pub fn ok_in(dir: &Path, args: &[&str]) -> String {
    let o = lab_in(dir, args);
    assert!(
        o.status.success(),
        "lab {args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Takes the lab kept in its directory down however the test ends, printing these hosts'
/// logs on failure.
pub struct Down(pub PathBuf, pub &'static [&'static str]);

impl Drop for Down {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for host in self.1 {
                let o = lab_in(&self.0, &["logs", host]);
                eprintln!(
                    "---- {host} ----\n{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        let _ = lab_in(&self.0, &["down"]);
    }
}

/// Builds the runtime's binaries beside `lab`, where the keeper runs them from.
pub fn build_runtime() -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "-q", "-p", "dvmlab-runtime", "--bins"])
        .current_dir(workspace())
        .status()
        .unwrap();
    assert!(built.success(), "building the runtime");
    Path::new(LAB).parent().unwrap().display().to_string()
}

/// The state of `host` in `lab status --json`.
pub fn member_state(dir: &Path, host: &str) -> Result<String, String> {
    let o = lab_in(dir, &["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|e| format!("status --json: {e}: {}", String::from_utf8_lossy(&o.stderr)))?;
    s["members"]
        .as_array()
        .into_iter()
        .flatten()
        // A host grown onto again after it left has a new rank, after the old.
        .rfind(|m| m["host"] == host)
        .and_then(|m| m["state"].as_str().map(str::to_string))
        .ok_or_else(|| format!("{host} not in {s}"))
}

pub fn wait_state(dir: &Path, host: &str, want: &str) {
    wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let s = member_state(dir, host)?;
        (s == want)
            .then_some(())
            .ok_or(format!("{host} is {s}, not yet {want}"))
    })
    .unwrap();
}

/// Every lab command on `backend`: up with a node held back, late boot, jobs (output and
/// exit status), freeze and thaw, a partition shown in effect and healed, kill and restart,
/// logs, and `down`. Returns the run name `up` printed, for the caller's leftover check.
pub fn every_command_works(dir: &Path, backend: &str) -> String {
    let bin_dir = build_runtime();
    let up = ok_in(
        dir,
        &[
            "up",
            "--backend",
            backend,
            "--nodes",
            "4",
            "--radix",
            "2",
            "--hold",
            "node04",
            "--bin-dir",
            &bin_dir,
        ],
    );
    assert!(
        up.contains(&format!("lab up on {backend} (run ")) && up.contains("4 of 5 daemons joined"),
        "{up}"
    );
    let run = up
        .split("(run ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_default()
        .to_string();
    let again = lab_in(dir, &["up", "--backend", backend]);
    assert_eq!(again.status.code(), Some(1), "a second up is refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already up"));

    ok_in(dir, &["late-boot", "node04"]);
    wait_state(dir, "node04", "joined");

    let names = ok_in(dir, &["run", "--", "hostname"]);
    let mut names: Vec<&str> = names.lines().collect();
    names.sort_unstable();
    assert_eq!(names, ["node01", "node02", "node03", "node04"]);
    assert_eq!(
        lab_in(dir, &["run", "-n", "2", "--", "sh", "-c", "exit 3"])
            .status
            .code(),
        Some(3),
        "lab run exits with the job's status"
    );

    ok_in(dir, &["freeze", "node02"]);
    assert!(ok_in(dir, &["status"]).contains("node02 (frozen)"));
    ok_in(dir, &["thaw", "node02"]);

    // node01 is node03's tree parent at radix 2: cut them apart and node03 is lost to the
    // controller; heal, restart it, and it joins again.
    ok_in(dir, &["partition", "node01", "node03"]);
    wait_state(dir, "node03", "lost");
    ok_in(dir, &["heal"]);
    ok_in(dir, &["restart", "node03"]);
    wait_state(dir, "node03", "joined");

    ok_in(dir, &["kill", "node03"]);
    wait_state(dir, "node03", "lost");
    assert!(ok_in(dir, &["status"]).contains("node03 (exited)"));
    ok_in(dir, &["restart", "node03"]);
    wait_state(dir, "node03", "joined");
    assert!(ok_in(dir, &["logs", "node03"]).contains("joined the DVM"));

    let gone = ok_in(dir, &["down"]);
    assert!(
        gone.contains(&format!("removed the lab: 5 hosts on {backend}")),
        "{gone}"
    );
    let after = lab_in(dir, &["status"]);
    assert_eq!(after.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&after.stderr).contains("no lab is up"));
    assert!(ok_in(dir, &["down"]).contains("no lab was up"));
    run
}

/// `lab ARGS` with the lab kept in `dir`, started in the background.
fn spawn_in(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(LAB)
        .args(args)
        .env("DVMLAB_LAB_DIR", dir)
        .current_dir(workspace())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn finished(child: std::process::Child, what: &str) -> String {
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn wait_status_shows(dir: &Path, text: &str) -> String {
    wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let s = ok_in(dir, &["status"]);
        s.contains(text)
            .then(|| s.clone())
            .ok_or(format!("no {text:?} yet in\n{s}"))
    })
    .unwrap()
}

/// The elastic lab on `backend`: spares grown onto (`grow`), a shrink held up by a frozen
/// target while a job waits for it (`status` shows the campaign and the parked job), an
/// allocation request's two phases (`alloc`), a grown daemon broken like any other, and
/// a spare refused to `restart`.
pub fn elastic_commands_work(dir: &Path, backend: &str) {
    let bin_dir = build_runtime();
    let up = ok_in(
        dir,
        &[
            "up",
            "--backend",
            backend,
            "--nodes",
            "2",
            "--radix",
            "2",
            "--spares",
            "3",
            "--bin-dir",
            &bin_dir,
        ],
    );
    assert!(
        up.contains("3 of 3 daemons joined")
            && up.contains("spares for `lab grow` and `lab alloc`: spare01, spare02, spare03"),
        "{up}"
    );
    assert!(ok_in(dir, &["status"]).contains("spares not in the DVM: spare01, spare02, spare03"));

    let grown = ok_in(dir, &["grow", "2"]);
    assert!(grown.contains("done: allocation"), "{grown}");
    wait_state(dir, "spare02", "joined");
    let names = ok_in(dir, &["run", "--", "hostname"]);
    let mut names: Vec<&str> = names.lines().collect();
    names.sort_unstable();
    assert_eq!(names, ["node01", "node02", "spare01", "spare02"]);
    let full = lab_in(dir, &["grow", "2"]);
    assert_eq!(full.status.code(), Some(1), "only spare03 is left");
    assert!(String::from_utf8_lossy(&full.stderr).contains("only 1 spare(s) free (spare03)"));

    // A frozen target cannot leave: the shrink stays in progress, and a job submitted
    // meanwhile waits for it, then runs on the survivors.
    ok_in(dir, &["freeze", "node02"]);
    let shrink = spawn_in(dir, &["shrink", "node02"]);
    wait_status_shows(dir, "shrink");
    let mut job = spawn_in(dir, &["run", "-n", "3", "--", "hostname"]);
    let during = wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let s = ok_in(dir, &["status"]);
        if s.contains("parked (WAITING FOR DAEMON CAMPAIGN): job") {
            return Ok(s);
        }
        match job.try_wait() {
            Ok(Some(st)) => Ok(format!(
                "the job ended ({st}) before it was seen parked
{s}"
            )),
            _ => Err(format!(
                "no parked job yet in
{s}"
            )),
        }
    })
    .unwrap();
    assert!(
        during.contains("parked"),
        "{during}
{}",
        finished(job, "the job")
    );
    assert!(during.contains("departing"), "{during}");
    ok_in(dir, &["thaw", "node02"]);
    assert!(finished(shrink, "lab shrink node02").contains("done: allocation"));
    let ran = finished(job, "the parked job");
    assert!(!ran.contains("node02"), "ran on the departed node: {ran}");
    let after = ok_in(dir, &["status"]);
    assert!(
        after.contains("left the DVM (`lab grow --host` adds them again): node02")
            && !after.contains("parked"),
        "{after}"
    );

    let alloc = ok_in(dir, &["alloc", "new", "--host", "spare03", "--json"]);
    let lines: Vec<serde_json::Value> = alloc
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{alloc}");
    assert_eq!(lines[0]["phase"], "accepted", "{alloc}");
    assert_eq!(lines[1]["name"], "PMIX_DVM_IS_READY", "{alloc}");
    assert_eq!(lines[0]["alloc_id"], lines[1]["alloc_id"], "{alloc}");
    wait_state(dir, "spare03", "joined");
    let unknown = lab_in(dir, &["alloc", "new", "--host", "nosuch", "--json"]);
    assert_ne!(unknown.status.code(), Some(0), "an unknown host is refused");
    assert!(
        !String::from_utf8_lossy(&unknown.stdout).contains("\"event\""),
        "no event for a phase-one rejection"
    );
    ok_in(dir, &["alloc", "release", "--host", "spare03"]);
    wait_status_shows(dir, "spares not in the DVM: spare03");

    // A grown daemon takes faults like any other; its host stays a spare.
    ok_in(dir, &["kill", "spare01"]);
    wait_state(dir, "spare01", "lost");
    assert!(ok_in(dir, &["status"]).contains("spare01 (gone)"));
    let restart = lab_in(dir, &["restart", "spare01"]);
    assert_eq!(restart.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&restart.stderr).contains("spare01 is a spare"));
    assert!(ok_in(dir, &["logs", "spare02"]).contains("joined the DVM"));

    let gone = ok_in(dir, &["down"]);
    assert!(gone.contains("removed the lab: 6 hosts"), "{gone}");
}
