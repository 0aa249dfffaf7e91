//! End to end, on netns hosts: peers that speak another protocol version, and a peer that
//! never reads, against a real controller. The peers are small Python clients run inside a
//! host's namespace, written from the wire format in `runtime/README.md`, not from our code.
//! These DVMs have no key, so frames travel in the clear, as the bootstrap spec has them
//! (the same peers with the key's channel are in `security.rs`).

mod common;

use std::time::Duration;

use common::*;
use dvmlab_harness::wait_until;

/// Frames and a connection to the controller, for the scripts below.
const CLIENT: &str = r#"
import json, socket, struct, sys
HOST, PORT, NSPACE = sys.argv[1], 7817, sys.argv[2]
def connect():
    s = socket.create_connection((HOST, PORT), timeout=10)
    return s
def send(s, obj):
    b = json.dumps(obj).encode()
    s.sendall(struct.pack(">I", len(b)) + b)
def recv(s):
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            raise EOFError("closed")
        head += chunk
    n = struct.unpack(">I", head)[0]
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            raise EOFError("closed")
        body += chunk
    return json.loads(body)
def hello(s, version, min_version=None):
    h = {"t": "hello", "magic": "dvmlab", "version": version, "nspace": NSPACE,
         "peer": {"kind": "tool"}}
    if min_version is not None:
        h["min_version"] = min_version
    send(s, h)
    return recv(s)
"#;

/// `python3` running `script` after [`CLIENT`], pointed at the controller.
fn client_argv(dvm: &Dvm, script: &str) -> Vec<String> {
    let ctl = dvm.cluster.host(&dvm.ctl).unwrap().v4.unwrap().to_string();
    let nspace = dvm.status().unwrap().namespace;
    let code = format!("{CLIENT}\n{script}");
    ["python3", "-c", &code, &ctl, &nspace]
        .map(String::from)
        .to_vec()
}

fn run_client(dvm: &Dvm, host: &str, script: &str) -> (bool, String, String) {
    let argv = client_argv(dvm, script);
    let (st, out, err) = dvm
        .cluster
        .exec_within(host, &argv, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("python3: {e}"));
    (st.is_some_and(|s| s.success()), out, err)
}

#[test]
fn peers_of_an_older_or_newer_protocol_version_are_answered_in_the_newest_both_speak() {
    let Some((mut dvm, hosts)) = Dvm::formed_keyless("wire-versions", Needs::Netns, 3, 2) else {
        return;
    };
    let script = r#"
s = connect()
w = hello(s, 1)
assert w["t"] == "welcome" and w["version"] == 1, w
send(s, {"t": "tool", "req": "status"})
r = recv(s)
assert r["reply"] == "status" and r["formed"], r
print("v1 ok")
s = connect()
w = hello(s, 9, 2)
assert w["t"] == "welcome" and w["version"] == 7, w
send(s, {"t": "tool", "req": "teleport", "hosts": ["x"]})
r = recv(s)
assert r["reply"] == "error" and "does not know that request" in r["message"], r
send(s, {"t": "tool", "req": "status"})
r = recv(s)
assert r["reply"] == "status", r
print("v9 ok")
s = connect()
w = hello(s, 9, 8)
assert w["t"] == "refuse" and "not supported" in w["reason"], w
print("v8-9 refused")
"#;
    let (ok, out, err) = run_client(&dvm, "n01", script);
    assert!(ok, "{out}\n{err}\n{}", dvm.cluster.logs_tail(20));
    assert_eq!(out, "v1 ok\nv9 ok\nv8-9 refused\n");
    // Without a key the DVM forms as the spec has it, and says loudly that it is open.
    assert!(!dvm.status().unwrap().authenticated);
    for h in &hosts {
        assert!(
            dvm.cluster.log(h).contains("the DVM is UNAUTHENTICATED"),
            "{h}"
        );
    }
    let (_, table, _) = dvm.pctl(&["status"]);
    assert!(table.contains("links      UNAUTHENTICATED"), "{table}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_tool_that_never_reads_its_replies_is_dropped_and_the_dvm_serves_others_meanwhile() {
    let Some((mut dvm, hosts)) = Dvm::formed_keyless("wire-noread", Needs::Netns, 3, 2) else {
        return;
    };
    // Asks for the status over and over and never reads an answer: its replies pile up in
    // the controller until the link's queue limit, and then it is dropped.
    let script = r#"
s = connect()
hello(s, 2, 1)
req = json.dumps({"t": "tool", "req": "status"}).encode()
frame = struct.pack(">I", len(req)) + req
sent = 0
try:
    for _ in range(2000000):
        s.sendall(frame * 64)
        sent += 64
except OSError as e:
    print("dropped after", sent, "requests:", type(e).__name__)
    sys.exit(0)
print("never dropped after", sent)
sys.exit(1)
"#;
    let (ok, out, err) = run_client(&dvm, "n01", script);
    assert!(ok, "{out}\n{err}\n{}", dvm.cluster.logs_tail(20));
    let log = dvm.cluster.log("ctl");
    assert!(
        log.contains("cannot send: the peer leaves") && log.contains("dropping the link"),
        "{log}"
    );
    // The DVM stayed formed and answers the next tool.
    wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        dvm.status().and_then(|s| {
            if s.formed {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        })
    })
    .unwrap();
    let (code, out, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn connections_past_the_limit_are_closed_at_once_and_the_dvm_works_once_they_go() {
    let Some((mut dvm, hosts)) = Dvm::formed_keyless("wire-flood", Needs::Netns, 2, 2) else {
        return;
    };
    // 4200 tools that say hello and then sit idle: the controller holds 4096 connections at
    // most (its two daemon children among them), and closes the others at once.
    let script = r#"
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (16384, 16384))
held, closed = [], 0
for i in range(4200):
    s = connect()
    try:
        w = hello(s, 2, 1)
        held.append(s)
    except (EOFError, OSError):
        closed += 1
        s.close()
print(len(held), closed)
"#;
    let (ok, out, err) = run_client(&dvm, "n01", script);
    assert!(ok, "{out}\n{err}\n{}", dvm.cluster.logs_tail(20));
    let counts: Vec<usize> = out.split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(counts.len(), 2, "{out}");
    assert_eq!(
        counts[0] + 2,
        4096,
        "held {} beside the two daemon links",
        counts[0]
    );
    assert_eq!(counts[1], 4200 - counts[0], "{out}");
    let log = dvm.cluster.log("ctl");
    assert!(
        log.contains("4096 connections already open; closed"),
        "{log}"
    );
    // The flood's connections ended with its process; the DVM is formed and runs jobs.
    let (code, out, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(dvm.status().unwrap().formed);
    dvm.stop_cleanly(&hosts);
}

#[test]
fn connections_that_never_say_hello_are_dropped_and_a_restarted_daemon_rejoins_meanwhile() {
    // With the key, as a DVM should run: the idle ones never finish their key handshake.
    let Some((mut dvm, hosts)) = Dvm::formed("wire-idle", Needs::Netns, 3, 2) else {
        return;
    };
    // 150 connections that never say a word: at most 64 wait in their key handshake at once,
    // each for the hello window; the rest wait in the kernel's backlog.
    let script = r#"
import time
held = [connect() for _ in range(150)]
print("opened", len(held))
sys.stdout.flush()
time.sleep(15)
"#;
    let argv = client_argv(&dvm, script);
    let mut idle = dvm
        .cluster
        .command("n01", &argv)
        .unwrap()
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(idle.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert_eq!(first.trim(), "opened 150");
    // Meanwhile a daemon dies and comes back: it gets in once the idle ones are dropped.
    dvm.cluster.kill("n03").unwrap();
    dvm.cluster.start("n03").unwrap();
    wait_until(Duration::from_secs(40), Duration::from_millis(100), || {
        let log = dvm.cluster.log("ctl");
        let dropped = log.matches("no key handshake within").count();
        let s = dvm.status()?;
        if dropped >= 150 && s.formed {
            Ok(())
        } else {
            Err(format!(
                "{dropped} idle connections dropped; formed {}",
                s.formed
            ))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", dvm.cluster.logs_tail(20)));
    let _ = idle.kill();
    let _ = idle.wait();
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_tool_whose_socket_takes_no_bytes_for_the_stall_time_is_dropped_and_its_job_runs_on() {
    let Some((mut dvm, hosts)) = Dvm::formed_keyless("wire-stall", Needs::Netns, 3, 2) else {
        return;
    };
    // Submits a job writing 8 MB (less than a link's queue limit, more than the socket
    // buffers) and never reads: the controller's writes stop going through, and after the
    // stall time the link is dropped, not left to hold the output forever.
    let script = r#"
import time
s = connect()
hello(s, 2, 1)
send(s, {"t": "tool", "req": "submit", "job": {"argv": ["sh", "-c", "head -c 8000000 /dev/zero; echo; exec sleep 60"],
  "env": [], "cwd": None, "nprocs": 1, "map_by": "node", "hosts": None, "time_limit_ms": None, "userid": 0}})
time.sleep(14)
print("slept")
"#;
    let argv = client_argv(&dvm, script);
    let mut tool = dvm.cluster.command("n01", &argv).unwrap();
    let mut tool = tool
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
        let log = dvm.cluster.log("ctl");
        if log.contains("no write went through for 10s; dropping the link") {
            Ok(())
        } else {
            Err(dvm.cluster.logs_tail(10))
        }
    })
    .unwrap();
    let j = jobs(&dvm);
    assert!(
        j.iter().any(|j| j.state == "RUNNING"),
        "the job runs on without its tool: {j:?}"
    );
    let s = dvm.status().unwrap();
    assert!(s.formed, "{s:?}");
    let (code, out, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let _ = tool.kill();
    let _ = tool.wait();
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_tool_sending_stdin_past_its_window_fails_only_its_own_job() {
    let Some((mut dvm, hosts)) = Dvm::formed_keyless("wire-stdin", Needs::Netns, 3, 2) else {
        return;
    };
    // Sends 1 MiB of stdin at once, ignoring the 256 KiB window, to a process that does not
    // read yet: the daemon's queue for it overruns and the job fails with a fatal exception.
    let script = r#"
import base64
s = connect()
hello(s, 2, 1)
send(s, {"t": "tool", "req": "submit", "job": {"argv": ["sh", "-c", "sleep 2; cat >/dev/null"],
  "env": [], "cwd": None, "nprocs": 1, "map_by": "node", "hosts": None, "time_limit_ms": None,
  "userid": 0, "stdin": True}})
r = recv(s)
assert r["reply"] == "submitted", r
chunk = base64.b64encode(bytes(65536)).decode()
for _ in range(16):
    send(s, {"t": "tool", "req": "stdin", "id": r["id"], "data": chunk, "eof": False})
while True:
    r = recv(s)
    if r["reply"] == "job_ended":
        print(r["exception"])
        break
"#;
    let (ok, out, err) = run_client(&dvm, "n01", script);
    assert!(ok, "{out}\n{err}\n{}", dvm.cluster.logs_tail(20));
    assert!(out.contains("stdin overrun"), "{out}");
    let s = dvm.status().unwrap();
    assert!(s.formed, "{s:?}");
    let (code, out, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    dvm.stop_cleanly(&hosts);
}
