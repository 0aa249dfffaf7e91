//! `lab export`: the compose file is accepted by docker-compose's own validation (its
//! Compose Specification schema), and the Kubernetes manifests are written where asked
//! (their typed validation is a unit test of export.rs).

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
fn the_k8s_export_writes_one_manifest_file() {
    let dir = std::env::temp_dir().join(format!("dvmlab-k8s-{}", std::process::id()));
    export(&["--k8s", "--nodes", "32", "--namespace", "lab"], &dir);
    let text = std::fs::read_to_string(dir.join("dvmlab-lab.k8s.yaml")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(text.matches("kind: StatefulSet").count(), 2, "{text}");
    assert!(text.contains("dvm.lab.svc.cluster.local"), "{text}");
}
