//! `make bench`, jobs: on a formed DVM, the latency of a job of one `/bin/true` per node
//! (from starting `prun` to its exit, median of `DVMLAB_BENCH_REPS`, default 5) for 8, 32 and
//! 128 nodes (`DVMLAB_BENCH_JOB_SIZES`), and the rate of 200 sequential one-process jobs,
//! each beside the machine's floor measured in the same run (as many spawns and waits of
//! `/bin/true`, over one worker process per core; for the sequential jobs, a worker that
//! starts one, one after another) and the ratio; the target is a ratio. Backend as for the formation bench
//! (`DVMLAB_BACKEND`, default process), without a DVM key (the key's cost is the `key`
//! bench's). Writes `target/bench/jobs.json`.

mod support;

use std::time::Instant;

use dvmlab_harness::BackendKind;
use serde_json::json;
use support::dvm::{self, PRUN};

struct Row {
    nodes: usize,
    formed_ms: u64,
    job_ms: f64,
    floor_ms: f64,
    /// Sequential one-process jobs per second, and the floor's rate.
    seq: Option<(f64, f64)>,
}

/// What the machine needs for the same work: the floor a job's ratio is taken against.
const TRUE: &str = "/bin/true";

/// The most a job may take beside its floor at the sizes with a target.
const RATIO_TARGET: f64 = 1.5;

fn one(backend: BackendKind, n: usize, reps: usize, sequential: usize) -> Result<Row, String> {
    let (cluster, formed_ms) = dvm::formed("jobbench", backend, n, false)?;
    let job_ms = dvm::job_ms(&cluster, &[TRUE], reps)?;
    let floor_ms = support::floor::spawn_ms(TRUE, n, reps)?;
    let seq = if sequential > 0 {
        let t = Instant::now();
        for _ in 0..sequential {
            dvm::run(&cluster, PRUN, &["-n", "1", TRUE])?;
        }
        let rate = sequential as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..sequential {
            support::floor::spawn_ms(TRUE, 1, 1)?;
        }
        Some((rate, sequential as f64 / t.elapsed().as_secs_f64()))
    } else {
        None
    };
    dvm::stop(cluster)?;
    Ok(Row {
        nodes: n,
        formed_ms,
        job_ms,
        floor_ms,
        seq,
    })
}

fn main() {
    support::floor::serve_worker();
    let backend = support::backend();
    let sizes = support::sizes("DVMLAB_BENCH_JOB_SIZES", "8,32,128");
    let reps = support::reps(5);
    println!("Jobs on a formed DVM ({backend:?} backend, radix 64; job latency = prun start to exit, median of {reps})");
    println!(
        "floor: the same number of /bin/true spawned and waited for over {} worker processes (one per core); for the sequential jobs, one worker starting one /bin/true at a time (two starts, as prun and its process are)",
        support::floor::cores()
    );
    println!(
        "{:>6} {:>10} {:>12} {:>10} {:>7} {:>16} {:>16} {:>7}",
        "nodes", "formed ms", "job ms", "floor ms", "ratio", "seq jobs/s", "floor jobs/s", "ratio"
    );
    let mut rows = Vec::new();
    let mut samples = Vec::new();
    let mut misses = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        // The sequential series runs once, on the smallest DVM.
        let seq = if i == 0 { 200 } else { 0 };
        let r = match one(backend, n, reps, seq) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("n={n}: {e}");
                std::process::exit(1);
            }
        };
        let ratio = r.job_ms / r.floor_ms.max(1e-6);
        let (seq, seq_floor, seq_ratio) = match r.seq {
            Some((v, f)) => (
                format!("{v:.0}"),
                format!("{f:.0}"),
                format!("{:.2}", f / v.max(1e-6)),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:>6} {:>10} {:>12.1} {:>10.1} {:>7.2} {:>16} {:>16} {:>7}",
            r.nodes, r.formed_ms, r.job_ms, r.floor_ms, ratio, seq, seq_floor, seq_ratio
        );
        if matches!(n, 32 | 128) && ratio > RATIO_TARGET {
            misses.push(format!(
                "{n} nodes: the job took {:.1} ms, {ratio:.2}x the floor's {:.1} ms (target {RATIO_TARGET}x)",
                r.job_ms, r.floor_ms
            ));
        }
        rows.push(json!({
            "nodes": r.nodes, "formed_ms": r.formed_ms, "job_ms": r.job_ms,
            "floor_ms": r.floor_ms, "ratio": ratio,
            "sequential_jobs_per_s": r.seq.map(|s| s.0),
            "sequential_floor_per_s": r.seq.map(|s| s.1),
        }));
        samples.push(r);
    }
    let xs: Vec<f64> = samples.iter().map(|r| r.nodes as f64).collect();
    let svg = support::svg::chart(
        &format!("Jobs on a formed DVM ({backend:?} backend, radix 64)"),
        &xs,
        &[
            support::svg::Panel {
                title: "prun /bin/true per node, start to exit",
                unit: "ms",
                series: vec![
                    ("dvmlab", samples.iter().map(|r| r.job_ms).collect()),
                    ("floor", samples.iter().map(|r| r.floor_ms).collect()),
                ],
                target: None,
            },
            support::svg::Panel {
                title: "DVM formed after last start",
                unit: "ms",
                series: vec![(
                    "formation",
                    samples.iter().map(|r| r.formed_ms as f64).collect(),
                )],
                target: None,
            },
        ],
    );
    let doc = json!({"backend": format!("{backend:?}"), "reps": reps, "rows": rows});
    support::report(
        "a job of one /bin/true per node within 1.5x of the floor at 32 and 128 nodes",
        &misses,
        "jobs",
        Some(svg),
        &doc,
    );
}
