//! `lab export`: the compose file is accepted by docker-compose's own validation (its
//! Compose Specification schema), the swarm stack file by the docker CLI's, and the
//! Kubernetes manifests are written where asked (their typed and cross-checks are unit
//! tests of export.rs).

use std::process::Command;

use dvmlab_harness::skip;

const LAB: &str = env!("CARGO_BIN_EXE_lab");

fn export(args: &[&str], out: &std::path::Path) {
    let o = Command::new(LAB)
        .arg("export")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_compose_export_passes_docker_composes_schema_validation() {
    let dir = std::env::temp_dir().join(format!("dvmlab-export-{}", std::process::id()));
    export(&["--compose", "--nodes", "8", "--ip", "6"], &dir);
    let conf = std::fs::read_to_string(dir.join("prte.conf")).unwrap();
    assert!(conf.contains("DVMNodes = node[2:1-8]"), "{conf}");
    let has_compose = Command::new("docker-compose")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_compose {
        let _ = std::fs::remove_dir_all(&dir);
        return skip(
            "exports",
            "no docker-compose to validate the compose file with",
        );
    }
    let o = Command::new("docker-compose")
        .arg("-f")
        .arg(dir.join("compose.yaml"))
        .args(["config"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success(),
        "docker-compose rejects the file: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let normalized = String::from_utf8_lossy(&o.stdout);
    for want in [
        "node08",
        "ipv6_address: fd00:210::12",
        "enable_ipv6: true",
        "init: true",
    ] {
        assert!(normalized.contains(want), "{want} missing:\n{normalized}");
    }
}

#[test]
fn the_swarm_export_passes_the_docker_clis_stack_validation() {
    let dir = std::env::temp_dir().join(format!("dvmlab-swarm-export-{}", std::process::id()));
    export(&["--swarm", "--nodes", "8", "--radix", "2"], &dir);
    let six = Command::new(LAB)
        .args(["export", "--swarm", "--ip", "6", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(six.status.code(), Some(2), "the swarm lab is IPv4 only");
    let has_cli = Command::new("docker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cli {
        let _ = std::fs::remove_dir_all(&dir);
        return skip("exports", "no docker CLI to validate the stack file with");
    }
    // `docker stack config` checks the file against the CLI's stack schema (and loads the
    // config and secret files it names) without a swarm.
    let o = Command::new("docker")
        .args(["stack", "config", "-c", "stack.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success(),
        "docker stack config rejects the file: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let normalized = String::from_utf8_lossy(&o.stdout);
    for want in [
        "node08",
        "endpoint_mode: dnsrr",
        "target: /etc/prte.conf",
        "driver: overlay",
    ] {
        assert!(normalized.contains(want), "{want} missing:\n{normalized}");
    }
}

#[test]
fn the_k8s_export_writes_one_manifest_file() {
    let dir = std::env::temp_dir().join(format!("dvmlab-k8s-{}", std::process::id()));
    export(&["--k8s", "--nodes", "32", "--namespace", "lab"], &dir);
    let text = std::fs::read_to_string(dir.join("dvmlab-lab.k8s.yaml")).unwrap();
    // The DVM key beside the manifest, private, and kept by a re-export.
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join("dvm.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    let first = std::fs::read(&key).unwrap();
    export(&["--k8s", "--nodes", "32", "--namespace", "lab"], &dir);
    let again = std::fs::read(&key).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(mode, 0o600);
    assert_eq!(first, again, "a re-export keeps the key");
    assert_eq!(text.matches("kind: StatefulSet").count(), 2, "{text}");
    assert!(text.contains("dvm.lab.svc.cluster.local"), "{text}");
    assert!(text.contains("secretName: dvmlab-lab-key"), "{text}");
}

fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output().unwrap()
}

/// Removes the compose project and the image however the test ends.
struct ComposeDown(std::path::PathBuf, String);

impl Drop for ComposeDown {
    fn drop(&mut self) {
        let f = self.0.join("compose.yaml");
        if std::thread::panicking() {
            let o = run(Command::new("docker-compose").arg("-f").arg(&f).args([
                "-p",
                &self.1,
                "logs",
                "--no-color",
            ]));
            eprintln!(
                "---- compose logs ----\n{}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
        let _ = run(Command::new("docker-compose")
            .arg("-f")
            .arg(&f)
            .args(["-p", &self.1, "down", "-v", "-t", "2"]));
        let _ = run(Command::new(LAB).args(["image", "--remove"]));
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_compose_export_runs_a_dvm_of_the_from_scratch_image_and_jobs_on_it() {
    let engine = dvmlab_harness::docker::Engine::available();
    let compose = Command::new("docker-compose")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !engine || !compose {
        return skip(
            "exports",
            "running the compose export needs a Docker engine and docker-compose",
        );
    }
    if !std::path::Path::new("/bin/busybox").exists() {
        return skip(
            "exports",
            "the image needs /bin/busybox (apt-get install busybox-static)",
        );
    }
    let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let make = run(Command::new("make")
        .args(["-s", "lab-bins"])
        .current_dir(&ws));
    assert!(
        make.status.success(),
        "make lab-bins: {}",
        String::from_utf8_lossy(&make.stderr)
    );
    let dir = std::env::temp_dir().join(format!("dvmlab-compose-{}", std::process::id()));
    let project = format!("dvmlab-export-{}", std::process::id());
    let _down = ComposeDown(dir.clone(), project.clone());
    let image = run(Command::new(LAB)
        .args([
            "image",
            "--bin-dir",
            "target/static/x86_64-unknown-linux-gnu/release",
        ])
        .current_dir(&ws));
    assert!(
        image.status.success(),
        "lab image: {}",
        String::from_utf8_lossy(&image.stderr)
    );
    export(&["--compose", "--nodes", "4", "--radix", "2"], &dir);
    let f = dir.join("compose.yaml");
    let compose = |args: &[&str]| {
        run(Command::new("docker-compose")
            .arg("-f")
            .arg(&f)
            .args(["-p", &project])
            .args(args))
    };
    let up = compose(&["up", "-d"]);
    assert!(
        up.status.success(),
        "compose up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    dvmlab_harness::wait_until(
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(200),
        || {
            let o = compose(&["exec", "-T", "ctl", "pctl", "status", "--json"]);
            let s: serde_json::Value = serde_json::from_slice(&o.stdout)
                .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))?;
            (s["formed"] == true)
                .then_some(())
                .ok_or(format!("not formed: {s}"))
        },
    )
    .unwrap();
    let job = compose(&["exec", "-T", "ctl", "prun", "--", "hostname"]);
    let out = String::from_utf8_lossy(&job.stdout);
    let mut names: Vec<&str> = out.lines().collect();
    names.sort_unstable();
    assert_eq!(names, ["node01", "node02", "node03", "node04"], "{out}");
}
