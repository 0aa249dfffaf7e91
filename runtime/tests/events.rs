//! End to end: PMIx events (RFC 0002) between job processes and tools on different nodes,
//! through their daemons and the tree, observed with `pevent`'s JSON lines.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use dvmlab_harness::wait_until;
use serde_json::Value;

/// Starts `pevent ARGS` on `host`, its stdout to `out`.
fn spawn_pevent(dvm: &Dvm, host: &str, args: &[&str], out: &Path) -> std::process::Child {
    let mut argv = vec![PEVENT.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    dvm.cluster
        .command(host, &argv)
        .unwrap()
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Runs `pevent ARGS` on `host` to its end; (success, stderr).
fn pevent(dvm: &Dvm, host: &str, args: &[&str]) -> (bool, String) {
    let mut argv = vec![PEVENT.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let (st, _, err) = dvm
        .cluster
        .exec_within(host, &argv, Duration::from_secs(20))
        .unwrap();
    (st.is_some_and(|s| s.success()), err)
}

/// Waits until the file `out` (a listener's output) contains `what`.
fn wait_for(out: &Path, what: &str) {
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let t = std::fs::read_to_string(out).unwrap_or_default();
        if t.contains(what) {
            Ok(())
        } else {
            Err(format!("no {what} yet: {t:?}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The handler calls job process `p` printed (`--tag-output` lines `[p] …`).
fn calls_of(text: &str, p: u32) -> Vec<Value> {
    let prefix = format!("[{p}] ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l.get("handler").is_some())
        .collect()
}

/// After abuse: a new listener on `host` still hears a SESSION event notified from
/// `notifier`, and the DVM is still formed; then it stops.
fn still_serving(mut dvm: Dvm, hosts: &[String], host: &str, notifier: &str) {
    let out = dvm.cluster.run_dir().join("after.out");
    let args = [
        "listen",
        "--handler",
        "name=after",
        "--count",
        "1",
        "--timeout",
        "20",
    ];
    let mut after = spawn_pevent(&dvm, host, &args, &out);
    wait_for(&out, "\"ready\"");
    let (ok, err) = pevent(&dvm, notifier, &["notify", "-3002", "--range", "SESSION"]);
    assert!(ok, "{err}");
    assert!(wait_exit(&mut after, "the listener after").success());
    assert!(dvm.status().unwrap().formed);
    dvm.stop_cleanly(hosts);
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_exit(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    wait_until(Duration::from_secs(30), Duration::from_millis(20), || {
        child
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{what} still running"))
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn an_event_notified_on_one_node_runs_a_listeners_chain_on_another_in_order_with_results() {
    let Some((mut dvm, hosts)) = Dvm::formed("events-chain", Needs::AnyBackend, 3, 2) else {
        return;
    };
    let out = dvm.cluster.run_dir().join("listener.out");
    let mut listener = spawn_pevent(
        &dvm,
        "n03",
        &[
            "listen",
            "--handler",
            "name=b",
            "--handler",
            "name=a,codes=-3001,status=PARTIAL_ACTION_TAKEN,results=k:1",
            "--handler",
            "name=last,codes=-3001:-3002",
            "--count",
            "1",
            "--timeout",
            "20",
        ],
        &out,
    );
    wait_for(&out, "\"ready\"");
    let (ok, err) = pevent(
        &dvm,
        "n01",
        &["notify", "-3001", "--range", "SESSION", "--info", "x=7"],
    );
    assert!(ok, "{err}");
    assert!(wait_exit(&mut listener, "the listener").success());
    let lines = json_lines(&std::fs::read_to_string(&out).unwrap());
    let calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("handler").is_some())
        .collect();
    let order: Vec<&str> = calls
        .iter()
        .map(|c| c["handler"].as_str().unwrap())
        .collect();
    // The specific code first, then the group containing it, then the default handler.
    assert_eq!(order, ["a", "last", "b"], "{lines:?}");
    assert_eq!(
        calls[0]["info"],
        serde_json::json!([{"key": "x", "value": 7}])
    );
    assert_eq!(calls[0]["results"], serde_json::json!([]));
    assert_eq!(
        calls[2]["results"],
        serde_json::json!([
            {"key": "a", "value": [{"key": "a", "value": -332}, {"key": "k", "value": 1}]},
            {"key": "last", "value": [{"key": "last", "value": -331}]}
        ]),
        "each handler sees every earlier one's name, status and results"
    );
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_custom_event_reaches_exactly_its_target_processes_even_before_they_register() {
    let Some((mut dvm, hosts)) = Dvm::formed("events-custom", Needs::AnyBackend, 3, 2) else {
        return;
    };
    let out = dvm.cluster.run_dir().join("job.out");
    // Process 2 is not a target: it listens for 4 s and must hear nothing.
    let script = format!(
        "if [ $DVMLAB_PROC = 2 ]; then exec {PEVENT} listen --handler name=h --timeout 4; \
         else exec {PEVENT} listen --handler name=h --count 1 --timeout 20; fi"
    );
    let mut job = spawn_prun(
        &dvm,
        &["-n", "3", "--tag-output", "sh", "-c", &script],
        &out,
    );
    let js = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let js = jobs(&dvm);
        match js.last() {
            Some(j) if j.state == "RUNNING" => Ok(js),
            other => Err(format!("job not running yet: {other:?}")),
        }
    })
    .unwrap();
    let nspace = format!("{}@{}", dvm.status().unwrap().namespace, js[0].id);
    let (ok, err) = pevent(
        &dvm,
        &dvm.ctl.clone(),
        &[
            "notify",
            "PMIX_ERR_PROC_ABORTED",
            "--range",
            "CUSTOM",
            "--target",
            &format!("{nspace}:0"),
            "--target",
            &format!("{nspace}:1"),
        ],
    );
    assert!(ok, "{err}");
    let st = wait_exit(&mut job, "the job");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(st.success(), "{text}");
    for p in 0..3 {
        let heard = calls_of(&text, p).len();
        assert_eq!(heard, usize::from(p < 2), "process {p}:\n{text}");
    }
    assert!(text.contains("\"code\":-7"), "{text}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_process_killed_by_a_signal_is_announced_to_the_other_processes_of_its_job() {
    let Some((mut dvm, hosts)) = Dvm::formed("events-abort", Needs::AnyBackend, 3, 2) else {
        return;
    };
    // Process 0 dies by SIGKILL, perhaps before the others even registered: they hear it.
    let script = format!(
        "if [ $DVMLAB_PROC = 0 ]; then kill -9 $$; \
         else exec {PEVENT} listen --handler name=h,codes=PMIX_ERR_PROC_ABORTED --count 1 --timeout 20; fi"
    );
    let (code, out, err) = prun(&dvm, &["-n", "3", "--tag-output", "sh", "-c", &script]);
    assert_eq!(code, Some(137), "{out}{err}");
    for p in [1, 2] {
        let call = calls_of(&out, p)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("process {p} heard nothing:\n{out}{err}"));
        assert_eq!(call["code"], -7);
        let affected = call["info"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["key"] == "pmix.evaffected")
            .unwrap();
        assert_eq!(affected["value"]["rank"], 0, "{call}");
    }
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_signal_that_does_not_end_a_job_leaves_its_processes_deaths_announced() {
    let Some((mut dvm, hosts)) = Dvm::formed("events-usr1", Needs::AnyBackend, 1, 2) else {
        return;
    };
    // USR1 to the job: process 0 then dies by SIGKILL (its own doing, not the runtime's);
    // process 1 ignores USR1 and must still hear of the abort.
    let script = format!(
        "if [ $DVMLAB_PROC = 0 ]; then trap 'kill -9 $$' USR1; while :; do sleep 0.05; done; \
         else trap '' USR1; exec {PEVENT} listen --handler name=h,codes=PMIX_ERR_PROC_ABORTED --count 1 --timeout 20; fi"
    );
    let out = dvm.cluster.run_dir().join("usr1.out");
    let mut job = spawn_prun(
        &dvm,
        &[
            "-n",
            "2",
            "--host",
            "n01",
            "--tag-output",
            "sh",
            "-c",
            &script,
        ],
        &out,
    );
    wait_for(&out, "\"ready\":true");
    let id = jobs(&dvm)
        .into_iter()
        .find(|j| j.state == "RUNNING")
        .map(|j| j.id)
        .expect("the job runs");
    let (ok, _, err) = dvm.pctl(&["kill", &id.to_string(), "USR1"]);
    assert!(ok, "{err}");
    wait_exit(&mut job, "the job");
    let text = std::fs::read_to_string(&out).unwrap();
    let heard = calls_of(&text, 1).iter().any(|l| l["code"] == -7);
    assert!(heard, "process 1 heard no PROC_ABORTED:\n{text}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_lost_daemon_is_an_environment_event_for_those_that_asked() {
    let Some((dvm, _)) = Dvm::formed("events-nodedown", Needs::AnyBackend, 3, 2) else {
        return;
    };
    let out = dvm.cluster.run_dir().join("env.out");
    let job_only = dvm.cluster.run_dir().join("job.out");
    let mut env = spawn_pevent(
        &dvm,
        "n01",
        &[
            "listen",
            "--handler",
            "name=env,codes=PMIX_EVENT_NODE_DOWN,env=true",
            "--count",
            "1",
            "--timeout",
            "30",
        ],
        &out,
    );
    let mut job = spawn_pevent(
        &dvm,
        "n02",
        &[
            "listen",
            "--handler",
            "name=job,codes=PMIX_EVENT_NODE_DOWN",
            "--count",
            "1",
            "--timeout",
            "12",
        ],
        &job_only,
    );
    for f in [&out, &job_only] {
        wait_for(f, "\"ready\"");
    }
    let mut dvm = dvm;
    dvm.cluster.kill("n03").unwrap();
    assert!(wait_exit(&mut env, "the environment listener").success());
    let text = std::fs::read_to_string(&out).unwrap();
    let call = json_lines(&text)
        .into_iter()
        .find(|l| l.get("handler").is_some())
        .unwrap();
    assert_eq!(call["code"], -231, "{text}");
    assert!(text.contains("\"n03\""), "{text}");
    // A registration that did not ask for environment events never sees one.
    assert_eq!(
        wait_exit(&mut job, "the job-level listener").code(),
        Some(1)
    );
    assert!(!std::fs::read_to_string(&job_only)
        .unwrap()
        .contains("\"handler\""));
}

#[test]
fn a_listener_killed_mid_chain_and_one_that_registers_too_many_leave_the_daemon_serving() {
    let Some((dvm, hosts)) = Dvm::formed("events-rude", Needs::AnyBackend, 2, 2) else {
        return;
    };
    let slow_out = dvm.cluster.run_dir().join("slow.out");
    let mut slow = spawn_pevent(
        &dvm,
        "n01",
        &[
            "listen",
            "--handler",
            "name=slow,delay-ms=60000",
            "--timeout",
            "60",
        ],
        &slow_out,
    );
    wait_for(&slow_out, "\"ready\"");
    let (ok, err) = pevent(&dvm, "n02", &["notify", "-3001", "--range", "SESSION"]);
    assert!(ok, "{err}");
    wait_for(&slow_out, "\"handler\"");
    slow.kill().unwrap();
    let _ = slow.wait();
    // A chain file of more handlers than a process may register: refused, said so.
    let chain = dvm.cluster.run_dir().join("many.json");
    let many: Vec<serde_json::Value> = (0..1100)
        .map(|i| serde_json::json!({"name": format!("h{i}"), "codes": [-3001]}))
        .collect();
    std::fs::write(&chain, serde_json::to_string(&many).unwrap()).unwrap();
    let chain_arg = chain.to_string_lossy().into_owned();
    let (ok, err) = pevent(
        &dvm,
        "n01",
        &["listen", "--chain", &chain_arg, "--count", "1"],
    );
    assert!(!ok && err.contains("1024"), "{err}");
    still_serving(dvm, &hosts, "n01", "n02");
}

#[test]
fn a_tool_registered_for_job_end_hears_every_job_end_with_its_status() {
    let Some((mut dvm, hosts)) = Dvm::formed("events-jobend", Needs::AnyBackend, 2, 2) else {
        return;
    };
    let out = dvm.cluster.run_dir().join("end.out");
    let mut l = spawn_pevent(
        &dvm,
        "n02",
        &[
            "listen",
            "--handler",
            "name=end,codes=PMIX_EVENT_JOB_END",
            "--count",
            "1",
            "--timeout",
            "20",
        ],
        &out,
    );
    wait_for(&out, "\"ready\"");
    let (code, _, err) = prun(&dvm, &["-n", "2", "sh", "-c", "exit 3"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(wait_exit(&mut l, "the listener").success());
    let text = std::fs::read_to_string(&out).unwrap();
    let call = json_lines(&text)
        .into_iter()
        .find(|l| l.get("handler").is_some())
        .unwrap();
    assert_eq!(call["code"], -145, "{text}");
    let status = call["info"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["key"] == "pmix.job.term.status")
        .unwrap();
    assert_eq!(status["value"], 3 << 8, "{call}");
    dvm.stop_cleanly(&hosts);
}

/// The socket and namespace a job process on `host` is given.
fn job_env(dvm: &Dvm, host: &str) -> (String, String) {
    let (code, out, err) = prun(
        dvm,
        &[
            "--host",
            host,
            "sh",
            "-c",
            "echo $DVMLAB_EVENTS $DVMLAB_NSPACE",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let (socket, nspace) = out.trim().split_once(' ').unwrap();
    (socket.to_string(), nspace.to_string())
}

#[test]
fn a_process_that_says_it_is_a_job_process_it_is_not_is_refused() {
    let Some((mut dvm, hosts)) = Dvm::formed("events-liar", Needs::AnyBackend, 1, 2) else {
        return;
    };
    // A process of the owner on the node, not of any job, with a job's environment.
    let (socket, nspace) = job_env(&dvm, "n01");
    let argv: Vec<String> = [PEVENT, "listen", "--handler", "name=x", "--timeout", "5"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = dvm
        .cluster
        .command("n01", &argv)
        .unwrap()
        .env("DVMLAB_EVENTS", &socket)
        .env("DVMLAB_NSPACE", &nspace)
        .env("DVMLAB_PROC", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("is no job process of this node"), "{err}");
    // A job process that says it is another process of its job.
    let script = format!(
        "if [ $DVMLAB_PROC = 1 ]; then DVMLAB_PROC=0 exec {PEVENT} listen --handler name=x --timeout 5; fi"
    );
    let (code, out, err) = prun(&dvm, &["-n", "2", "--host", "n01", "sh", "-c", &script]);
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(
        err.contains(":0 but belongs to ") && err.contains(":1"),
        "{err}"
    );
    // A job process that joins another's process group first (setpgid, allowed within the
    // daemon's session) still is not that process.
    let pidfile = dvm.cluster.run_dir().join("rank1.pid");
    let script = format!(
        r#"
import os, sys, time
pidfile = {pidfile:?}
if os.environ["DVMLAB_PROC"] == "1":
    open(pidfile + ".tmp", "w").write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(30)
else:
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    other = int(open(pidfile).read())
    os.setpgid(0, other)
    os.environ["DVMLAB_PROC"] = "1"
    r = os.spawnv(os.P_WAIT, {PEVENT:?}, ["pevent", "listen", "--handler", "name=x", "--timeout", "5"])
    os.kill(other, 9)
    sys.exit(r)
"#,
        pidfile = pidfile.to_string_lossy(),
    );
    let (code, out, err) = prun(
        &dvm,
        &["-n", "2", "--host", "n01", "python3", "-c", &script],
    );
    assert!(
        err.contains("but is not that process or one it started"),
        "exit {code:?}: {out}{err}"
    );
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_job_process_sending_thousands_of_registrations_an_oversized_event_and_garbage_leaves_the_daemon_serving(
) {
    use dvmlab_proto::event::{Directives, EventUp, Info, Range};
    use dvmlab_proto::wire::{Frame, Hello, Peer};
    let Some((dvm, hosts)) = Dvm::formed("events-abuse", Needs::AnyBackend, 1, 2) else {
        return;
    };
    // Frames as JSON templates; the job process fills in who it is and frames them itself.
    let hello = serde_json::to_string(&Frame::Hello(Hello::new(
        "DVM",
        Peer::Process {
            nspace: "NSPACE".into(),
            rank: 0,
        },
    )))
    .unwrap();
    let register = serde_json::to_string(&Frame::Event(EventUp::Register {
        id: 0,
        codes: vec![-3001],
        directives: Directives::default(),
    }))
    .unwrap();
    let big = serde_json::to_string(&Frame::Event(EventUp::Notify {
        code: -3001,
        range: Range::Global,
        targets: vec![],
        info: vec![Info {
            key: "big".into(),
            value: "x".repeat(dvmlab_proto::event::MAX_EVENT_BYTES).into(),
        }],
    }))
    .unwrap();
    let script = dvm.cluster.run_dir().join("abuse.py");
    std::fs::write(
        &script,
        r#"
import json, os, socket, struct, sys
hello, register, big = (json.loads(open(sys.argv[i]).read()) for i in (1, 2, 3))
ns = os.environ["DVMLAB_NSPACE"]
def frame(o):
    b = json.dumps(o).encode()
    return struct.pack(">I", len(b)) + b
hello = frame(json.loads(json.dumps(hello).replace('"DVM"', json.dumps(ns.split("@")[0])).replace('"NSPACE"', json.dumps(ns))))
out = [hello]
for i in range(1, 1101):
    register["id"] = i
    out.append(frame(register))
out.append(frame(big))
out.append(struct.pack(">I", 10) + b"not json!!")
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(os.environ["DVMLAB_EVENTS"])
s.sendall(b"".join(out))
got = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
print(got.count(b'"op":"registered"'), got.count(b'"op":"refused"'), got.count(b'"op":"notify_refused"'), "closed")
"#,
    )
    .unwrap();
    let mut args = vec![script.to_string_lossy().into_owned()];
    for (name, t) in [("hello", &hello), ("register", &register), ("big", &big)] {
        let p = dvm.cluster.run_dir().join(format!("{name}.json"));
        std::fs::write(&p, t).unwrap();
        args.push(p.to_string_lossy().into_owned());
    }
    let mut argv = vec!["--host", "n01", "python3"];
    argv.extend(args.iter().map(String::as_str));
    // Twenty times over: what each abuser made the daemon hold goes with it.
    let rss_first = rss_kib(&dvm, "n01");
    let mut rss_after_first = 0;
    for round in 0..20 {
        let (code, out, err) = prun(&dvm, &argv);
        assert_eq!(code, Some(0), "{out}{err}\n{}", dvm.cluster.logs_tail(20));
        assert_eq!(
            out.trim(),
            "1024 76 1 closed",
            "registered, refused past the limit, the oversized event refused, then dropped for garbage"
        );
        if round == 0 {
            rss_after_first = rss_kib(&dvm, "n01");
        }
    }
    let rss_last = rss_kib(&dvm, "n01");
    assert!(
        rss_last < rss_after_first + 1024,
        "n01's daemon grew from {rss_first} KiB to {rss_after_first} KiB after one abuser and {rss_last} KiB after twenty"
    );
    still_serving(dvm, &hosts, "n01", "ctl");
}
