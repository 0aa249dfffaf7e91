//! `make bench`, events (PMIx RFC 0002), each figure beside what it is compared with in the
//! same run:
//! - **in process**: events per second through a chain of 4 handlers in one process (the
//!   client's event core), beside the floor: the same 4 calls given the same copies of the
//!   event and the results so far, with no chain around them;
//! - **same node**: `pevent notify` to a listener on the same node (p50/p99 of sent to
//!   handler called, `DVMLAB_BENCH_EVENTS` events, default 200), beside the machine's floor
//!   for two hops between processes (a unix-socket round trip to another process) and, when
//!   `DVMLAB_PMIX_ADAPTER` names the OpenPMIx adapter (`make bench` builds it), the same
//!   measure on real OpenPMIx;
//! - **NAMESPACE**: a job with one process on each of 32 and 128 nodes
//!   (`DVMLAB_BENCH_EVENT_SIZES`); process 0 notifies its job, timed from its send to the
//!   last process's handler (p50/p99 of `DVMLAB_BENCH_REPS` x 4), beside the floor: the
//!   longest ping round trip through the tree from the controller.
//!
//! Backend as for the other benches (`DVMLAB_BACKEND`, default process). Writes
//! `target/bench/events.json`.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use dvmlab_bench::stats::percentile;
use dvmlab_core::event::client::{EventClient, Output};
use dvmlab_harness::{wait_until, BackendKind, Cluster};
use dvmlab_proto::event::{Completion, Directives, Event, HandlerResult, Info, Level};
use serde_json::{json, Value};
use support::dvm::{self, PCTL, PRUN};

const PEVENT: &str = env!("CARGO_BIN_EXE_pevent");

/// A listener's JSON lines, each with the job process it came from.
type Lines = Vec<(Option<u32>, Value)>;
/// A handler of the floor's chain-less loop.
type Handler = Box<dyn FnMut(&Event, &[HandlerResult]) -> HandlerResult>;
const CODE: i32 = -3900;
const TRIGGER: i32 = -3901;

fn event() -> Event {
    Event {
        code: CODE,
        source: None,
        info: vec![Info {
            key: "x".into(),
            value: json!(7),
        }],
        level: Level::Job,
    }
}

/// Events per second through a 4-handler chain of the client core.
fn chain_rate(n: usize) -> f64 {
    let mut c = EventClient::new(None);
    for i in 0..4 {
        let d = Directives {
            name: Some(format!("h{i}")),
            ..Directives::default()
        };
        if c.register(vec![CODE], d).is_err() {
            eprintln!("cannot register");
            std::process::exit(1);
        }
    }
    let ev = event();
    let t = Instant::now();
    let mut served = 0;
    for _ in 0..n {
        let mut out = c.arrived(ev.clone());
        while let Some(o) = out.pop() {
            match o {
                Output::Invoke(inv) => {
                    out = c.handler_done(inv.reg, Completion::NoActionTaken, vec![]);
                }
                Output::Served { .. } => served += 1,
                Output::Send(_) => {}
            }
        }
    }
    assert_eq!(served, n, "every event went through the chain");
    n as f64 / t.elapsed().as_secs_f64()
}

/// The same 4 handler calls with the same copies, and no chain: the floor.
fn floor_rate(n: usize) -> f64 {
    let ev = event();
    let mut handlers: Vec<Handler> = (0..4)
        .map(|i| {
            let name = format!("h{i}");
            Box::new(move |e: &Event, prior: &[HandlerResult]| {
                std::hint::black_box((e, prior));
                HandlerResult {
                    name: name.clone(),
                    status: Completion::NoActionTaken.status(),
                    results: vec![],
                }
            }) as Handler
        })
        .collect();
    let t = Instant::now();
    let mut total = 0usize;
    for _ in 0..n {
        let queued = ev.clone();
        let mut results: Vec<HandlerResult> = Vec::new();
        for h in handlers.iter_mut() {
            let (e, prior) = (queued.clone(), results.clone());
            results.push(h(&e, &prior));
        }
        total += std::hint::black_box(results.len());
    }
    assert_eq!(total, 4 * n);
    n as f64 / t.elapsed().as_secs_f64()
}

/// The JSON lines of a file (a job's `[RANK] ` prefixes kept apart).
fn lines(path: &Path) -> Lines {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (rank, rest) = match l.strip_prefix('[').and_then(|r| r.split_once("] ")) {
                Some((r, rest)) => (r.parse().ok(), rest),
                None => (None, l),
            };
            serde_json::from_str(rest).ok().map(|v| (rank, v))
        })
        .collect()
}

fn calls_of(lines: &[(Option<u32>, Value)], rank: Option<u32>, code: i32) -> Vec<u64> {
    lines
        .iter()
        .filter(|(r, v)| *r == rank && v["code"] == code && v.get("handler").is_some())
        .filter_map(|(_, v)| v["at_us"].as_u64())
        .collect()
}

fn wait_file(path: &Path, what: &str, ok: impl Fn(&[(Option<u32>, Value)]) -> bool) {
    if let Err(e) = wait_until(Duration::from_secs(60), Duration::from_millis(2), || {
        if ok(&lines(path)) {
            Ok(())
        } else {
            Err(format!("{}", path.display()))
        }
    }) {
        eprintln!("waiting for {what}: {e}");
        std::process::exit(1);
    }
}

/// The lines every job process writes to its own file (`out.RANK`), read as they come:
/// each file from where the last read stopped, so watching 128 of them costs the machine
/// little while it is measured. What the NAMESPACE measure needs of them: who is ready,
/// when each process's handler was called for the event, when process 0 sent it.
struct Tails {
    files: Vec<(PathBuf, u64, String)>,
    ready: usize,
    calls: Vec<Vec<u64>>,
    sent: Vec<u64>,
}

impl Tails {
    fn new(dir: &Path, n: usize) -> Tails {
        Tails {
            files: (0..n)
                .map(|r| (dir.join(format!("out.{r}")), 0, String::new()))
                .collect(),
            ready: 0,
            calls: vec![Vec::new(); n],
            sent: Vec::new(),
        }
    }

    fn poll(&mut self) {
        use std::io::{Seek, SeekFrom};
        for (rank, (path, offset, partial)) in self.files.iter_mut().enumerate() {
            let Ok(mut f) = std::fs::File::open(&*path) else {
                continue;
            };
            if f.seek(SeekFrom::Start(*offset)).is_err() {
                continue;
            }
            let mut more = String::new();
            let Ok(read) = f.read_to_string(&mut more) else {
                continue;
            };
            *offset += read as u64;
            partial.push_str(&more);
            while let Some(end) = partial.find('\n') {
                let line: String = partial.drain(..=end).collect();
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if v["ready"] == true {
                    self.ready += 1;
                } else if v["code"] == CODE && v.get("handler").is_some() {
                    if let Some(at) = v["at_us"].as_u64() {
                        self.calls[rank].push(at);
                    }
                } else if rank == 0 && v["notified"] == CODE {
                    if let Some(sent) = v["sent_us"].as_u64() {
                        self.sent.push(sent);
                    }
                }
            }
        }
    }

    fn wait(&mut self, what: &str, ok: impl Fn(&Tails) -> bool) {
        let r = wait_until(Duration::from_secs(60), Duration::from_millis(20), || {
            self.poll();
            if ok(self) {
                Ok(())
            } else {
                Err(format!("{} ready", self.ready))
            }
        });
        if let Err(e) = r {
            eprintln!("waiting for {what}: {e}");
            std::process::exit(1);
        }
    }
}

fn spawn(cluster: &Cluster, host: &str, argv: &[String], out: &Path) -> Child {
    let file = std::fs::File::create(out).unwrap_or_else(|e| {
        eprintln!("{}: {e}", out.display());
        std::process::exit(1)
    });
    cluster
        .command(host, argv)
        .and_then(|mut c| {
            c.stdin(Stdio::null())
                .stdout(file)
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .unwrap_or_else(|e| {
            eprintln!("starting {argv:?}: {e}");
            std::process::exit(1)
        })
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Runs `notify` (its argv, printing `sent_us`) `events` times on `host`, each after the
/// listener writing to `out` had the one before; the delays, in ms.
fn same_node_delays(
    cluster: &Cluster,
    host: &str,
    notify: &[String],
    out: &Path,
    events: usize,
) -> Vec<f64> {
    let mut delays = Vec::new();
    for i in 0..events {
        let o = cluster.exec(host, notify).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
        let text = String::from_utf8_lossy(&o.stdout);
        let Some(sent) = serde_json::from_str::<Value>(text.trim())
            .ok()
            .and_then(|v| v["sent_us"].as_u64())
        else {
            eprintln!(
                "{notify:?}: no sent_us in {text:?} {}",
                String::from_utf8_lossy(&o.stderr)
            );
            std::process::exit(1)
        };
        wait_file(out, "the listener's call", |l| {
            calls_of(l, None, CODE).len() > i
        });
        let at = calls_of(&lines(out), None, CODE)[i];
        delays.push(at.saturating_sub(sent) as f64 / 1000.0);
    }
    delays
}

/// The machine's floor for two hops between processes: a one-byte round trip over a unix
/// socket to another process (ms).
fn socket_floor(reps: usize) -> Vec<f64> {
    match dvmlab_bench::floor::unix_rtt_us(reps) {
        Ok(us) => us.into_iter().map(|u| u / 1000.0).collect(),
        Err(e) => {
            eprintln!("the unix-socket floor: {e}");
            std::process::exit(1)
        }
    }
}

struct Same {
    p50: f64,
    p99: f64,
}

fn same(v: Vec<f64>) -> Same {
    Same {
        p50: percentile(&v, 50.0),
        p99: percentile(&v, 99.0),
    }
}

fn same_node_dvmlab(backend: BackendKind, events: usize) -> Same {
    let (cluster, _) = dvm::formed("evbench1", backend, 1, false).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let out = cluster.run_dir().join("listener.out");
    let handler = format!("name=h,codes={CODE}");
    let mut l = spawn(
        &cluster,
        "n0001",
        &strings(&[PEVENT, "listen", "--handler", &handler, "--timeout", "600"]),
        &out,
    );
    wait_file(&out, "the listener ready", |l| {
        l.iter().any(|(_, v)| v["ready"] == true)
    });
    let notify = strings(&[
        PEVENT,
        "notify",
        &CODE.to_string(),
        "--range",
        "LOCAL",
        "--json",
    ]);
    let d = same_node_delays(&cluster, "n0001", &notify, &out, events);
    let _ = l.kill();
    let _ = l.wait();
    let _ = dvm::stop(cluster);
    same(d)
}

/// A process killed when dropped, whatever way the bench leaves.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The same measure on real OpenPMIx: its adapter's server, a tool listening, a tool
/// notifying. `None` without the adapter.
fn same_node_openpmix(events: usize) -> Option<Same> {
    let adapter = PathBuf::from(std::env::var_os("DVMLAB_PMIX_ADAPTER")?);
    let dir = std::env::temp_dir().join(format!("dvmlab-evbench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let a = adapter.to_string_lossy().into_owned();
    let server_out =
        std::env::temp_dir().join(format!("dvmlab-evbench-{}.srv", std::process::id()));
    let _server = Reaped(
        std::process::Command::new(&adapter)
            .args(["server", "--dir", &d])
            .stdout(std::fs::File::create(&server_out).ok()?)
            .stderr(Stdio::null())
            .spawn()
            .ok()?,
    );
    wait_file(&server_out, "the OpenPMIx server ready", |l| {
        l.iter().any(|(_, v)| v["ready"] == true)
    });
    let chain = dir.join("chain.json");
    let _ = std::fs::write(&chain, json!([{"name": "h", "codes": [CODE]}]).to_string());
    let out = dir.join("listener.out");
    let _listener = Reaped(
        std::process::Command::new(&adapter)
            .args(["listen", "--dir", &d, "--chain"])
            .arg(&chain)
            .args(["--timeout", "600"])
            .stdout(std::fs::File::create(&out).ok()?)
            .stderr(Stdio::null())
            .spawn()
            .ok()?,
    );
    wait_file(&out, "the OpenPMIx listener ready", |l| {
        l.iter().any(|(_, v)| v["ready"] == true)
    });
    let mut delays = Vec::new();
    for i in 0..events {
        let o = std::process::Command::new(&a)
            .args([
                "notify",
                "--dir",
                &d,
                &CODE.to_string(),
                "--range",
                "LOCAL",
                "--json",
            ])
            .output()
            .ok()?;
        let sent = serde_json::from_slice::<Value>(o.stdout.trim_ascii())
            .ok()
            .and_then(|v| v["sent_us"].as_u64())?;
        wait_file(&out, "the OpenPMIx listener's call", |l| {
            calls_of(l, None, CODE).len() > i
        });
        let at = calls_of(&lines(&out), None, CODE)[i];
        delays.push(at.saturating_sub(sent) as f64 / 1000.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&server_out);
    Some(same(delays))
}

/// CPU time (ns) of every process named `comm` on the machine (schedstat).
fn cpu_ns(comm: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == comm))
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

struct Wide {
    nodes: usize,
    /// CPU per event of all daemons together, and of all listeners, in ms.
    daemons_cpu_ms: f64,
    listeners_cpu_ms: f64,
    p50: f64,
    p99: f64,
    /// Send to the first process's handler (the tree's part; the rest is waking the others).
    first_p50: f64,
    floor_ms: f64,
}

/// A job of one listener per node; process 0 notifies NAMESPACE each time a tool on its node
/// triggers it; send to the last process's handler, `reps` times.
fn namespace(backend: BackendKind, n: usize, reps: usize) -> Wide {
    let (cluster, _) = dvm::formed("evbenchn", backend, n, false).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let ping = dvm::run(&cluster, PCTL, &["ping", "--all", "--json"]).unwrap_or_default();
    let floor_ms = ping
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["rtt_us"].as_u64())
        .max()
        .unwrap_or(0) as f64
        / 1000.0;
    let chain = cluster.run_dir().join("chain.json");
    let _ = std::fs::write(
        &chain,
        json!([
            {"name": "h", "codes": [CODE, TRIGGER]},
            {"notify": {"code": CODE, "range": "NAMESPACE", "rank": 0, "on": TRIGGER}},
        ])
        .to_string(),
    );
    let hosts: Vec<String> = (1..=n).map(|i| format!("n{i:04}")).collect();
    // Each process writes its lines to a file of its own: the measure is the event's
    // delivery, not job output travelling the tree to prun meanwhile.
    let dir = cluster.run_dir().to_path_buf();
    let script = format!(
        "exec {PEVENT} listen --chain {} --timeout 900 > {}/out.$DVMLAB_PROC",
        chain.display(),
        dir.display()
    );
    let argv = vec![
        PRUN.to_string(),
        "-n".into(),
        n.to_string(),
        "--host".into(),
        hosts.join(","),
        "sh".into(),
        "-c".into(),
        script,
    ];
    let mut job = spawn(&cluster, "ctl", &argv, &dir.join("prun.out"));
    let mut tails = Tails::new(&dir, n);
    tails.wait("every listener ready", |t| t.ready >= n);
    let mut delays = Vec::new();
    let mut firsts = Vec::new();
    let (daemons0, listeners0) = (cpu_ns("prted"), cpu_ns("pevent"));
    for i in 0..reps {
        // LOCAL on process 0's node: the trigger itself crosses no link, so the event
        // measured shares the DVM with nothing else.
        let trigger = strings(&[PEVENT, "notify", &TRIGGER.to_string(), "--range", "LOCAL"]);
        if let Err(e) = cluster.exec(&hosts[0], &trigger) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        tails.wait("every process's handler", |t| {
            t.sent.len() > i && t.calls.iter().all(|c| c.len() > i)
        });
        let at: Vec<u64> = tails.calls.iter().map(|c| c[i]).collect();
        let sent = tails.sent[i];
        let last = at.iter().max().copied().unwrap_or(0);
        let first = at.iter().min().copied().unwrap_or(0);
        delays.push(last.saturating_sub(sent) as f64 / 1000.0);
        firsts.push(first.saturating_sub(sent) as f64 / 1000.0);
    }
    let per_event = |ns: u64| ns as f64 / 1e6 / reps as f64;
    let daemons_cpu_ms = per_event(cpu_ns("prted").saturating_sub(daemons0));
    let listeners_cpu_ms = per_event(cpu_ns("pevent").saturating_sub(listeners0));
    let _ = job.kill();
    let _ = job.wait();
    let _ = dvm::stop(cluster);
    let s = same(delays);
    Wide {
        nodes: n,
        daemons_cpu_ms,
        listeners_cpu_ms,
        p50: s.p50,
        p99: s.p99,
        first_p50: percentile(&firsts, 50.0),
        floor_ms,
    }
}

fn main() {
    dvmlab_bench::floor::serve_worker();
    let backend = support::backend();
    let events: usize = std::env::var("DVMLAB_BENCH_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
        .max(1);
    let sizes = support::sizes("DVMLAB_BENCH_EVENT_SIZES", "32,128");
    let reps = support::reps(5) * 4;
    let mut misses = Vec::new();
    let mut table = support::Table {
        caption: format!(
            "Events (PMIx RFC 0002; {backend:?} backend, radix 64): each figure beside what it is compared with in the same run"
        ),
        header: vec!["measure", "dvmlab", "compared with", "ratio"],
        rows: Vec::new(),
    };

    let n = 200_000;
    let (rate, floor) = (chain_rate(n), floor_rate(n));
    println!("Events through a 4-handler chain in one process ({n} events)");
    println!(
        "  chain {rate:>10.0}/s   floor (same calls and copies, no chain) {floor:>10.0}/s   chain/floor {:.2}",
        rate / floor
    );
    table.rows.push(vec![
        format!("events through a 4-handler chain in one process ({n} events)"),
        format!("{rate:.0} / s"),
        format!("the same calls given the same copies, no chain: {floor:.0} / s"),
        format!("{:.2}", rate / floor),
    ]);
    if rate < 100_000.0 {
        misses.push(format!("in-process chain {rate:.0}/s (target >= 100000/s)"));
    }

    let dv = same_node_dvmlab(backend, events);
    let fl = socket_floor(events);
    let (f50, f99) = (percentile(&fl, 50.0), percentile(&fl, 99.0));
    println!("Same node, notify to the listener's handler ({events} events, {backend:?} backend)");
    println!(
        "  dvmlab     p50 {:>7.3} ms  p99 {:>7.3} ms",
        dv.p50, dv.p99
    );
    println!(
        "  floor      p50 {f50:>7.3} ms  p99 {f99:>7.3} ms   (two hops between processes: a unix-socket round trip)   dvmlab/floor p50 {:.1}",
        dv.p50 / f50.max(1e-6)
    );
    table.rows.push(vec![
        format!("same node, `pevent notify` to the listener's handler ({events} events)"),
        format!("p50 {:.3} ms, p99 {:.3} ms", dv.p50, dv.p99),
        format!("a unix-socket round trip between two processes: p50 {f50:.3} ms, p99 {f99:.3} ms"),
        format!("{:.1} (p50)", dv.p50 / f50.max(1e-6)),
    ]);
    let pmix = same_node_openpmix(events);
    if let Some(p) = &pmix {
        table.rows.push(vec![
            "the same on OpenPMIx (its host server, tool to tool)".into(),
            String::new(),
            format!("p50 {:.3} ms, p99 {:.3} ms", p.p50, p.p99),
            format!("dvmlab {:.2} of it (p50)", dv.p50 / p.p50.max(1e-6)),
        ]);
    }
    match &pmix {
        Some(p) => println!(
            "  OpenPMIx   p50 {:>7.3} ms  p99 {:>7.3} ms   (its host server, tool to tool)   dvmlab/OpenPMIx p50 {:.2}",
            p.p50,
            p.p99,
            dv.p50 / p.p50.max(1e-6)
        ),
        None => println!("  OpenPMIx   not measured (set DVMLAB_PMIX_ADAPTER; make bench does)"),
    }
    if dv.p99 > 1.0 {
        misses.push(format!("same-node p99 {:.3} ms (target <= 1 ms)", dv.p99));
    }

    println!("NAMESPACE event to one process per node, send to last handler ({reps} events)");
    let mut wide = Vec::new();
    for &nodes in &sizes {
        let w = namespace(backend, nodes, reps);
        println!(
            "  {:>4} nodes  p50 {:>7.2} ms  p99 {:>7.2} ms  (first handler p50 {:>6.2} ms)   floor (longest ping round trip through the tree) {:>6.2} ms   p50/floor {:.1}",
            w.nodes,
            w.p50,
            w.p99,
            w.first_p50,
            w.floor_ms,
            w.p50 / w.floor_ms.max(1e-6)
        );
        println!(
            "             CPU per event: daemons {:.2} ms, listeners {:.2} ms (all of them; {:.2} ms of work on 2 cores is {:.2} ms at best)",
            w.daemons_cpu_ms,
            w.listeners_cpu_ms,
            w.daemons_cpu_ms + w.listeners_cpu_ms,
            (w.daemons_cpu_ms + w.listeners_cpu_ms) / 2.0
        );
        table.rows.push(vec![
            format!(
                "NAMESPACE event to one process on each of {} nodes, send to last handler ({reps} events)",
                w.nodes
            ),
            format!("p50 {:.2} ms, p99 {:.2} ms", w.p50, w.p99),
            format!("the longest ping round trip through the tree: {:.2} ms", w.floor_ms),
            format!("{:.1}", w.p50 / w.floor_ms.max(1e-6)),
        ]);
        if w.nodes == 128 && w.p50 > 10.0 {
            misses.push(format!("128 nodes p50 {:.2} ms (target <= 10 ms)", w.p50));
        }
        wide.push(w);
    }
    let doc = json!({
        "chain": {"events_per_s": rate, "floor_per_s": floor},
        "same_node": {
            "dvmlab": {"p50_ms": dv.p50, "p99_ms": dv.p99},
            "floor": {"p50_ms": f50, "p99_ms": f99},
            "openpmix": pmix.as_ref().map(|p| json!({"p50_ms": p.p50, "p99_ms": p.p99})),
        },
        "namespace": wide.iter().map(|w| json!({
            "nodes": w.nodes, "p50_ms": w.p50, "p99_ms": w.p99, "first_p50_ms": w.first_p50,
            "daemons_cpu_ms": w.daemons_cpu_ms, "listeners_cpu_ms": w.listeners_cpu_ms,
            "floor_ms": w.floor_ms,
        })).collect::<Vec<_>>(),
    });
    support::report(
        ">= 100000 events/s in process; same-node p99 <= 1 ms; 128 nodes p50 <= 10 ms",
        &misses,
        "events",
        &[table],
        None,
        &doc,
    );
}
