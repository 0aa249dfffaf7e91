//! End to end, on netns hosts: only holders of the DVM key get in. Hostile and genuine peers
//! are Python clients run inside a host's namespace; the genuine ones speak the channel with
//! the `noiseprotocol` package (an implementation of Noise written by others), from the wire
//! format in `runtime/README.md`, so the channel is shown to be standard Noise too.

mod common;

use std::time::Duration;

use common::*;
use dvmlab_harness::wait_until;

/// Frames, plain and sealed, and connections to the controller, for the scripts below.
/// argv: controller address, namespace, the key file.
const CLIENT: &str = r#"
import json, os, socket, struct, sys, time
from noise.connection import NoiseConnection
HOST, PORT, NSPACE, KEYFILE = sys.argv[1], 7817, sys.argv[2], sys.argv[3]
PATTERN = b"Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s"

def the_key():
    return bytes.fromhex(open(KEYFILE).read().strip())

def exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("closed after %d bytes" % len(b))
        b += c
    return b

def frame(obj):
    b = json.dumps(obj).encode()
    return struct.pack(">I", len(b)) + b

def closed_without_a_word(s, within=30):
    """True if the peer closes without sending a byte (waiting at most `within` s)."""
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True

out = []
def attempt(name, payload):
    """A new connection sends `payload`; what the controller did goes to `out`."""
    s = socket.create_connection((HOST, PORT), timeout=10)
    try:
        s.sendall(payload)
    except OSError:
        pass
    out.append("%s: %s" % (name, "closed" if closed_without_a_word(s) else "ANSWERED"))

class Sealed:
    """A connection through the key's channel; `sent` keeps every byte written."""
    def __init__(self, psk):
        self.s = socket.create_connection((HOST, PORT), timeout=10)
        self.sent = b""
        self.plain = b""
        n = NoiseConnection.from_name(PATTERN)
        n.set_psks(psk=psk)
        n.set_as_initiator()
        n.start_handshake()
        self.raw(self.msg(n.write_message()))
        second = exact(self.s, struct.unpack(">H", exact(self.s, 2))[0])
        n.read_message(second)
        self.n = n
    def msg(self, b):
        return struct.pack(">H", len(b)) + b
    def raw(self, b):
        self.sent += b
        self.s.sendall(b)
    def send(self, obj):
        f = frame(obj)
        for i in range(0, len(f), 65519):
            self.raw(self.msg(self.n.encrypt(f[i:i + 65519])))
    def recv(self):
        while True:
            if len(self.plain) >= 4:
                n = struct.unpack(">I", self.plain[:4])[0]
                if len(self.plain) >= 4 + n:
                    body, self.plain = self.plain[4:4 + n], self.plain[4 + n:]
                    return json.loads(body)
            rec = exact(self.s, struct.unpack(">H", exact(self.s, 2))[0])
            self.plain += self.n.decrypt(rec)

def hello(c, peer={"kind": "tool"}):
    c.send({"t": "hello", "magic": "dvmlab", "version": 2, "min_version": 1,
            "nspace": NSPACE, "peer": peer})
    return c.recv()
"#;

/// `python3` running `script` after [`CLIENT`] on `host`, pointed at the controller.
fn run_client(dvm: &Dvm, host: &str, script: &str) -> (bool, String, String) {
    let ctl = dvm.cluster.host(&dvm.ctl).unwrap().v4.unwrap().to_string();
    let nspace = dvm.status().unwrap().namespace;
    let key = dvm.cluster.key_path(host).unwrap();
    let code = format!("{CLIENT}\n{script}");
    let argv = [
        "python3",
        "-c",
        &code,
        &ctl,
        &nspace,
        &key.to_string_lossy(),
    ]
    .map(String::from);
    let (st, out, err) = dvm
        .cluster
        .exec_within(host, &argv, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("python3: {e}"));
    (st.is_some_and(|s| s.success()), out, err)
}

/// The job list's length, and that the DVM is formed with exactly its own members.
fn jobs_and_members(dvm: &Dvm, hosts: &[String]) -> usize {
    let s = dvm.status().unwrap();
    assert!(s.formed && s.authenticated, "{s:?}");
    let members: Vec<&str> = s.members.iter().map(|m| m.host.as_str()).collect();
    assert_eq!(members, hosts, "no stranger became a member");
    jobs(dvm).len()
}

#[test]
fn without_the_key_no_client_joins_submits_pings_or_stops_and_a_replay_gets_nothing() {
    let Some((mut dvm, hosts)) = Dvm::formed("sec-strangers", Needs::Netns, 2, 2) else {
        return;
    };
    let before = jobs_and_members(&dvm, &hosts);
    // Each stranger tries what a tool or a daemon would, in the clear or with a wrong key;
    // the controller must close every one without a word. Then a genuine key holder runs a
    // job and pings rank 2 while every byte it sends is recorded, and the recording is
    // replayed on a new connection: the replayer gets the handshake's second message (the
    // controller cannot tell a replay from a first message) and nothing after it.
    let script = r#"
plain_hello = frame({"t": "hello", "magic": "dvmlab", "version": 2, "min_version": 1,
                     "nspace": NSPACE, "peer": {"kind": "tool"}})
attempt("plain tool submit", plain_hello + frame({"t": "tool", "req": "submit", "job": {
    "argv": ["/bin/true"], "env": [], "cwd": None, "nprocs": 1, "map_by": "node",
    "hosts": None, "time_limit_ms": None, "userid": 0}}))
attempt("plain tool stop", plain_hello + frame({"t": "tool", "req": "stop"}))
attempt("plain tool ping", plain_hello + frame({"t": "tool", "req": "ping", "rank": 2}))
attempt("plain daemon join", frame({"t": "hello", "magic": "dvmlab", "version": 2,
    "min_version": 1, "nspace": NSPACE, "peer": {"kind": "daemon", "rank": 2, "host": "n02"}}))
try:
    Sealed(os.urandom(32))
    out.append("wrong key: HANDSHAKE PASSED")
except EOFError:
    out.append("wrong key: closed")

c = Sealed(the_key())
assert hello(c)["t"] == "welcome"
c.send({"t": "tool", "req": "ping", "rank": 2})
r = c.recv()
assert r["reply"] == "ping" and r["ok"], r
c.send({"t": "tool", "req": "submit", "job": {"argv": ["/bin/true"], "env": [], "cwd": None,
    "nprocs": 1, "map_by": "node", "hosts": None, "time_limit_ms": None, "userid": 0}})
while c.recv()["reply"] != "job_ended":
    pass
out.append("genuine: ran a job and pinged rank 2")
recording = c.sent
c.s.close()

s = socket.create_connection((HOST, PORT), timeout=10)
s.sendall(recording)
second = exact(s, struct.unpack(">H", exact(s, 2))[0])
out.append("replay: second message of %d bytes, then %s" % (
    len(second), "closed" if closed_without_a_word(s) else "ANSWERED"))
print("\n".join(out))
"#;
    let (ok, out, err) = run_client(&dvm, "n01", script);
    assert!(ok, "{out}\n{err}\n{}", dvm.cluster.logs_tail(30));
    assert_eq!(
        out,
        "plain tool submit: closed\nplain tool stop: closed\nplain tool ping: closed\n\
         plain daemon join: closed\nwrong key: closed\ngenuine: ran a job and pinged rank 2\n\
         replay: second message of 48 bytes, then closed\n",
        "{}",
        dvm.cluster.logs_tail(30)
    );
    // Only the genuine job ran; the DVM kept its members and serves the owner's tools.
    assert_eq!(jobs_and_members(&dvm, &hosts), before + 1);
    let (code, out, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    // Every refusal is in the controller's log with the stranger's address.
    let n01 = dvm.cluster.host("n01").unwrap().v4.unwrap().to_string();
    let log = dvm.cluster.log("ctl");
    let refused = log
        .lines()
        .filter(|l| l.contains(&format!("{n01}:")) && l.contains("refused before any frame"))
        .count();
    assert!(refused >= 5, "{refused} refusals logged with {n01}:\n{log}");
    assert!(
        log.contains("does not hold the DVM key"),
        "the wrong key is named:\n{log}"
    );
    dvm.stop_cleanly(&hosts);
}

/// Runs `argv` on `host`; (exit code, stdout, stderr).
fn on(dvm: &Dvm, host: &str, argv: &[&str]) -> (Option<i32>, String, String) {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let (st, out, err) = dvm
        .cluster
        .exec_within(host, &argv, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{argv:?} on {host}: {e}"));
    (st.and_then(|s| s.code()), out, err)
}

#[test]
fn the_owners_tools_work_from_every_node_through_its_daemon_and_another_users_are_refused() {
    let Some(b) = backend("sec-tools", Needs::Netns) else {
        return;
    };
    // The DVM's nodes, and one more host that is none of them.
    let (_, hosts) = ctl_and_nodes(3);
    let mut all = hosts.clone();
    all.push("out".into());
    let mut dvm = Dvm::new(
        "sec-tools",
        b,
        dvmlab_harness::IpMode::V4,
        &all,
        &conf_for(3).set("DVMRadix", 2),
    );
    for h in &hosts {
        dvm.cluster.start(h).unwrap();
    }
    dvm.wait_formed(Duration::from_secs(10));
    for h in &hosts {
        // Status, ping and a job with output and stdin, from every node: through that
        // node's daemon (its tools socket), relayed up the tree to the controller.
        let (code, out, err) = on(&dvm, h, &[PCTL, "status", "--json"]);
        assert_eq!(code, Some(0), "{h}: {err}");
        assert!(out.contains("\"authenticated\":true"), "{h}: {out}");
        let (code, out, err) = on(&dvm, h, &[PCTL, "ping", "--all"]);
        assert_eq!(code, Some(0), "{h}: {out}{err}");
        let (code, out, err) = on(
            &dvm,
            h,
            &["sh", "-c", &format!("echo fed-{h} | {PRUN} -n 1 cat")],
        );
        assert_eq!(
            (code, out.as_str()),
            (Some(0), format!("fed-{h}\n").as_str()),
            "{h}: {err}"
        );
        // Another user of the same node is turned away by the daemon, with the reason.
        let (code, out, err) = on(
            &dvm,
            h,
            &[
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                PCTL,
                "status",
            ],
        );
        assert_eq!(code, Some(3), "{h}: {out}{err}");
        assert!(
            err.contains("refused: uid 65534 may not use this DVM: it belongs to uid 0"),
            "{h}: {err}"
        );
    }
    for h in &hosts {
        let log = dvm.cluster.log(h);
        assert!(
            log.contains("local tool of uid 65534") && log.contains("refused before any frame"),
            "{h} logs the refusal:\n{log}"
        );
    }
    // Off the DVM's nodes a tool talks to the controller over TCP, with the key.
    let (code, out, err) = on(&dvm, "out", &[PCTL, "status", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"formed\":true"), "{out}");
    // Told of no key, it is dropped, and says why.
    let (code, out, err) = on(
        &dvm,
        "out",
        &["env", "-u", KEY_ENV, PCTL, "status", "--timeout", "5"],
    );
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(
        err.contains("the DVM may require its key, and this tool has none"),
        "{err}"
    );
    // A tool with another key fails the handshake.
    let other = dvm.cluster.run_dir().join("other.key");
    let (ok, _, err) = dvm.pctl(&["keygen", &other.to_string_lossy()]);
    assert!(ok, "{err}");
    let (code, _, err) = on(
        &dvm,
        "out",
        &[
            "env",
            &format!("{KEY_ENV}={}", other.display()),
            PRUN,
            "/bin/true",
        ],
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("closed during the key handshake"), "{err}");
    assert!(
        dvm.cluster.log("ctl").contains("does not hold the DVM key"),
        "{}",
        dvm.cluster.log("ctl")
    );
    // The DVM stops from a node other than the controller's.
    let (code, out, err) = on(&dvm, "n03", &[PCTL, "stop"]);
    assert_eq!(code, Some(0), "{out}{err}");
    for h in &hosts {
        let st = dvm
            .cluster
            .wait_exit(h, Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("{h}: {e}"));
        assert!(st.success(), "{h}: {st}");
    }
}

#[test]
fn garbage_oversized_truncated_and_a_thousand_idle_connections_leave_a_daemon_serving_in_bounded_memory(
) {
    let Some((mut dvm, hosts)) = Dvm::formed("sec-junk", Needs::Netns, 2, 2) else {
        return;
    };
    // A job runs through it all and must end well.
    let marker = dvm.cluster.run_dir().join("long-job.out");
    let mut long = spawn_prun(
        &dvm,
        &["--np", "1", "sh", "-c", "sleep 4; echo survived"],
        &marker,
    );
    let rss_before = rss_kib(&dvm, &dvm.ctl);
    let script = r#"
import random
random.seed(7)
attempt("garbage", bytes(random.getrandbits(8) for _ in range(65536)))
attempt("oversized length", b"\xff\xff" + b"x" * 1000)
attempt("4-byte frame length", struct.pack(">I", 1 << 30) + b"{")
attempt("truncated handshake", b"\x00\x30" + os.urandom(20))
c = Sealed(the_key())
c.raw(c.msg(c.n.encrypt(struct.pack(">I", 5000)))[:30])
out.append("truncated frame: %s" % ("closed" if closed_without_a_word(c.s) else "ANSWERED"))
idle = [socket.create_connection((HOST, PORT), timeout=10) for _ in range(1000)]
gone = sum(1 for s in idle if closed_without_a_word(s, 120))
out.append("idle: %d of 1000 dropped" % gone)
print("\n".join(out))
"#;
    let (ok, out, err) = run_client(&dvm, "n01", script);
    assert!(ok, "{out}\n{err}\n{}", dvm.cluster.logs_tail(30));
    assert_eq!(
        out,
        "garbage: closed\noversized length: closed\n4-byte frame length: closed\n\
         truncated handshake: closed\ntruncated frame: closed\nidle: 1000 of 1000 dropped\n"
    );
    let st = long.wait().unwrap();
    assert!(st.success(), "the job running meanwhile: {st}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "survived\n");
    // At most 64 handshakes are pending at once and none holds more than a handshake
    // message, so a thousand strangers cost the daemon little.
    let rss_after = rss_kib(&dvm, &dvm.ctl);
    assert!(
        rss_after < rss_before + 32 * 1024,
        "controller RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        let s = dvm.status()?;
        s.formed.then_some(()).ok_or(format!("{s:?}"))
    })
    .unwrap();
    let (code, _, err) = prun(&dvm, &["hostname"]);
    assert_eq!(code, Some(0), "{err}");
    dvm.stop_cleanly(&hosts);
}

#[test]
fn a_session_directory_another_user_could_change_stops_the_daemon_and_a_socket_another_user_serves_is_not_used(
) {
    let Some(b) = backend("sec-sessiondir", Needs::Netns) else {
        return;
    };
    let (_, hosts) = ctl_and_nodes(2);
    let mut dvm = Dvm::new(
        "sec-sessiondir",
        b,
        dvmlab_harness::IpMode::V4,
        &hosts,
        &conf_for(2),
    );
    for h in ["ctl", "n01"] {
        dvm.cluster.start(h).unwrap();
    }
    // Another user got to n02's session directory first.
    let nspace = dvm
        .wait_status(Duration::from_secs(10), "up", |_| true)
        .namespace;
    let dvm_dir = dvm.cluster.tmp_dir("n02").join(format!("dvmlab.{nspace}"));
    std::fs::create_dir_all(dvm_dir.join("2")).unwrap();
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    for d in [dvm_dir.clone(), dvm_dir.join("2")] {
        nix::unistd::chown(&d, nobody, None).unwrap();
    }
    dvm.cluster.start("n02").unwrap();
    let st = dvm
        .cluster
        .wait_exit("n02", Duration::from_secs(10))
        .unwrap();
    assert!(!st.success(), "n02 ran in a directory another user owns");
    let log = dvm.cluster.log("n02");
    assert!(
        log.contains("owned by uid 65534")
            && log.contains("refusing to keep the daemon's session there"),
        "{log}"
    );
    // That user serves a socket where n02's tools look for their daemon: the owner's tool
    // will not talk to it.
    let socket = dvm_dir.join("2").join("tools.sock");
    let listen = format!(
        "import socket, time; s = socket.socket(socket.AF_UNIX); s.bind({:?}); s.listen(); time.sleep(60)",
        socket.to_string_lossy()
    );
    let argv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        // The system's Python: another user may not run one installed under root's home.
        "/usr/bin/python3",
        "-c",
        &listen,
    ]
    .map(String::from);
    let mut impostor = dvm.cluster.command("n02", &argv).unwrap().spawn().unwrap();
    // Listening, not only bound: a socket file that refuses connections sends the tool on
    // to the controller, and the test would prove nothing.
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        std::os::unix::net::UnixStream::connect(&socket)
            .map(drop)
            .map_err(|e| format!("{}: {e}", socket.display()))
    })
    .unwrap();
    let (code, out, err) = on(&dvm, "n02", &[PCTL, "status"]);
    let _ = impostor.kill();
    let _ = impostor.wait();
    assert_eq!(code, Some(3), "{out}{err}");
    assert!(err.contains("is served by uid 65534"), "{err}");
    dvm.stop_cleanly(&hosts[..2]);
}
