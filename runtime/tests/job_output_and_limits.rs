//! End to end, on netns hosts: what a job writes arrives as the bytes it wrote, and a job
//! past a limit is refused with a clear error while the DVM and its other jobs carry on.
//! (Both were defects a user hit: binary output killed the job with SIGPIPE and lost its
//! output; `-n 2000000` sent one frame past the codec's limit and took the DVM down.)

mod common;

use std::time::Duration;

use common::*;
use dvmlab_harness::wait_until;

/// Bytes that are not UTF-8 (every byte value, in a fixed pseudo-random order), then a line
/// longer than one output message, then more of the first kind with no newline at the end.
fn binary_payload() -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect()
    };
    let mut v = noise(3000);
    v.extend((0..=255u8).collect::<Vec<_>>());
    v.extend(std::iter::repeat_n(b'x', 150_000));
    v.push(b'\n');
    v.extend(noise(100));
    v
}

#[test]
fn a_job_writing_bytes_that_are_not_utf8_delivers_them_byte_for_byte_and_exits_0() {
    let Some((mut dvm, hosts)) = Dvm::formed("binary-output", Needs::Netns, 4, 2) else {
        return;
    };
    let payload = binary_payload();
    let file = dvm.cluster.run_dir().join("payload.bin");
    std::fs::write(&file, &payload).unwrap();
    let script = format!("cat {f}; echo alive; cat {f} >&2", f = file.display());
    // On n03 (rank 3), two hops below the controller at radix 2.
    let (code, out, err) = prun_bytes(&dvm, &["-n", "1", "--host", "n03", "sh", "-c", &script]);
    let mut want = payload.clone();
    want.extend_from_slice(b"alive\n");
    assert_eq!(
        code,
        Some(0),
        "stderr: {}\n{}",
        String::from_utf8_lossy(&err),
        dvm.cluster.logs_tail(20)
    );
    assert!(
        out == want,
        "stdout differs: {} bytes, want {}; first difference at byte {:?}",
        out.len(),
        want.len(),
        out.iter().zip(&want).position(|(a, b)| a != b)
    );
    assert!(
        err == payload,
        "stderr: {} bytes, want {}",
        err.len(),
        payload.len()
    );
    // The same through the user's example: random bytes, then a line.
    let (code, out, _) = prun_bytes(
        &dvm,
        &[
            "-n",
            "1",
            "sh",
            "-c",
            "head -c 3000 /dev/urandom; echo alive",
        ],
    );
    assert_eq!(code, Some(0));
    assert_eq!(out.len(), 3006);
    assert!(out.ends_with(b"alive\n"));
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_job_over_a_process_limit_is_refused_with_a_clear_error_and_the_dvm_stays_formed_while_other_jobs_run(
) {
    let Some((mut dvm, hosts)) = Dvm::formed("job-limits", Needs::Netns, 4, 2) else {
        return;
    };
    let gate = dvm.cluster.run_dir().join("gate");
    let script = format!(
        "while [ ! -e {g} ]; do sleep 0.05; done; echo done",
        g = gate.display()
    );
    let out_path = dvm.cluster.run_dir().join("long.out");
    let mut long = spawn_prun(&dvm, &["sh", "-c", &script], &out_path);
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match jobs(&dvm).first() {
            Some(j) if j.state == "RUNNING" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .unwrap();

    let (code, _, err) = prun(&dvm, &["-n", "2000000", "true"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("-n 2000000: a job may have at most 1048576 processes"),
        "{err}"
    );
    let (code, _, err) = prun(&dvm, &["-n", "200000", "true"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("at most 32768 of one job run on one node"),
        "{err}"
    );

    let s = dvm.status().unwrap();
    assert!(s.formed && s.joined == 5, "{s:?}");
    let (code, out, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 4, "{out}");

    std::fs::write(&gate, "").unwrap();
    let st = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        long.try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the long job's prun is still running".to_string())
    })
    .unwrap();
    assert_eq!(
        st.code(),
        Some(0),
        "the job that ran meanwhile was not disturbed"
    );
    let out = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(out.matches("done").count(), 4, "{out}");
    let js = jobs(&dvm);
    assert_eq!(js.len(), 2, "refused jobs are not jobs: {js:?}");
    assert!(
        js.iter()
            .all(|j| j.exception.is_none() && j.status == Some(0)),
        "{js:?}"
    );
    for h in &hosts {
        let log = dvm.cluster.log(h);
        assert!(
            !log.contains("dropping the link") && !log.contains("silent for"),
            "{h} lost a link:\n{log}"
        );
    }
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_job_of_more_processes_than_the_machine_has_pids_runs_and_the_dvm_stays_formed() {
    let Some((mut dvm, hosts)) = Dvm::formed("many-procs", Needs::Netns, 16, 4) else {
        return;
    };
    // 40 000 short processes, 2500 per node: more than this machine's pid_max (32 768) at
    // once, so each node must reap as it starts, and keep answering heartbeats meanwhile.
    let argv = [PRUN, "-n", "40000", "true"].map(String::from);
    let (st, _, err) = dvm
        .cluster
        .exec_within(&dvm.ctl, &argv, Duration::from_secs(200))
        .unwrap();
    assert_eq!(
        st.and_then(|s| s.code()),
        Some(0),
        "{err}\n{}",
        dvm.cluster.logs_tail(20)
    );
    let js = jobs(&dvm);
    assert_eq!(
        (js[0].nprocs, js[0].status),
        (40_000, Some(0)),
        "{:?}",
        js[0].exception
    );
    let s = dvm.status().unwrap();
    assert!(s.formed && s.joined == 17, "{s:?}");
    for h in &hosts {
        assert!(
            !dvm.cluster.log(h).contains("silent for"),
            "{h} lost a link"
        );
    }
    dvm.stop_cleanly(&hosts);
}

#[test]
fn prun_stdin_reaches_process_0_byte_for_byte_at_its_pace_and_the_others_read_nothing() {
    let Some((mut dvm, hosts)) = Dvm::formed("job-stdin", Needs::Netns, 4, 2) else {
        return;
    };
    // Twelve times the window, every byte value, no final newline.
    let mut x: u32 = 0x2545_f491;
    let payload: Vec<u8> = (0..(12 * dvmlab_proto::limits::STDIN_WINDOW))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect();
    let file = dvm.cluster.run_dir().join("stdin.bin");
    std::fs::write(&file, &payload).unwrap();
    let sh = |cmd: String| {
        let (st, out, err) = dvm
            .cluster
            .exec_within_bytes(
                &dvm.ctl,
                &["sh".to_string(), "-c".to_string(), cmd],
                Duration::from_secs(60),
            )
            .unwrap_or_else(|e| panic!("prun: {e}"));
        (st.and_then(|s| s.code()), out, err)
    };
    // Process 0 on n03, two hops below the controller; it reads slowly at first, so the
    // window fills and prun must wait for acknowledgements.
    let (code, out, err) = sh(format!(
        "{PRUN} -n 3 --host n03,n01,n02 -- sh -c 'sleep 0.5; cat' < {}",
        file.display()
    ));
    assert_eq!(
        code,
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&err),
        dvm.cluster.logs_tail(20)
    );
    assert!(
        out == payload,
        "stdout: {} bytes, want {}; first difference at byte {:?}",
        out.len(),
        payload.len(),
        out.iter().zip(&payload).position(|(a, b)| a != b)
    );
    // A process that never reads its stdin does not hold the job up.
    let (code, out, _) = sh(format!("{PRUN} -n 1 -- true < {}", file.display()));
    assert_eq!((code, out.len()), (Some(0), 0));
    // Without stdin, process 0 reads /dev/null.
    let (code, out, _) = sh(format!(
        "{PRUN} --stdin none -n 1 -- wc -c < {}",
        file.display()
    ));
    assert_eq!(code, Some(0));
    assert_eq!(String::from_utf8_lossy(&out).trim(), "0");
    dvm.stop_cleanly(&hosts);
}
