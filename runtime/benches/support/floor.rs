//! The machine's own floor for the work a bench times, measured in the same run: what any
//! runtime needs at least on these cores, so that a figure is printed as a ratio to it
//! rather than as milliseconds that do not travel between machines.
//!
//! - A job of N processes: N spawns of the program and their waits, spread over one worker
//!   process per core (as a DVM's daemons share the cores), each spawning its share one
//!   after another.
//! - Formation of N daemons: N processes started on their hosts, as the harness starts
//!   daemons, each making one TCP connection to a process on the controller's host, which
//!   accepts them all.
//!
//! A worker is this bench program again, told by [`WORKER_ENV`] what to do; [`serve_worker`]
//! at the top of `main` runs it.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use dvmlab_harness::Cluster;

/// Set on a worker process: `spawn COUNT PROGRAM`, `connect ADDR` or `listen ADDR COUNT`.
const WORKER_ENV: &str = "DVMLAB_BENCH_FLOOR_WORKER";

/// The port the formation floor's listener takes on the controller's host.
const FLOOR_PORT: u16 = 7999;

/// In a worker (started by [`spawn_ms`]), does its share and exits; otherwise returns.
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
        ["connect", addr] => addr
            .parse::<SocketAddr>()
            .map_err(|e| format!("{addr:?}: {e}"))
            .and_then(|a| TcpStream::connect(a).map_err(|e| format!("connect {a}: {e}")))
            .map(|_| ()),
        ["listen", addr, count] => listen(addr, count),
        _ => Err(format!(
            "{WORKER_ENV}={task:?}: expected spawn COUNT PROGRAM, connect ADDR or listen ADDR COUNT"
        )),
    };
    if let Err(e) = done {
        eprintln!("floor worker: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

/// Binds, says `ready`, and accepts `count` connections.
fn listen(addr: &str, count: &str) -> Result<(), String> {
    let count: usize = count.parse().map_err(|e| format!("{count:?}: {e}"))?;
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    // A connector that failed would leave this waiting forever: a watchdog, not a wait.
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(120));
        eprintln!("floor listener: not every connection came within 120 s");
        std::process::exit(3);
    });
    println!("ready");
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        let (s, _) = l.accept().map_err(|e| format!("accept on {addr}: {e}"))?;
        open.push(s);
    }
    Ok(())
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

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The median, in ms, of `reps` runs of: `n` spawns of `program` and their waits, over one
/// worker process per core (counting the workers' own start, as a job counts its daemons'
/// shells).
pub fn spawn_ms(program: &str, n: usize, reps: usize) -> Result<f64, String> {
    let me = std::env::current_exe().map_err(|e| format!("this bench's program: {e}"))?;
    let workers = cores().min(n.max(1));
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let mut children = Vec::with_capacity(workers);
        for w in 0..workers {
            // The first n % workers workers take one more.
            let share = n / workers + usize::from(w < n % workers);
            let child = Command::new(&me)
                .env(WORKER_ENV, format!("spawn {share} {program}"))
                .spawn()
                .map_err(|e| format!("starting a floor worker: {e}"))?;
            children.push(child);
        }
        for mut c in children {
            let st = c.wait().map_err(|e| format!("a floor worker: {e}"))?;
            if !st.success() {
                return Err(format!("a floor worker failed: {st}"));
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(super::dvm::median(&mut times))
}

/// The floor for forming a DVM on `cluster`: from the first start until a process on
/// `controller` has accepted one TCP connection from a process started on each of `hosts`
/// (started the way the harness starts daemons, entering each host), in ms.
pub fn connect_ms(cluster: &Cluster, controller: &str, hosts: &[String]) -> Result<f64, String> {
    let me = std::env::current_exe().map_err(|e| format!("this bench's program: {e}"))?;
    let me = me.display().to_string();
    let ip = cluster
        .host(controller)?
        .v4
        .ok_or_else(|| format!("{controller} has no IPv4 address"))?;
    let addr = SocketAddr::new(ip, FLOOR_PORT);
    let mut listener = cluster
        .command(controller, std::slice::from_ref(&me))?
        .env(WORKER_ENV, format!("listen {addr} {}", hosts.len()))
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the floor's listener: {e}"))?;
    let mut ready = String::new();
    if let Some(out) = listener.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut ready);
    }
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
        let c = cluster
            .command(h, std::slice::from_ref(&me))?
            .env(WORKER_ENV, format!("connect {addr}"))
            .spawn()
            .map_err(|e| format!("starting a floor connector on {h}: {e}"))?;
        connectors.push(c);
    }
    let st = listener
        .wait()
        .map_err(|e| format!("the floor's listener: {e}"))?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    for mut c in connectors {
        let _ = c.wait();
    }
    if !st.success() {
        return Err(format!("the floor's listener failed: {st}"));
    }
    Ok(ms)
}
