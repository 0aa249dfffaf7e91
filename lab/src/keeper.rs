//! The lab's keeper: a process, started by `lab up` and detached from it, that owns the
//! lab's cluster (the harness's docker or netns backend, with its faults and partitions) for
//! its lifetime and answers every other `lab` command over a unix socket: one JSON request
//! line, one JSON reply line. A command to run on a host travels with the client's stdin,
//! stdout and stderr (SCM_RIGHTS), so its output and exit status are the client's own.
//!
//! The harness names everything it makes after the keeper's pid, so a keeper that dies
//! leaves nothing `dvmlab-harness gc` cannot find.

use std::io::{BufRead, BufReader, IoSlice, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dvmlab_harness::{BackendKind, Cluster, ClusterSpec, Direction, IpMode};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde_json::{json, Value};

use crate::plan::{IpVersion, Plan, CONTROLLER, PREFIX};

/// What every command says when there is no keeper to ask.
pub const NO_LAB: &str = "no lab is up (`lab up` or `make lab`)";

/// Where the keeper's socket and log live: `DVMLAB_LAB_DIR`, else `dvmlab-lab` in the
/// temporary directory. One lab per directory, so labs side by side need one each.
pub fn dir() -> PathBuf {
    std::env::var_os("DVMLAB_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(PREFIX))
}

fn socket_path() -> PathBuf {
    dir().join("keeper.sock")
}

/// A connection to the keeper of the lab that is up.
pub struct Keeper {
    stream: UnixStream,
}

impl Keeper {
    /// The keeper of the lab that is up, if one answers.
    pub fn find() -> Option<Keeper> {
        UnixStream::connect(socket_path())
            .ok()
            .map(|stream| Keeper { stream })
    }

    /// Sends `req` (with `fds`, if any) and waits for the reply; an `error` in it becomes
    /// the error.
    pub fn ask(mut self, req: &Value, fds: &[RawFd]) -> Result<Value, String> {
        let line = format!("{req}\n");
        let iov = [IoSlice::new(line.as_bytes())];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        sendmsg::<()>(
            self.stream.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("talking to the lab's keeper: {e}"))?;
        let mut reply = String::new();
        BufReader::new(&mut self.stream)
            .read_line(&mut reply)
            .map_err(|e| format!("the lab's keeper: {e}"))?;
        let v: Value = serde_json::from_str(&reply)
            .map_err(|e| format!("the lab's keeper answered {reply:?}: {e}"))?;
        match v["error"].as_str() {
            Some(e) => Err(e.to_string()),
            None => Ok(v),
        }
    }

    /// Runs `argv` on `host` with this process's stdin, stdout and stderr; its exit code.
    pub fn exec(self, host: &str, argv: &[String]) -> Result<i64, String> {
        let v = self.ask(
            &json!({"op": "exec", "host": host, "argv": argv}),
            &[0, 1, 2],
        )?;
        v["code"]
            .as_i64()
            .ok_or_else(|| format!("the lab's keeper gave no exit code: {v}"))
    }
}

/// Runs `argv` on `host` of the lab that is up; (exit code, stdout, stderr).
pub fn output(host: &str, argv: &[String]) -> Result<(i64, String, String), String> {
    let k = Keeper::find().ok_or(NO_LAB)?;
    let tmp = |what: &str| {
        let p = dir().join(format!("{what}-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        let _ = std::fs::remove_file(&p);
        Ok::<_, String>(f)
    };
    let (null, out, err) = (
        std::fs::File::open("/dev/null").map_err(|e| e.to_string())?,
        tmp("out")?,
        tmp("err")?,
    );
    let v = k.ask(
        &json!({"op": "exec", "host": host, "argv": argv}),
        &[null.as_raw_fd(), out.as_raw_fd(), err.as_raw_fd()],
    )?;
    let code = v["code"].as_i64().unwrap_or(1);
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut s = String::new();
        let _ = f.rewind();
        let _ = f.read_to_string(&mut s);
        s
    };
    Ok((code, read(out), read(err)))
}

/// Asks the keeper of the lab that is up; an error when none is.
pub fn ask(req: Value) -> Result<Value, String> {
    Keeper::find().ok_or(NO_LAB)?.ask(&req, &[])
}

/// Starts a keeper for `plan` in the background and returns once it serves (the daemons
/// are started then; the DVM may still be forming).
pub fn spawn_keeper(
    plan: &Plan,
    hold: &[String],
    bin_dir: &Path,
    backend: BackendKind,
) -> Result<(), String> {
    let d = dir();
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    let log = d.join("keeper.log");
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("finding the lab program: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["keep", "--nodes", &plan.nodes.to_string()])
        .args(["--spares", &plan.spares.to_string()])
        .args(["--radix", &plan.radix.to_string()])
        .args(["--ip", &plan.ip.number().to_string()])
        .args(["--backend", backend_name(backend)])
        .arg("--bin-dir")
        .arg(bin_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(file);
    if !hold.is_empty() {
        cmd.args(["--hold", &hold.join(",")]);
    }
    // Its own session: the keeper outlives this command and the terminal's signals.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the lab's keeper: {e}"))?;
    let mut first = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut first);
    }
    if first.trim() == "serving" {
        return Ok(());
    }
    let _ = child.wait();
    Err(format!(
        "the lab's keeper did not start: {}",
        std::fs::read_to_string(&log).unwrap_or_default().trim()
    ))
}

/// The keeper: builds the cluster (spares created, not started), writes its launch agent,
/// starts every daemon not held, says `serving` on stdout, and serves requests until `down`.
pub fn keep(
    plan: &Plan,
    hold: &[String],
    bin_dir: &Path,
    backend: BackendKind,
) -> Result<(), String> {
    let hosts: Vec<String> = plan.all_hosts().into_iter().map(|h| h.name).collect();
    for h in hold {
        plan.host(h)?;
        if plan.is_spare(h) {
            return Err(format!(
                "--hold {h}: a spare is never started by the lab (`lab grow` adds it)"
            ));
        }
    }
    let prted = bin_dir.join("prted");
    if !prted.exists() {
        return Err(format!(
            "{} not found (build the runtime: cargo build --release -p dvmlab-runtime)",
            prted.display()
        ));
    }
    let mut spec = ClusterSpec::new(
        "lab",
        &hosts,
        vec![prted.display().to_string(), "--bootstrap".into()],
    );
    spec.backend = backend;
    spec.ip = IpMode::Dual;
    // The harness makes the cluster's DVM key at /etc/dvm.key on every host, where the lab's
    // prte.conf says it is.
    spec.env = vec![("DVMLAB_LOG".into(), "info".into())];
    let mut cluster = Cluster::new(spec)?;
    let subnet = cluster
        .subnet(false, plan.ip == IpVersion::V6)
        .ok_or("the lab's cluster has no subnet")?;
    let conf = plan.conf_text(
        &format!("lab up (on {})", backend_name(backend)),
        &plan.dvm_nodes(),
        CONTROLLER,
        Some(&subnet),
        crate::plan::KEY_PATH,
    );
    cluster
        .set_conf(&conf)
        .map_err(|e| format!("writing prte.conf: {e}"))?;
    // The DVM is elastic, its controller launching daemons on spares through the cluster's
    // agent (this program's `agent`), and says when a job waits for a campaign.
    let me = std::env::current_exe().map_err(|e| format!("finding the lab program: {e}"))?;
    let agent = cluster.write_agent(&me)?;
    let mut daemon = cluster.daemon().to_vec();
    for (k, v) in [
        ("prte_elastic_mode", "1".to_string()),
        ("plm_ssh_agent", agent.display().to_string()),
        ("state_base_verbose", "1".to_string()),
    ] {
        daemon.extend(["--prtemca".to_string(), k.to_string(), v]);
    }
    cluster.set_daemon(daemon);
    let to_start: Vec<String> = plan
        .hosts()
        .into_iter()
        .map(|h| h.name)
        .filter(|h| !hold.contains(h))
        .collect();
    cluster.start_many(&to_start)?;
    let _ = std::fs::remove_file(socket_path());
    let listener = UnixListener::bind(socket_path())
        .map_err(|e| format!("{}: {e}", socket_path().display()))?;
    println!("serving");
    let _ = std::io::stdout().flush();
    let bin = Arc::new(bin_dir.to_path_buf());
    let run = cluster.run_name().to_string();
    let cluster = Arc::new(Mutex::new(Some(cluster)));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if serve(conn, &cluster, &bin, backend, &run, plan) {
            break;
        }
    }
    let _ = std::fs::remove_file(socket_path());
    // Torn down here, whatever command threads still hold a handle.
    if let Ok(mut c) = cluster.lock() {
        c.take();
    }
    Ok(())
}

/// The keeper's cluster, shared with the threads running commands; `None` once torn down.
type Shared = Arc<Mutex<Option<Cluster>>>;

fn with_cluster<T>(
    cluster: &Shared,
    f: impl FnOnce(&mut Cluster) -> Result<T, String>,
) -> Result<T, String> {
    let mut guard = cluster
        .lock()
        .map_err(|_| "the keeper's cluster is poisoned".to_string())?;
    f(guard.as_mut().ok_or("the lab is going down")?)
}

/// Reads one request from `conn` and answers it (a command to run, in a thread of its own,
/// since a job may take long); true for `down`.
fn serve(
    conn: UnixStream,
    cluster: &Shared,
    bin: &Arc<PathBuf>,
    backend: BackendKind,
    run: &str,
    plan: &Plan,
) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    let mut space = nix::cmsg_space!([RawFd; 3]);
    let (req, fds) = {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        // Close-on-exec: a command started meanwhile for another client must not inherit
        // this client's descriptors (its pipes would stay open until that command ends).
        let msg = match recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(_) => return false,
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(v) = c {
                    // SAFETY: the kernel just installed these descriptors for us.
                    fds.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        let n = msg.bytes;
        (serde_json::from_slice::<Value>(&buf[..n]), fds)
    };
    let reply = |conn: &UnixStream, v: Value| {
        let _ = writeln!(&mut &*conn, "{v}");
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => {
            reply(&conn, json!({"error": format!("bad request: {e}")}));
            return false;
        }
    };
    let op = req["op"].as_str().unwrap_or_default().to_string();
    if op == "exec" {
        let (cluster, bin) = (cluster.clone(), bin.clone());
        std::thread::spawn(move || {
            let v = match exec(&cluster, &bin, &req, fds) {
                Ok(code) => json!({ "code": code }),
                Err(e) => json!({ "error": e }),
            };
            reply(&conn, v);
        });
        return false;
    }
    if op == "about" {
        reply(
            &conn,
            json!({
                "backend": backend_name(backend),
                "run": run,
                "pid": std::process::id(),
            }),
        );
        return false;
    }
    match with_cluster(cluster, |c| act(c, plan, &op, &req)) {
        Ok(v) => reply(&conn, v),
        Err(e) => reply(&conn, json!({ "error": e })),
    }
    op == "down"
}

/// Runs a command on a host with the client's descriptors; its exit code (128 + signal).
fn exec(cluster: &Shared, bin: &Path, req: &Value, fds: Vec<OwnedFd>) -> Result<i64, String> {
    let host = req["host"].as_str().ok_or("exec: no host")?;
    let mut argv: Vec<String> = req["argv"]
        .as_array()
        .ok_or("exec: no argv")?
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    // The runtime's tools are where the keeper's prted is.
    if let Some(first) = argv.first_mut() {
        if ["pctl", "prun", "prted", "palloc"].contains(&first.as_str()) {
            *first = bin.join(&*first).display().to_string();
        }
    }
    let [i, o, e]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| "exec: expected stdin, stdout and stderr".to_string())?;
    let mut cmd = with_cluster(cluster, |c| c.command(host, &argv))?;
    let status = cmd
        .stdin(Stdio::from(i))
        .stdout(Stdio::from(o))
        .stderr(Stdio::from(e))
        .status()
        .map_err(|e| format!("running {argv:?} on {host}: {e}"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .map(i64::from)
        .or(status.signal().map(|s| 128 + i64::from(s)))
        .unwrap_or(1))
}

/// Every request but `exec`.
fn act(c: &mut Cluster, plan: &Plan, op: &str, req: &Value) -> Result<Value, String> {
    // A spare's daemon is the DVM's to start (a grow), with an identity only the
    // controller can give it.
    let not_spare = |h: String| {
        if plan.is_spare(&h) {
            Err(format!(
                "{h} is a spare: the DVM starts its daemon (`lab grow`); `lab shrink {h}` takes it out again"
            ))
        } else {
            Ok(h)
        }
    };
    let host = || {
        req["host"]
            .as_str()
            .ok_or_else(|| format!("{op}: no host"))
            .and_then(|h| c_has(c, h).map(|_| h.to_string()))
    };
    match op {
        "hosts" => {
            let names: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
            let states: Vec<Value> = names
                .iter()
                .map(|h| {
                    json!({
                        "host": h,
                        "state": c.daemon_state(h),
                        "spare": plan.is_spare(h),
                        "log": c.log_file(h),
                    })
                })
                .collect();
            Ok(json!({ "hosts": states }))
        }
        "kill" => c.kill(&host()?).map(|_| json!({})),
        "freeze" => c.freeze(&host()?).map(|_| json!({})),
        "thaw" => c.thaw(&host()?).map(|_| json!({})),
        "restart" => {
            let h = not_spare(host()?)?;
            if c.is_running(&h) {
                c.stop(&h)?;
            }
            c.start(&h).map(|_| json!({}))
        }
        "late-boot" => c.start(&not_spare(host()?)?).map(|_| json!({})),
        "partition" => {
            let side = |k: &str| -> Vec<String> {
                req[k]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            c.partition(&side("a"), &side("b"), Direction::Both)
                .map(|_| json!({}))
        }
        "heal" => c.heal_all().map(|_| json!({})),
        "down" => Ok(json!({ "pid": std::process::id() })),
        other => Err(format!("unknown request {other:?}")),
    }
}

fn c_has(c: &Cluster, h: &str) -> Result<(), String> {
    c.host(h).map(|_| ())
}

/// What the lab's backends are called on the command line and in messages.
pub fn backend_name(b: BackendKind) -> &'static str {
    match b {
        BackendKind::Docker => "docker",
        BackendKind::Netns => "netns",
        BackendKind::Process => "process",
    }
}

/// Prints the log at `path`; with `follow`, keeps printing what is appended until the lab
/// goes down.
pub fn print_log(path: &Path, follow: bool) -> Result<(), String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut at = 0u64;
    loop {
        let mut buf = Vec::new();
        f.seek(SeekFrom::Start(at))
            .and_then(|_| f.read_to_end(&mut buf))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        at += buf.len() as u64;
        dvmlab_host::stdout::bytes(&buf);
        if !follow || Keeper::find().is_none() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the keeper whose pid `down` returned is gone, then removes its directory.
pub fn wait_gone(pid: u32) -> Result<(), String> {
    dvmlab_harness::wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
        if dvmlab_harness::gc::alive(pid) {
            Err(format!(
                "the lab's keeper (pid {pid}) is still tearing down"
            ))
        } else {
            Ok(())
        }
    })?;
    let d = dir();
    std::fs::remove_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))
}
