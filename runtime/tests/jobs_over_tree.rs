//! End to end: jobs run over the routing tree (Flux RFC 33 job control) — `prun` submits,
//! daemons start the processes on their nodes, output streams back, the job's status comes
//! out, and `pctl jobs` shows where everything ran.

mod common;

use std::time::Duration;

use common::*;
use dvmlab_harness::{wait_until, BackendKind, IpMode};

#[test]
fn a_job_runs_on_every_node_streams_its_output_and_exits_with_its_status() {
    let Some((mut dvm, hosts)) = Dvm::formed("jobs", Needs::AnyBackend, 6, 2) else {
        return;
    };

    let (code, out, err) = prun(
        &dvm,
        &[
            "--tag-output",
            "sh",
            "-c",
            "echo proc $DVMLAB_PROC of $DVMLAB_NPROCS; echo oops >&2",
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    for p in 0..6 {
        assert!(out.contains(&format!("[{p}] proc {p} of 6")), "{out}");
    }
    assert_eq!(err.matches("oops").count(), 6, "{err}");

    let (code, _, err) = prun(&dvm, &["-n", "3", "sh", "-c", "exit $((DVMLAB_PROC + 2))"]);
    assert_eq!(code, Some(4), "the greatest exit status: {err}");

    let (code, out, _) = prun(
        &dvm,
        &[
            "-n",
            "4",
            "--map-by",
            "slot",
            "--host",
            "n02,n05",
            "sh",
            "-c",
            "echo $DVMLAB_PROC",
        ],
    );
    assert_eq!(code, Some(0));
    assert_eq!(out.lines().count(), 4);
    let js = jobs(&dvm);
    assert_eq!(js.len(), 3);
    assert!(js.iter().all(|j| j.state == "INACTIVE"), "{js:?}");
    assert_eq!(js[1].status, Some(4 << 8));
    let hosts_of_last: Vec<&str> = js[2].placement.iter().map(|p| p.host.as_str()).collect();
    assert_eq!(hosts_of_last, ["n02", "n02", "n05", "n05"]);
    let s = dvm.status().unwrap();
    let m = s.job_messages.expect("job message counters in status");
    // Radix 2: the controller hears one start per child subtree per job, not one per rank.
    assert!(m.start <= 2 * 3, "{m:?}");
    dvm.stop_cleanly(&hosts);
}

/// What a job process of a 2-node DVM sees of itself (its variables' names and dvmlab's values, descriptors 0 to 3,
/// whether it leads its group, its directory, its signal mask and ignored signals), per
/// process, sorted; started with `dvmlab_spawn_clone` `clone`.
fn what_job_processes_see(test: &str, clone: &str) -> Option<Vec<String>> {
    let (mut dvm, hosts) = Dvm::formed_with(test, Needs::AnyBackend, 2, 2, |s| {
        s.env
            .push(("PRTE_MCA_dvmlab_spawn_clone".into(), clone.into()))
    })?;
    let script = r#"echo "$DVMLAB_PROC/$DVMLAB_NPROCS job $DVMLAB_JOB_ID fd3=$DVMLAB_BARRIER_FD"
        for fd in 0 1 2 3; do echo "$DVMLAB_PROC: $fd $(readlink /proc/$$/fd/$fd | cut -d: -f1)"; done
        [ "$(cut -d' ' -f5 /proc/$$/stat)" = "$$" ] && echo "$DVMLAB_PROC: leads its group"
        echo "$DVMLAB_PROC: in $(pwd)"
        sed -n "s/^\(Sig[BI][lg][kn]\)/$DVMLAB_PROC: \1/p" /proc/self/status
        env | cut -d= -f1 | grep -v -x -e PWD -e OLDPWD -e _ -e SHLVL | sed "s/^/$DVMLAB_PROC: env /""#;
    let (code, out, err) = prun(&dvm, &["-n", "2", "--wdir", "/tmp", "sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}{err}");
    dvm.stop_cleanly(&hosts);
    let mut lines: Vec<String> = out.lines().map(str::to_string).collect();
    lines.sort();
    Some(lines)
}

#[test]
fn processes_started_by_the_clone_and_by_posix_spawn_see_the_same_but_glibcs_own_ignored_signals() {
    let test = "clone and posix_spawn alike";
    if BackendKind::from_env().is_ok_and(|b| b == BackendKind::Docker) {
        // Docker 20.10's seccomp profile refuses clone3: both DVMs would use posix_spawn.
        dvmlab_harness::skip(test, "Docker's seccomp refuses clone3, so nothing clones");
        return;
    }
    let Some(cloned) = what_job_processes_see(test, "1") else {
        return;
    };
    let Some(spawned) = what_job_processes_see(test, "0") else {
        return;
    };
    let ignored = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.contains("SigIgn"))
            .cloned()
            .collect()
    };
    // glibc's posix_spawn leaves at most its own two signals (32 and 33) ignored in the
    // child; the clone leaves none.
    assert_eq!(
        ignored(&cloned),
        [
            "0: SigIgn:\t0000000000000000",
            "1: SigIgn:\t0000000000000000"
        ],
        "{cloned:#?}"
    );
    for l in ignored(&spawned) {
        let bits = u64::from_str_radix(l.rsplit('\t').next().unwrap_or(""), 16);
        assert!(
            bits.is_ok_and(|b| b & !(0b11 << 31) == 0),
            "posix_spawn: {l:?}"
        );
    }
    let rest = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| !l.contains("SigIgn"))
            .cloned()
            .collect()
    };
    assert_eq!(rest(&cloned), rest(&spawned));
    for p in 0..2 {
        for l in [
            format!("{p}/2 job 1 fd3=3"),
            format!("{p}: 0 /dev/null"),
            format!("{p}: 1 pipe"),
            format!("{p}: 2 pipe"),
            format!("{p}: 3 socket"),
            format!("{p}: leads its group"),
            format!("{p}: in /tmp"),
            format!("{p}: SigBlk:\t0000000000000000"),
            format!("{p}: env DVMLAB_NPROCS"),
        ] {
            assert!(cloned.contains(&l), "{l:?} not in {cloned:#?}");
        }
    }
}

/// The pid of `daemon`'s job reaper: its child named `prted-reaper`.
fn reaper_of(daemon: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the ")" that ends the name: state, then the parent's pid.
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (name == "prted-reaper" && ppid == daemon).then_some(pid)
    })
}

#[test]
fn a_daemon_whose_job_reaper_is_killed_says_so_in_its_log_and_keeps_running_jobs() {
    let Some((mut dvm, hosts)) = Dvm::formed("reaper-gone", Needs::AnyBackend, 2, 2) else {
        return;
    };
    let daemon = dvm.cluster.pid("n01").expect("n01's daemon");
    let reaper = reaper_of(daemon).expect("n01's daemon has a job reaper");
    assert!(
        !dvm.cluster.log("n01").contains("the job reaper"),
        "{}",
        dvm.cluster.logs_tail(20)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(reaper as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let log = dvm.cluster.log("n01");
        log.lines()
            .find(|l| {
                l.contains(&format!(
                    "the job reaper (pid {reaper}) was killed by SIGKILL"
                ))
            })
            .map(|_| ())
            .ok_or_else(|| format!("no word of the reaper in n01's log:\n{log}"))
    })
    .unwrap();
    let (code, out, err) = prun(&dvm, &["--host", "n01", "echo", "still here"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.trim(), "still here");
    dvm.stop_cleanly(&hosts);
    // A clean stop lets go of the reaper: no word of it from a daemon that was not hit.
    assert!(!dvm.cluster.log("n02").contains("the job reaper"));
}

#[test]
fn a_killed_daemon_leaves_no_process_of_its_job_nor_their_children_behind_and_the_job_fails() {
    let Some((mut dvm, _)) = Dvm::formed("orphans", Needs::AnyBackend, 3, 2) else {
        return;
    };
    let marker = format!("dvlsleep{}", std::process::id());
    let err_path = dvm.cluster.run_dir().join("prun.err");
    // A grandchild in each job process's group, as well as the process itself.
    let mut prun = start_sleepers(
        &dvm,
        &format!("(exec -a {marker}-$DVMLAB_PROC-child sleep 600) & exec -a {marker}-$DVMLAB_PROC sleep 600"),
        std::fs::File::create(&err_path).unwrap().into(),
    );
    wait_for_procs(
        &marker,
        6,
        Duration::from_secs(10),
        "job processes and children of theirs",
    );
    // Process 1 runs on n02 (rank 2): one process per node, in rank order.
    dvm.cluster.kill("n02").unwrap();
    wait_for_procs(
        &format!("{marker}-1"),
        0,
        Duration::from_secs(1),
        "of n02's job processes (or their children) 1 s after SIGKILL of its daemon",
    );
    // The job gets a node-failure exception: the other shells are killed and it ends.
    let st = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        prun.try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "prun still running".to_string())
    })
    .unwrap();
    assert_eq!(st.code(), Some(137), "SIGKILL: 128 + 9");
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(err.contains("node-failure"), "{err}");
    // The other shells were killed with their groups when the job failed.
    wait_for_procs(
        &marker,
        0,
        Duration::from_secs(1),
        "processes of the failed job alive",
    );
    let js = jobs(&dvm);
    assert_eq!(js[0].state, "INACTIVE");
    assert!(js[0]
        .exception
        .as_deref()
        .unwrap_or("")
        .contains("node-failure"));
}

#[test]
fn a_controller_restarted_mid_job_recovers_it_losing_and_repeating_nothing() {
    let Some((mut dvm, hosts)) = Dvm::formed("recovery", Needs::AnyBackend, 6, 2) else {
        return;
    };
    let marks = dvm.cluster.run_dir().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let gate = marks.join("go");
    // Each process records its start, waits for the gate (opened after the restart), and
    // records its end: a lost process never ends, a repeated one starts twice.
    let script = format!(
        "echo start >> {m}/p$DVMLAB_PROC; while [ ! -e {g} ]; do sleep 0.05; done; echo end >> {m}/p$DVMLAB_PROC",
        m = marks.display(),
        g = gate.display()
    );
    let mut argv = vec![PRUN.to_string()];
    argv.extend(["sh", "-c", script.as_str()].map(String::from));
    let mut prun = dvm
        .cluster
        .command(&dvm.ctl, &argv)
        .unwrap()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let js = jobs(&dvm);
        match js.first() {
            Some(j) if j.state == "RUNNING" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .unwrap();
    dvm.cluster.kill("ctl").unwrap();
    let _ = prun.wait();
    dvm.cluster.start("ctl").unwrap();
    dvm.wait_formed(Duration::from_secs(20));
    let js = jobs(&dvm);
    assert_eq!(
        js.len(),
        1,
        "the restarted controller knows the job: {js:?}"
    );
    assert_eq!(js[0].state, "RUNNING", "{js:?}");
    std::fs::write(&gate, "").unwrap();
    wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        let js = jobs(&dvm);
        if js[0].state == "INACTIVE" {
            Ok(())
        } else {
            Err(format!("{js:?}"))
        }
    })
    .unwrap();
    let js = jobs(&dvm);
    assert_eq!(js[0].status, Some(0), "{js:?}");
    assert_eq!(js[0].exception, None, "{js:?}");
    for p in 0..6 {
        let text = std::fs::read_to_string(marks.join(format!("p{p}"))).unwrap_or_default();
        assert_eq!(
            text, "start\nend\n",
            "process {p} ran exactly once, to its end"
        );
    }
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_controller_ended_by_sigterm_sends_the_job_removes_it_holds_before_it_exits() {
    // The longest hold, so that the signal comes while the job's removes are held: daemons
    // that kept the job would take it for a stray under the restarted controller.
    let Some((mut dvm, hosts)) = Dvm::formed_with("held-removes", Needs::AnyBackend, 4, 2, |s| {
        s.env
            .push(("PRTE_MCA_dvmlab_remove_hold".into(), "1".into()))
    }) else {
        return;
    };
    let (code, _, err) = prun(&dvm, &["true"]);
    assert_eq!(code, Some(0), "{err}");
    let ctl = dvm.ctl.clone();
    dvm.cluster.stop(&ctl).unwrap();
    dvm.cluster.start(&ctl).unwrap();
    dvm.wait_formed(Duration::from_secs(20));
    // A job on every node: every daemon had its hello answered by the new controller.
    let (code, _, err) = prun(&dvm, &["true"]);
    assert_eq!(code, Some(0), "{err}");
    for h in &hosts[1..] {
        let log = dvm.cluster.log(h);
        assert!(
            !log.contains("upstream does not know it"),
            "{h} kept the job that had ended:\n{}",
            dvm.cluster.logs_tail(40)
        );
    }
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_restarted_controller_that_also_ran_job_processes_fails_the_job_for_the_ones_it_lost() {
    let Some(b) = backend("ctlnode", Needs::AnyBackend) else {
        return;
    };
    let (_, hosts) = ctl_and_nodes(3);
    // The controller is listed, so it is rank 0 and a compute node too.
    let conf = conf_for(3).set("DVMNodes", "ctl,n[2:1-3]");
    let mut dvm = Dvm::new("ctlnode", b, IpMode::V4, &hosts, &conf);
    dvm.cluster.start_all().unwrap();
    dvm.wait_formed(Duration::from_secs(10));
    let marker = format!("dvlctl{}", std::process::id());
    let mut prun = start_sleepers(
        &dvm,
        &format!("exec -a {marker}-$DVMLAB_PROC sleep 600"),
        std::process::Stdio::null(),
    );
    wait_for_procs(&marker, 4, Duration::from_secs(10), "job processes");
    // Process 0 runs on the controller: it dies with it.
    dvm.cluster.kill("ctl").unwrap();
    let _ = prun.wait();
    wait_for_procs(
        &format!("{marker}-0"),
        0,
        Duration::from_secs(1),
        "of the controller's job processes 1 s after SIGKILL of the controller",
    );
    dvm.cluster.start("ctl").unwrap();
    dvm.wait_formed(Duration::from_secs(20));
    let js = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        let js = jobs(&dvm);
        match js.first() {
            Some(j) if j.state == "INACTIVE" => Ok(js),
            _ => Err(format!("{js:?}")),
        }
    })
    .unwrap();
    let e = js[0].exception.clone().unwrap_or_default();
    assert!(e.contains("not running on rank 0"), "{js:?}");
    wait_for_procs(
        &marker,
        0,
        Duration::from_secs(1),
        "processes of the failed job alive",
    );
    dvm.stop_cleanly(&hosts);
}

/// Starts `prun` with one `bash -c script` per node, stdout discarded.
fn start_sleepers(dvm: &Dvm, script: &str, stderr: std::process::Stdio) -> std::process::Child {
    let argv = [PRUN, "bash", "-c", script].map(String::from);
    dvm.cluster
        .command(&dvm.ctl, &argv)
        .unwrap()
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Waits until exactly `n` processes' command lines start with `pattern`.
fn wait_for_procs(pattern: &str, n: usize, within: Duration, what: &str) {
    wait_until(within, Duration::from_millis(10), || {
        match count_procs(pattern) {
            c if c == n => Ok(()),
            c => Err(format!("{c} {what} (want {n})")),
        }
    })
    .unwrap();
}

/// How many processes' command lines start with `pattern`.
fn count_procs(pattern: &str) -> usize {
    let out = std::process::Command::new("pgrep")
        .args(["-f", &format!("^{pattern}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn time_limits_signals_prologs_and_epilogs_do_what_they_say() {
    let Some(b) = backend("limits", Needs::AnyBackend) else {
        return;
    };
    let (_, hosts) = ctl_and_nodes(3);
    let mut dvm = Dvm::new("limits", b, IpMode::V4, &hosts, &conf_for(3));
    let marks = dvm.cluster.run_dir().join("hooks");
    std::fs::create_dir_all(&marks).unwrap();
    let m = marks.display();
    let conf = conf_for(3)
        .set("JobProlog", format!("echo pro >> {m}/j$DVMLAB_JOB_ID"))
        .set(
            "JobEpilog",
            format!("sleep 0.2; echo epi >> {m}/j$DVMLAB_JOB_ID"),
        );
    dvm.cluster.set_conf(&conf.render()).unwrap();
    dvm.cluster.start_all().unwrap();
    dvm.wait_formed(Duration::from_secs(10));

    // The time limit kills the job with a timeout exception.
    let (code, _, err) = prun(&dvm, &["--time-limit", "0.5", "sleep", "600"]);
    assert_eq!(code, Some(137), "{err}");
    assert!(err.contains("timeout"), "{err}");
    // Release waited for every epilog: all three are done when prun returns.
    let hooks = std::fs::read_to_string(marks.join("j1")).unwrap();
    assert_eq!(hooks.matches("pro").count(), 3, "{hooks}");
    assert_eq!(hooks.matches("epi").count(), 3, "{hooks}");

    // SIGTERM to prun reaches every process of the job.
    let script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done";
    let out_path = dvm.cluster.run_dir().join("term.out");
    let mut p = spawn_prun(&dvm, &["sh", "-c", script], &out_path);
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let out = std::fs::read_to_string(&out_path).unwrap_or_default();
        match out.matches("ready").count() {
            3 => Ok(()),
            n => Err(format!("{n} processes ready")),
        }
    })
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = p.wait().unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(st.code(), Some(7), "{out}");
    assert_eq!(out.matches("got-term").count(), 3, "{out}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_barrier_releases_no_process_before_every_process_of_the_job_entered_it() {
    let Some(b) = backend("barrier", Needs::AnyBackend) else {
        return;
    };
    let (_, hosts) = ctl_and_nodes(3);
    let mut dvm = Dvm::new("barrier", b, IpMode::V4, &hosts, &conf_for(3));
    dvm.cluster.start_all().unwrap();
    dvm.wait_formed(Duration::from_secs(10));
    let flag = dvm.cluster.run_dir().join("late-entered");
    // Two processes per node; the last one enters late, after leaving a mark. Nobody may
    // leave the barrier before the mark exists.
    let script = format!(
        "if [ $DVMLAB_PROC = 5 ]; then sleep 0.5; touch {f}; fi; \
         echo 'barrier 1' >&$DVMLAB_BARRIER_FD; read reply <&$DVMLAB_BARRIER_FD; \
         if [ -e {f} ]; then echo \"$DVMLAB_PROC left after all: $reply\"; else echo early; fi",
        f = flag.display()
    );
    let (code, out, err) = prun(&dvm, &["-n", "6", "sh", "-c", &script]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains("early"), "{out}");
    assert_eq!(out.matches("left after all: ok 1").count(), 6, "{out}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_process_that_exits_right_after_entering_a_barrier_still_entered_it() {
    let Some((mut dvm, hosts)) = Dvm::formed("barrierexit", Needs::AnyBackend, 2, 2) else {
        return;
    };
    // Seven of the eight enter and exit at once, without waiting for the reply: their
    // requests and their exits reach the daemon together.
    let script = "echo 'barrier 1' >&3; [ $DVMLAB_PROC -lt 7 ] && exit 0; \
                  read reply <&3; echo \"the last one left: $reply\"";
    let (code, out, err) = prun(&dvm, &["--host", "n01", "-n", "8", "sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("the last one left: ok 1"), "{out}{err}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_job_ends_after_its_process_even_if_something_it_left_running_keeps_writing_its_output() {
    let Some((mut dvm, hosts)) = Dvm::formed("lingering", Needs::AnyBackend, 2, 2) else {
        return;
    };
    // The loop holds the process's stdout and writes on it for ever: the job still ends
    // (a second after its process), and the loop dies writing to a pipe no longer read.
    let script = "(while :; do echo more; sleep 0.01; done) & echo started; exit 0";
    let (code, out, err) = prun(&dvm, &["--host", "n01", "-n", "1", "sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("started\n"), "{out}{err}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_long_line_on_the_barrier_socket_is_dropped_as_it_comes_and_the_next_barrier_still_works() {
    let Some((mut dvm, hosts)) = Dvm::formed("barrierline", Needs::AnyBackend, 2, 2) else {
        return;
    };
    let before = status_kib(&dvm, "n01", "VmHWM");
    // 8 MiB without a newline, then a real request: the daemon keeps none of the line.
    let script = "head -c 8388608 /dev/zero | tr '\\0' x >&3; echo >&3; \
                  echo 'barrier 1' >&3; read reply <&3; echo \"after the long line: $reply\"";
    let (code, out, err) = prun(&dvm, &["--host", "n01", "-n", "1", "sh", "-c", script]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("after the long line: ok 1"), "{out}{err}");
    let grew = status_kib(&dvm, "n01", "VmHWM").saturating_sub(before);
    assert!(
        grew < 2048,
        "n01's peak memory grew by {grew} KiB while a process wrote an 8 MiB line on its barrier socket"
    );
    dvm.stop_cleanly(&hosts);
}

/// The signal numbers a thread of `pid` blocks, per thread other than the main one, from
/// `/proc/PID/task/TID/status` (`SigBlk`, a hex mask with bit n-1 for signal n).
fn helper_thread_masks(pid: u32) -> (u64, Vec<(u32, u64)>) {
    let mask = |tid: u32| {
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no SigBlk for thread {tid} of {pid}: {status}"))
    };
    let mut helpers = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads") {
        let tid: u32 = t
            .expect("a thread")
            .file_name()
            .to_string_lossy()
            .parse()
            .unwrap();
        if tid != pid {
            helpers.push((tid, mask(tid)));
        }
    }
    (mask(pid), helpers)
}

#[test]
fn a_job_process_exit_signals_only_the_daemons_own_thread_never_a_helper() {
    let Some((mut dvm, hosts)) = Dvm::formed("sigmask", Needs::AnyBackend, 2, 2) else {
        return;
    };
    let (code, _, err) = prun(&dvm, &["true"]);
    assert_eq!(code, Some(0), "{err}");
    let sigchld = 1u64 << (nix::sys::signal::Signal::SIGCHLD as i32 - 1);
    // The controller always has its jobs-file writer; blocking-pool threads (a daemon
    // resolves its parent's name in one) linger for a while after their work, so whichever
    // are still there are checked too (the runtime's own test covers the pool for certain).
    for host in [dvm.ctl.clone(), "n01".to_string()] {
        let pid = dvm.cluster.pid(&host).expect("daemon running");
        let (main, helpers) = helper_thread_masks(pid);
        assert_eq!(
            main & sigchld,
            0,
            "{host}: the daemon's thread must take SIGCHLD"
        );
        if host == dvm.ctl {
            assert!(
                !helpers.is_empty(),
                "the controller has no jobs-file writer thread"
            );
        }
        for (tid, m) in helpers {
            assert_ne!(
                m & sigchld,
                0,
                "{host}: helper thread {tid} takes SIGCHLD (mask {m:x})"
            );
        }
    }
    dvm.stop_cleanly(&hosts);
}
