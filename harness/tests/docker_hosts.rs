//! The docker backend: hosts are containers with their own names, addresses, `/etc` and
//! DNS; partitions and cuts take effect between them; and nothing of a cluster is left in
//! the engine or the kernel once it is gone.

use std::time::Duration;

use dvmlab_harness::docker::{Engine, LABEL};
use dvmlab_harness::{wait_until, BackendKind, Cluster, ClusterSpec, Direction, IpMode};

/// Whether the docker backend can run here (root to enter containers, and an engine).
fn docker_or_skip(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        dvmlab_harness::skip(test, "needs root to enter containers");
        return false;
    }
    if !Engine::available() {
        dvmlab_harness::skip(test, "needs a Docker engine");
        return false;
    }
    true
}

fn sleepers(label: &str, n: usize, ip: IpMode) -> ClusterSpec {
    let hosts: Vec<String> = (1..=n).map(|i| format!("n{i:02}")).collect();
    let mut spec = ClusterSpec::new(label, &hosts, vec!["sleep".into(), "1000".into()]);
    spec.backend = BackendKind::Docker;
    spec.ip = ip;
    spec
}

fn sh(c: &Cluster, host: &str, script: &str) -> (bool, String, String) {
    let (st, out, err) = c
        .exec_within(
            host,
            &["bash".into(), "-c".into(), script.into()],
            Duration::from_secs(5),
        )
        .unwrap();
    (st.is_some_and(|s| s.success()), out, err)
}

/// `connect` from `from` to `ip`:9 where nothing listens: "refused" proves the packet got
/// there and back.
fn reaches(c: &Cluster, from: &str, ip: &str) -> Result<(), String> {
    let (_, _, err) = sh(c, from, &format!("exec 3<>/dev/tcp/{ip}/9"));
    if err.contains("refused") {
        Ok(())
    } else {
        Err(format!("{from} -> {ip}: {err}"))
    }
}

/// The engine's containers and networks labelled with `run`, by name.
fn labelled(run: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "-a", "--filter", &format!("label={LABEL}={run}")])
        .args(["--format", "{{.Names}}"])
        .output()
        .unwrap();
    let nets = std::process::Command::new("docker")
        .args(["network", "ls", "--filter", &format!("label={LABEL}={run}")])
        .args(["--format", "{{.Name}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&nets.stdout).lines())
        .map(str::to_string)
        .collect()
}

#[test]
fn hosts_are_containers_with_their_own_names_addresses_etc_and_proc() {
    if !docker_or_skip("docker hosts") {
        return;
    }
    let mut spec = sleepers("dk-hosts", 3, IpMode::Dual);
    spec.conf = "DVMNodes=n01,n02,n03\n".into();
    spec.domain = Some("lab.example".into());
    let c = Cluster::new(spec).unwrap();
    let n02 = c.host("n02").unwrap().clone();
    let (v4, v6) = (n02.v4.unwrap().to_string(), n02.v6.unwrap().to_string());
    assert!(v4.starts_with("10.2"), "{v4}");

    let (ok, out, err) = sh(&c, "n01", "hostname; cat /etc/prte.conf");
    assert!(ok, "{err}");
    assert_eq!(out, "n01\nDVMNodes=n01,n02,n03\n");

    // Names resolve through the hosts entries Docker wrote, fully qualified first.
    let (ok, out, err) = sh(&c, "n01", "getent ahosts n02.lab.example; getent hosts n02");
    assert!(ok, "{err}");
    assert!(out.contains(&v4) && out.contains(&v6), "{out}");
    reaches(&c, "n01", &v4).unwrap();
    reaches(&c, "n03", &v6).unwrap();

    // /proc is that of this pid namespace, and its network view is the container's.
    let (ok, out, err) = sh(&c, "n02", "readlink /proc/self; cat /proc/net/if_inet6");
    assert!(ok, "{err}");
    let hex: String = match n02.v6.unwrap() {
        std::net::IpAddr::V6(a) => a.segments().iter().map(|s| format!("{s:04x}")).collect(),
        other => panic!("{other} is not IPv6"),
    };
    let mut lines = out.lines();
    assert!(
        lines.next().is_some_and(|l| l.parse::<u32>().is_ok()),
        "{out}"
    );
    assert!(out.contains(&hex), "{hex} not in {out}");

    // A changed or removed file is what the next process sees.
    c.set_host_conf("n03", "DVMNodes=n03\n").unwrap();
    let (_, out, _) = sh(&c, "n03", "cat /etc/prte.conf");
    assert_eq!(out, "DVMNodes=n03\n");
    c.remove_host_conf("n03").unwrap();
    let (ok, _, err) = sh(&c, "n03", "cat /etc/prte.conf");
    assert!(!ok && err.contains("No such file"), "{err}");
    std::fs::write(c.etc_dir("n03").join("extra.txt"), "x\n").unwrap();
    let (_, out, _) = sh(&c, "n03", "cat /etc/extra.txt");
    assert_eq!(out, "x\n");

    // A name nobody serves fails without leaving the machine: the container's resolver is
    // Docker's embedded one, whose only upstream is loopback, so the query is answered (as a
    // failure) instead of waiting on a server outside.
    let (ok, _, _) = sh(&c, "n01", "getent hosts no-such-host.invalid");
    assert!(!ok);
    let (_, resolv, _) = sh(&c, "n01", "cat /etc/resolv.conf");
    assert!(resolv.contains("nameserver 127.0.0.11"), "{resolv}");
}

#[test]
fn partitions_and_cuts_take_effect_between_containers_and_heal() {
    if !docker_or_skip("docker faults") {
        return;
    }
    let mut c = Cluster::new(sleepers("dk-faults", 3, IpMode::V4)).unwrap();
    let ip = |h: &str| c.host(h).unwrap().v4.unwrap().to_string();
    let (ip1, ip2, ip3) = (ip("n01"), ip("n02"), ip("n03"));
    // partition() itself proves with probes that it took effect.
    let p = c.partition(&["n01"], &["n02"], Direction::OneWay).unwrap();
    assert!(reaches(&c, "n01", &ip2).is_err());
    reaches(&c, "n01", &ip3).unwrap();
    c.heal(p).unwrap();
    reaches(&c, "n01", &ip2).unwrap();

    c.set_connected("n03", false).unwrap();
    assert!(reaches(&c, "n01", &ip3).is_err());
    c.set_connected("n03", true).unwrap();
    wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
        reaches(&c, "n01", &ip3)
    })
    .unwrap();
    reaches(&c, "n03", &ip1).unwrap();
}

#[test]
fn a_dropped_cluster_leaves_no_container_network_or_rule() {
    if !docker_or_skip("docker cleanup") {
        return;
    }
    let mut c = Cluster::new(sleepers("dk-clean", 2, IpMode::V4)).unwrap();
    c.start_all().unwrap();
    c.partition(&["n01"], &["n02"], Direction::Both).unwrap();
    let run = c.run_name().to_string();
    let before = labelled(&run);
    assert_eq!(before.len(), 3, "two containers and a network: {before:?}");
    let table = run.replace('-', "_");
    let tables = || {
        let out = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(tables().contains(&table));
    let pid = c.pid("n01").unwrap();
    drop(c);
    assert_eq!(labelled(&run), Vec::<String>::new());
    assert!(!tables().contains(&table), "{}", tables());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}
