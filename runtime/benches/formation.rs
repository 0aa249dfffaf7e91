//! `make bench`: DVM formation time vs size for daemons booted together, beside the
//! machine's floor measured on the same hosts in the same run (as many process starts, each
//! making one TCP connection to the controller's host) and their ratio, with CPU time and
//! peak RSS per daemon, against the targets of the bootstrap issue.
//!
//! Sizes come from `DVMLAB_BENCH_SIZES` (default `8,32,128,512`), repetitions from
//! `DVMLAB_BENCH_REPS` (default 3, the median is reported), the radix from
//! `DVMLAB_BENCH_RADIX` (default 64), the backend from `DVMLAB_BACKEND` (default process:
//! on netns hosts the CPU time also counts the harness entering each host's namespaces,
//! which copies the machine's mount table into the daemon's process). Results are printed as a table and
//! written to `target/bench/formation.json`.

mod support;

use support::dvm::{self, PCTL, PRTED};
use support::svg::{chart, Panel};

use dvmlab_harness::{BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};
use serde_json::json;

/// CPU time of `pid` so far, from /proc/PID/schedstat (nanoseconds on the CPU).
fn cpu_ns(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Peak resident set of `pid` (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

struct Sample {
    formed_ms: u64,
    /// From the first start to formed, and the machine's floor for that.
    from_first_ms: u64,
    floor_ms: f64,
    start_spread_ms: u64,
    ctl_cpu_ms: f64,
    cpu_ms_mean: f64,
    cpu_ms_max: f64,
    rss_mib_mean: f64,
    rss_mib_max: f64,
    ctl_rss_mib: f64,
}

fn one(backend: BackendKind, n: usize, radix: u32) -> Result<Sample, String> {
    let nodes: Vec<String> = (1..=n).map(|i| format!("n{i:04}")).collect();
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    let conf = PrteConf::new()
        .set("ClusterName", "bench")
        .set("DVMNodes", format!("n[4:1-{n}]"))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", radix);
    let mut spec = ClusterSpec::new("bench", &hosts, vec![PRTED.into(), "--bootstrap".into()]);
    spec.backend = backend;
    spec.ip = IpMode::V4;
    spec.conf = conf.render();
    spec.env.push(("DVMLAB_LOG".into(), "warn".into()));
    let mut cluster = Cluster::new(spec)?;
    let first = support::unix_ms();
    cluster.start_all()?;
    let last = support::unix_ms();
    let status = dvm::wait_formed(&cluster)?;
    let formed_at = status["formed_at_unix_ms"].as_u64().ok_or("no formed_at")?;
    let mut cpu = Vec::new();
    let mut rss = Vec::new();
    for h in &nodes {
        let pid = cluster.pid(h).ok_or("no pid")?;
        cpu.push(cpu_ns(pid).ok_or("no schedstat")? as f64 / 1e6);
        rss.push(peak_rss_kib(pid).ok_or("no VmHWM")? as f64 / 1024.0);
    }
    let ctl_pid = cluster.pid("ctl").ok_or("no controller pid")?;
    let sample = Sample {
        formed_ms: formed_at.saturating_sub(last),
        from_first_ms: formed_at.saturating_sub(first),
        floor_ms: 0.0,
        start_spread_ms: last - first,
        ctl_cpu_ms: cpu_ns(ctl_pid).unwrap_or(0) as f64 / 1e6,
        cpu_ms_mean: cpu.iter().sum::<f64>() / cpu.len() as f64,
        cpu_ms_max: cpu.iter().cloned().fold(0.0, f64::max),
        rss_mib_mean: rss.iter().sum::<f64>() / rss.len() as f64,
        rss_mib_max: rss.iter().cloned().fold(0.0, f64::max),
        ctl_rss_mib: peak_rss_kib(ctl_pid).unwrap_or(0) as f64 / 1024.0,
    };
    dvm::run(&cluster, PCTL, &["stop"])?;
    let floor_ms = support::floor::connect_ms(&cluster, "ctl", &hosts)?;
    cluster.destroy();
    Ok(Sample { floor_ms, ..sample })
}

fn median(mut v: Vec<Sample>) -> Sample {
    v.sort_by_key(|s| s.formed_ms);
    v.swap_remove(v.len() / 2)
}

fn main() {
    support::floor::serve_worker();
    let backend = support::backend();
    let sizes = support::sizes("DVMLAB_BENCH_SIZES", "8,32,128,512");
    let reps = support::reps(3);
    let radix: u32 = std::env::var("DVMLAB_BENCH_RADIX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    println!("DVM formation, daemons booted together ({backend:?} backend, radix {radix}, median of {reps})");
    println!("floor: as many processes started on the same hosts, each making one TCP connection to a process on ctl, from the first start until all are accepted; ratio = first start to formed / floor");
    println!(
        "{:>6} {:>15} {:>9} {:>6} {:>11} {:>12} {:>13} {:>13} {:>12} {:>12} {:>11} {:>10}",
        "nodes",
        "first->formed",
        "floor ms",
        "ratio",
        "formed ms",
        "start spread",
        "cpu ms/daemon",
        "cpu ms max",
        "rss MiB",
        "rss MiB max",
        "ctl cpu ms",
        "ctl MiB"
    );
    let mut rows = Vec::new();
    let mut samples_by_size = Vec::new();
    let mut misses = Vec::new();
    for &n in &sizes {
        let mut samples = Vec::new();
        for _ in 0..reps {
            match one(backend, n, radix) {
                Ok(s) => samples.push(s),
                Err(e) => {
                    eprintln!("n={n}: {e}");
                    std::process::exit(1);
                }
            }
        }
        let s = median(samples);
        println!(
            "{:>6} {:>15} {:>9.1} {:>6.2} {:>11} {:>12} {:>13.2} {:>13.2} {:>12.2} {:>12.2} {:>11.2} {:>10.2}",
            n,
            s.from_first_ms,
            s.floor_ms,
            s.from_first_ms as f64 / s.floor_ms.max(1e-6),
            s.formed_ms,
            s.start_spread_ms,
            s.cpu_ms_mean,
            s.cpu_ms_max,
            s.rss_mib_mean,
            s.rss_mib_max,
            s.ctl_cpu_ms,
            s.ctl_rss_mib
        );
        let limit = match n {
            32 => Some(300),
            512 => Some(3000),
            _ => None,
        };
        if let Some(l) = limit {
            if s.formed_ms > l {
                misses.push(format!(
                    "{n} nodes formed in {} ms (target {l} ms)",
                    s.formed_ms
                ));
            }
        }
        if s.cpu_ms_mean > 5.0 {
            misses.push(format!(
                "{n} nodes: {:.2} ms CPU per daemon (target 5 ms)",
                s.cpu_ms_mean
            ));
        }
        if s.rss_mib_max > 8.0 {
            misses.push(format!(
                "{n} nodes: {:.2} MiB peak RSS (target 8 MiB)",
                s.rss_mib_max
            ));
        }
        rows.push(json!({
            "nodes": n, "formed_ms": s.formed_ms, "start_spread_ms": s.start_spread_ms,
            "first_start_to_formed_ms": s.from_first_ms, "floor_ms": s.floor_ms,
            "ratio": s.from_first_ms as f64 / s.floor_ms.max(1e-6),
            "cpu_ms_mean": s.cpu_ms_mean, "cpu_ms_max": s.cpu_ms_max,
            "rss_mib_mean": s.rss_mib_mean, "rss_mib_max": s.rss_mib_max,
            "controller_cpu_ms": s.ctl_cpu_ms, "controller_rss_mib": s.ctl_rss_mib,
        }));
        samples_by_size.push((n as f64, s));
    }
    let xs: Vec<f64> = samples_by_size.iter().map(|(n, _)| *n).collect();
    let col = |f: fn(&Sample) -> f64| {
        samples_by_size
            .iter()
            .map(|(_, s)| f(s))
            .collect::<Vec<f64>>()
    };
    let svg = chart(
        &format!("DVM formation, daemons booted together ({backend:?} backend, radix {radix})"),
        &xs,
        &[
            Panel {
                title: "first start to formed, and the floor",
                unit: "ms",
                series: vec![
                    ("dvmlab", col(|s| s.from_first_ms as f64)),
                    ("floor", col(|s| s.floor_ms)),
                ],
                target: None,
            },
            Panel {
                title: "formed after last start",
                unit: "ms",
                series: vec![("median", col(|s| s.formed_ms as f64))],
                target: None,
            },
            Panel {
                title: "CPU per daemon",
                unit: "ms",
                series: vec![
                    ("mean", col(|s| s.cpu_ms_mean)),
                    ("max", col(|s| s.cpu_ms_max)),
                ],
                target: Some(5.0),
            },
            Panel {
                title: "peak RSS per daemon",
                unit: "MiB",
                series: vec![
                    ("mean", col(|s| s.rss_mib_mean)),
                    ("max", col(|s| s.rss_mib_max)),
                ],
                target: Some(8.0),
            },
        ],
    );
    let doc =
        json!({"backend": format!("{backend:?}"), "radix": radix, "reps": reps, "rows": rows});
    support::report(
        "32 nodes <= 300 ms, 512 <= 3000 ms, <= 5 ms CPU and <= 8 MiB RSS per non-controller daemon",
        &misses,
        "formation",
        Some(svg),
        &doc,
    );
}
