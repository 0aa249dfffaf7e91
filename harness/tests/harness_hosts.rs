//! The harness itself: hosts reach each other across chained bridges, faults take effect, and
//! nothing is left behind — not even when the owning process is killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use dvmlab_harness::{
    gc, netns_available, rundir, wait_until, BackendKind, Cluster, ClusterSpec, IpMode,
};

fn netns_or_skip(test: &str) -> bool {
    if netns_available() {
        return true;
    }
    dvmlab_harness::skip(test, "needs root for network namespaces");
    false
}

fn sleeper(label: &str, backend: BackendKind, n: usize) -> ClusterSpec {
    let hosts: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
    let mut spec = ClusterSpec::new(label, &hosts, vec!["sleep".into(), "1000".into()]);
    spec.backend = backend;
    spec
}

/// `connect` from `from` to `ip`:`port` where nothing listens: "refused" proves the packet got
/// there and back.
fn reaches(c: &Cluster, from: &str, ip: &str) -> Result<(), String> {
    let script = format!("exec 3<>/dev/tcp/{ip}/9; echo connected");
    let (_, _, err) = c
        .exec_within(
            from,
            &["bash".into(), "-c".into(), script],
            Duration::from_secs(2),
        )
        .map_err(|e| e.to_string())?;
    if err.contains("refused") {
        Ok(())
    } else {
        Err(format!("{from} -> {ip}: {err}"))
    }
}

#[test]
fn hosts_beyond_one_bridge_reach_each_other_over_chained_bridges() {
    if !netns_or_skip("chained bridges") {
        return;
    }
    let mut spec = sleeper("bridges", BackendKind::Netns, 1003);
    spec.ip = IpMode::Dual;
    let c = Cluster::new(spec).unwrap();
    let first = c.host("h0").unwrap().clone();
    let last = c.host("h1002").unwrap().clone();
    // The first exchange waits for neighbour discovery across three bridges of a thousand
    // ports each, slow on a loaded machine; a path that does not exist never answers.
    let eventually = |from: &str, ip: String| {
        wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
            reaches(&c, from, &ip)
        })
    };
    eventually("h1002", first.v4.unwrap().to_string()).unwrap();
    eventually("h0", last.v4.unwrap().to_string()).unwrap();
    eventually("h1002", first.v6.unwrap().to_string()).unwrap();
    let out = c.exec("h1002", &["hostname".into()]).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "h1002");
}

#[test]
fn a_cut_host_is_unreachable_until_reconnected() {
    if !netns_or_skip("cut link") {
        return;
    }
    let mut c = Cluster::new(sleeper("cut", BackendKind::Netns, 2)).unwrap();
    let ip = c.host("h1").unwrap().v4.unwrap().to_string();
    reaches(&c, "h0", &ip).unwrap();
    c.set_connected("h1", false).unwrap();
    assert!(reaches(&c, "h0", &ip).is_err());
    c.set_connected("h1", true).unwrap();
    wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
        reaches(&c, "h0", &ip)
    })
    .unwrap();
}

/// Ok when `pid` is gone (or a zombie waiting for init to reap it).
fn gone(pid: u32) -> Result<(), String> {
    match proc_state(pid) {
        '?' | 'Z' | 'X' => Ok(()),
        s => Err(format!("pid {pid} still alive (state {s})")),
    }
}

fn proc_state(pid: u32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()))
        .unwrap_or('?')
}

#[test]
fn freeze_thaw_and_kill_take_effect() {
    let backend = BackendKind::from_env().unwrap();
    let mut c = Cluster::new(sleeper("faults", backend, 2)).unwrap();
    c.start_all().unwrap();
    let pid = c.pid("h0").unwrap();
    c.freeze("h0").unwrap();
    wait_until(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || match proc_state(pid) {
            'T' => Ok(()),
            s => Err(format!("state {s}")),
        },
    )
    .unwrap();
    c.thaw("h0").unwrap();
    wait_until(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || match proc_state(pid) {
            'S' | 'R' => Ok(()),
            s => Err(format!("state {s}")),
        },
    )
    .unwrap();
    c.kill("h1").unwrap();
    assert!(!c.is_running("h1"));
    assert!(c.is_running("h0"));
}

#[test]
fn gc_removes_what_a_killed_owner_left_and_its_daemons_die_with_it() {
    let backend = BackendKind::from_env().unwrap();
    let name = if backend == BackendKind::Netns {
        "netns"
    } else {
        "process"
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_dvmlab-harness-owner"))
        .arg(name)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (run, dir, pids) = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "helper ended without a run"
        );
        if let Some(rest) = line.trim().strip_prefix("RUN ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            let pids: Vec<u32> = parts[2].split(',').map(|p| p.parse().unwrap()).collect();
            break (
                parts[0].to_string(),
                std::path::PathBuf::from(parts[1]),
                pids,
            );
        }
    };
    assert_eq!(pids.len(), 3);
    assert!(
        pids.iter().all(|&p| gone(p).is_err()),
        "the helper's daemons run"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The daemons die with their owner (parent-death signal), before any gc.
    wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        pids.iter().try_for_each(|&p| gone(p))
    })
    .unwrap();
    assert!(dir.exists(), "the killed owner could not clean up");
    gc::collect(false);
    assert!(!dir.exists(), "gc removes the run directory");
    assert!(
        gc::harness_namespaces()
            .iter()
            .all(|n| !n.starts_with(&run)),
        "gc removes the namespaces of {run}"
    );
}

/// `dvmlab-harness gc | head -1`: once its reader is gone the report is cut short, but gc
/// still does its work and exits with its own status, without a panic.
#[test]
fn gc_whose_reader_went_away_still_finishes_and_exits_with_its_status() {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_dvmlab-harness"))
        .arg("gc")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("panicked"),
        "gc with its reader gone: {}; stderr: {err}",
        out.status
    );
}

/// Each run's files (its hosts' `/etc` and `TMPDIR`, its logs) live on a tmpfs of the run's
/// own, as a node's `/tmp` would, not on this machine's disk, where every file created after
/// another run's teardown cost a millisecond in ext4's inode allocator; the mount goes with
/// the cluster.
#[test]
fn a_run_directory_is_a_tmpfs_the_hosts_write_into_and_it_goes_with_the_cluster() {
    if !netns_or_skip("run directory on a tmpfs") {
        return;
    }
    let c = Cluster::new(sleeper("rundir", BackendKind::Netns, 2)).unwrap();
    let dir = c.run_dir().to_path_buf();
    assert!(
        rundir::is_tmpfs(&dir),
        "{} is not a tmpfs mount point",
        dir.display()
    );
    let (st, _, err) = c
        .exec_within(
            "h1",
            &[
                "sh".into(),
                "-c".into(),
                "echo x > \"$TMPDIR/written\"".into(),
            ],
            Duration::from_secs(5),
        )
        .unwrap();
    assert!(st.is_some_and(|s| s.success()), "{err}");
    assert!(
        dir.join("tmp").join("h1").join("written").exists(),
        "the host's TMPDIR is not in the run directory"
    );
    drop(c);
    assert!(
        !rundir::is_tmpfs(&dir),
        "{} is still mounted",
        dir.display()
    );
    assert!(!dir.exists(), "{} is still there", dir.display());
}

/// A process inside a host runs the agent to enter another host, and from there a third
/// (as an `orted` tree-spawns the next level): each sees its own name, network and `/etc`
/// only. Overlays stacked on `/etc` once made the third level fail with EINVAL.
#[test]
fn the_agent_enters_hosts_from_inside_hosts_three_deep_each_with_its_own_etc() {
    if !netns_or_skip("agent three deep") {
        return;
    }
    let c = Cluster::new(sleeper("agent-deep", BackendKind::Netns, 3)).unwrap();
    for h in ["h0", "h1", "h2"] {
        std::fs::write(c.etc_dir(h).join("whoami"), h).unwrap();
    }
    let agent = c
        .write_agent(&dvmlab_harness::agent::program().unwrap())
        .unwrap();
    let a = agent.display();
    let ip2 = c.host("h2").unwrap().v4.unwrap();
    // h0 enters h1, which enters h2; the innermost reports its name, its /etc marker, and
    // that it holds h2's address.
    let inner =
        format!("echo $(hostname) $(cat /etc/whoami) $(ip -4 -o addr show | grep -c \" {ip2}/\")");
    let middle = format!("{a} h2 sh -c '{inner}'");
    let out = c
        .exec_within(
            "h0",
            &[a.to_string(), "h1".into(), "sh".into(), "-c".into(), middle],
            Duration::from_secs(20),
        )
        .unwrap();
    let log = std::fs::read_to_string(c.run_dir().join("h2.log")).unwrap_or_default();
    assert!(
        log.contains("h2 h2 1"),
        "the third host's output (its log): {log:?}; stderr: {}",
        out.2
    );
    c.destroy();
}
