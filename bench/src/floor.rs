//! The machine's own floor for the work a bench times, measured in the same run: what any
//! runtime needs at least on these cores, so that a figure is printed as a ratio to it
//! rather than as milliseconds that do not travel between machines.
//!
//! - A job of N processes: N spawns of the program and their waits, spread over one worker
//!   process per core (as a DVM's daemons share the cores), each spawning its share one
//!   after another. The workers are started the way the runtime's tool is (entering the
//!   controller's host), so both pay the same entry.
//! - Formation of N daemons: N processes started on their hosts, as the harness starts
//!   daemons, each making one TCP connection to a process on the controller's host, which
//!   accepts them all.
//! - A grow onto N hosts: the launch agent starting a process that exits at once on each,
//!   all at once.
//! - An event between two processes on one node: one unix-socket round trip.
//!
//! A worker is the calling program again, told by [`WORKER_ENV`] what to do; every program
//! that measures a floor calls [`serve_worker`] first thing in `main`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dvmlab_harness::{wait_until, Cluster};

use crate::stats::median;

/// Set on a worker process: `spawn COUNT PROGRAM`, `spawn-cpu COUNT PROGRAM` (the same,
/// then what it and its children ran, on a line: [`say_cpu`]), `connect ADDR`, `listen ADDR
/// COUNT` or `echo PATH`.
const WORKER_ENV: &str = "DVMLAB_BENCH_FLOOR_WORKER";

/// The port the formation floor's listener takes on the controller's host.
const FLOOR_PORT: u16 = 7999;

/// How long a floor's listener waits for its connections before giving up.
const LISTEN_LIMIT: Duration = Duration::from_secs(120);

/// In a worker (started by a floor here), does its share and exits; otherwise returns.
pub fn serve_worker() {
    let Ok(task) = std::env::var(WORKER_ENV) else {
        return;
    };
    let words: Vec<&str> = task.split(' ').collect();
    let done = match words.as_slice() {
        ["spawn", count, program] => count
            .parse()
            .map_err(|e| format!("{count:?}: {e}"))
            .and_then(|count| spawn_and_wait(program, count)),
        ["spawn-cpu", count, program] => count
            .parse()
            .map_err(|e| format!("{count:?}: {e}"))
            .and_then(|count| {
                let started = crate::procfs::own_cpu_ms()?;
                spawn_and_wait(program, count)?;
                say_cpu(started)
            }),
        ["connect", addr] => addr
            .parse::<SocketAddr>()
            .map_err(|e| format!("{addr:?}: {e}"))
            .and_then(connect),
        ["listen", addr, count] => listen(addr, count),
        ["echo", path] => echo(path),
        _ => Err(format!(
            "{WORKER_ENV}={task:?}: expected spawn COUNT PROGRAM, spawn-cpu COUNT PROGRAM, connect ADDR, listen ADDR COUNT or echo PATH"
        )),
    };
    if let Err(e) = done {
        eprintln!("floor worker: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

/// How many times a connector tries when its host could not resolve the listener's.
const CONNECT_ATTEMPTS: u32 = 10;

/// One TCP connection to `addr`, tried again at once while the host is unreachable: on a
/// bridge of a thousand ports an address resolution can be lost in the flood, and the kernel
/// has already spent its own retries (seconds) before it says so. The daemons retry too.
fn connect(addr: SocketAddr) -> Result<(), String> {
    let mut attempt = 1;
    loop {
        match TcpStream::connect(addr) {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == std::io::ErrorKind::HostUnreachable
                    && attempt < CONNECT_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(e) => return Err(format!("connect {addr} (attempt {attempt}): {e}")),
        }
    }
}

/// Binds, says `ready`, accepts `count` connections and says `accepted`.
fn listen(addr: &str, count: &str) -> Result<(), String> {
    let count: usize = count.parse().map_err(|e| format!("{count:?}: {e}"))?;
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    // A connector that failed would leave this waiting forever: a watchdog, not a wait.
    std::thread::spawn(|| {
        std::thread::sleep(LISTEN_LIMIT);
        eprintln!("floor listener: not every connection came within {LISTEN_LIMIT:?}");
        std::process::exit(3);
    });
    println!("ready");
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        let (s, _) = l.accept().map_err(|e| format!("accept on {addr}: {e}"))?;
        open.push(s);
    }
    // The bench's clock stops here, not at this process's exit and reaping.
    println!("accepted");
    Ok(())
}

/// Connects to the unix socket at `path` and sends back every byte it reads until EOF.
fn echo(path: &str) -> Result<(), String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("connect {path}: {e}"))?;
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => return Ok(()),
            Ok(_) => s.write_all(&b).map_err(|e| format!("echo: {e}"))?,
            Err(e) => return Err(format!("read {path}: {e}")),
        }
    }
}

fn spawn_and_wait(program: &str, count: usize) -> Result<(), String> {
    for _ in 0..count {
        // No pre_exec and no changed directory: std spawns with posix_spawn here.
        let st = Command::new(program)
            .status()
            .map_err(|e| format!("{program}: {e}"))?;
        if !st.success() {
            return Err(format!("{program}: {st}"));
        }
    }
    Ok(())
}

/// Prints `cpu STARTED_MS OWN_MS CHILDREN_MS`: what this worker had run when it began to
/// spawn (its own start), what it has run in all, and what the programs it spawned ran
/// (their `posix_spawn` child before `exec` included).
fn say_cpu(started: f64) -> Result<(), String> {
    println!(
        "cpu {started} {} {}",
        crate::procfs::own_cpu_ms()?,
        crate::procfs::children_cpu_ms()?
    );
    Ok(())
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// This program, to be started on `host` of `cluster` as a worker doing `task`.
fn worker(cluster: &Cluster, host: &str, task: &str) -> Result<Command, String> {
    let mut cmd = cluster.command(host, &[me()?])?;
    cmd.env(WORKER_ENV, task);
    Ok(cmd)
}

fn me() -> Result<String, String> {
    std::env::current_exe()
        .map(|p| p.display().to_string())
        .map_err(|e| format!("this program's path: {e}"))
}

/// The median, in ms, of `reps` runs of: `n` spawns of `program` and their waits, over one
/// worker process per core started on `host` of `cluster` the way a tool is (counting the
/// workers' own start, as a job counts its tool's and daemons' work).
pub fn spawn_ms(
    cluster: &Cluster,
    host: &str,
    program: &str,
    n: usize,
    reps: usize,
) -> Result<f64, String> {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let children = spawners(cluster, host, program, n, "spawn", Stdio::inherit)?;
        for mut c in children {
            let st = c.wait().map_err(|e| format!("a floor worker: {e}"))?;
            if !st.success() {
                return Err(format!("a floor worker failed: {st}"));
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(&times))
}

/// One worker per core (at most `n`) started on `host` with `task` over its share of `n`
/// spawns of `program`; if one cannot be started, those already started are killed.
fn spawners(
    cluster: &Cluster,
    host: &str,
    program: &str,
    n: usize,
    task: &str,
    stdout: impl Fn() -> Stdio,
) -> Result<Vec<std::process::Child>, String> {
    let workers = cores().min(n.max(1));
    let mut children: Vec<std::process::Child> = Vec::with_capacity(workers);
    for w in 0..workers {
        // The first n % workers workers take one more.
        let share = n / workers + usize::from(w < n % workers);
        let started =
            worker(cluster, host, &format!("{task} {share} {program}")).and_then(|mut c| {
                c.stdout(stdout())
                    .spawn()
                    .map_err(|e| format!("starting a floor worker: {e}"))
            });
        match started {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e);
            }
        }
    }
    Ok(children)
}

/// One run of a job's floor, taken apart.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpawnRun {
    /// Wall time, ms, as [`spawn_ms`] times it.
    pub ms: f64,
    /// What the workers ran themselves from their first spawn on, ms.
    pub workers_ms: f64,
    /// What the programs they spawned ran, ms.
    pub programs_ms: f64,
}

/// One run of [`spawn_ms`]'s work (`n` spawns of `program` over one worker per core started
/// on `host`), with what the workers and their programs each ran.
pub fn spawn_cpu(
    cluster: &Cluster,
    host: &str,
    program: &str,
    n: usize,
) -> Result<SpawnRun, String> {
    let t = Instant::now();
    let children = spawners(cluster, host, program, n, "spawn-cpu", Stdio::piped)?;
    let mut run = SpawnRun::default();
    let mut lines = Vec::with_capacity(children.len());
    for c in children {
        let out = c
            .wait_with_output()
            .map_err(|e| format!("a floor worker: {e}"))?;
        if !out.status.success() {
            return Err(format!("a floor worker failed: {}", out.status));
        }
        lines.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    run.ms = t.elapsed().as_secs_f64() * 1000.0;
    for line in lines {
        let (started, own, programs) = cpu_line(&line)?;
        run.workers_ms += own - started;
        run.programs_ms += programs;
    }
    Ok(run)
}

/// A worker's `cpu STARTED_MS OWN_MS CHILDREN_MS` line: its output's last (what the programs
/// it spawned printed comes before it).
fn cpu_line(out: &str) -> Result<(f64, f64, f64), String> {
    let last = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let words: Vec<&str> = last.split_whitespace().collect();
    let ["cpu", numbers @ ..] = words.as_slice() else {
        return Err(format!(
            "a floor worker said {out:?}, not `cpu STARTED OWN CHILDREN`"
        ));
    };
    match numbers
        .iter()
        .map(|n| n.parse::<f64>())
        .collect::<Result<Vec<_>, _>>()
        .as_deref()
    {
        Ok([started, own, children]) => Ok((*started, *own, *children)),
        _ => Err(format!("a floor worker said {out:?}: not three numbers")),
    }
}

/// The formation floor's time until every connection was accepted.
#[derive(Debug, Clone, Copy)]
pub struct Connected {
    /// From the first connector's start, ms.
    pub from_first: f64,
    /// From the last connector's start, ms.
    pub from_last: f64,
}

/// The floor for forming a DVM on `cluster`: until a process on `controller` has accepted
/// one TCP connection from a process started on each of `hosts` (started the way the
/// harness starts daemons, entering each host).
pub fn connect_ms(
    cluster: &Cluster,
    controller: &str,
    hosts: &[String],
) -> Result<Connected, String> {
    let ip = cluster
        .host(controller)?
        .v4
        .ok_or_else(|| format!("{controller} has no IPv4 address"))?;
    let addr = SocketAddr::new(ip, FLOOR_PORT);
    let mut listener = worker(
        cluster,
        controller,
        &format!("listen {addr} {}", hosts.len()),
    )?
    .stdout(Stdio::piped())
    .spawn()
    .map_err(|e| format!("starting the floor's listener: {e}"))?;
    let mut said = listener.stdout.take().map(BufReader::new);
    let mut line = |l: &mut String| {
        if let Some(out) = said.as_mut() {
            let _ = out.read_line(l);
        }
    };
    let mut ready = String::new();
    line(&mut ready);
    if ready.trim() != "ready" {
        let _ = listener.kill();
        let _ = listener.wait();
        return Err(format!(
            "the floor's listener on {controller} did not start"
        ));
    }
    let t = Instant::now();
    let mut connectors = Vec::with_capacity(hosts.len());
    for h in hosts {
        let c = worker(cluster, h, &format!("connect {addr}"))?
            .spawn()
            .map_err(|e| format!("starting a floor connector on {h}: {e}"))?;
        connectors.push(c);
    }
    let last = Instant::now();
    let mut accepted = String::new();
    line(&mut accepted);
    let done = Instant::now();
    let st = listener
        .wait()
        .map_err(|e| format!("the floor's listener: {e}"))?;
    for mut c in connectors {
        let _ = c.wait();
    }
    if !st.success() || accepted.trim() != "accepted" {
        return Err(format!("the floor's listener failed: {st}"));
    }
    Ok(Connected {
        from_first: (done - t).as_secs_f64() * 1000.0,
        from_last: (done - last).as_secs_f64() * 1000.0,
    })
}

/// The floor for a grow onto `hosts`: from `controller`, the launch agent `agent` (`AGENT
/// HOST COMMAND…`) starts `/bin/true` on every one of them at once, and all are waited
/// for; in ms.
pub fn agent_ms(
    cluster: &Cluster,
    controller: &str,
    agent: &Path,
    hosts: &[String],
) -> Result<f64, String> {
    let t = Instant::now();
    let mut children = Vec::with_capacity(hosts.len());
    for h in hosts {
        let argv = vec![agent.display().to_string(), h.clone(), "/bin/true".into()];
        let c = cluster
            .command(controller, &argv)?
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the launch agent for {h}: {e}"))?;
        children.push((h, c));
    }
    for (h, mut c) in children {
        let st = c
            .wait()
            .map_err(|e| format!("the launch agent for {h}: {e}"))?;
        if !st.success() {
            return Err(format!("the launch agent for {h} failed: {st}"));
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// `count` one-byte round trips over a unix socket to a worker process on this machine;
/// each round trip's time in µs.
pub fn unix_rtt_us(count: usize) -> Result<Vec<f64>, String> {
    let dir = std::env::temp_dir().join(format!("dvmlab-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("echo.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut child = Command::new(me()?)
        .env(WORKER_ENV, format!("echo {}", path.display()))
        .spawn()
        .map_err(|e| format!("starting the echo worker: {e}"))?;
    let run = || -> Result<Vec<f64>, String> {
        // A worker that failed to start never connects: bounded, not a blocking accept.
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (mut s, _) = wait_until(Duration::from_secs(10), Duration::from_millis(1), || {
            listener.accept().map_err(|e| e.to_string())
        })
        .map_err(|e| format!("the echo worker did not connect: {e}"))?;
        s.set_nonblocking(false)
            .map_err(|e| format!("the echo socket: {e}"))?;
        let mut times = Vec::with_capacity(count);
        let mut b = [0u8; 1];
        for _ in 0..count {
            let t = Instant::now();
            s.write_all(b"x").map_err(|e| format!("echo send: {e}"))?;
            s.read_exact(&mut b)
                .map_err(|e| format!("echo receive: {e}"))?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(times)
    };
    let times = run();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_cpu_line_is_read_and_anything_else_is_an_error() {
        assert_eq!(cpu_line("cpu 1 1.5 20.25\n"), Ok((1.0, 1.5, 20.25)));
        assert!(cpu_line("cpu 1.5 2")
            .unwrap_err()
            .contains("not three numbers"));
        assert!(cpu_line("cpu x 2 3")
            .unwrap_err()
            .contains("not three numbers"));
        assert!(cpu_line("1 2 3")
            .unwrap_err()
            .contains("not `cpu STARTED OWN CHILDREN`"));
        assert_eq!(
            cpu_line("what a program printed\ncpu 1 2 3\n\n"),
            Ok((1.0, 2.0, 3.0))
        );
    }
}
