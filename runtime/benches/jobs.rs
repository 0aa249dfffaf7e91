//! `make bench`, jobs: on a formed DVM, the latency of a job of one `/bin/true` per node
//! (from starting `prun` to its exit, median of `DVMLAB_BENCH_REPS`, default 5) for 8, 32 and
//! 128 nodes (`DVMLAB_BENCH_JOB_SIZES`), and the rate of 200 sequential one-process jobs,
//! printed next to the DVM's formation time, against the targets. Backend as for the
//! formation bench (`DVMLAB_BACKEND`, default process), without a DVM key (the key's cost is
//! the `key` bench's). Writes `target/bench/jobs.json`.

mod support;

use std::time::Instant;

use dvmlab_harness::BackendKind;
use serde_json::json;
use support::dvm::{self, PRUN};

struct Row {
    nodes: usize,
    formed_ms: u64,
    job_ms: f64,
    seq_jobs_per_s: Option<f64>,
}

fn one(backend: BackendKind, n: usize, reps: usize, sequential: usize) -> Result<Row, String> {
    let (cluster, formed_ms) = dvm::formed("jobbench", backend, n, false)?;
    let job_ms = dvm::job_ms(&cluster, &["/bin/true"], reps)?;
    let seq_jobs_per_s = if sequential > 0 {
        let t = Instant::now();
        for _ in 0..sequential {
            dvm::run(&cluster, PRUN, &["-n", "1", "/bin/true"])?;
        }
        Some(sequential as f64 / t.elapsed().as_secs_f64())
    } else {
        None
    };
    dvm::stop(cluster)?;
    Ok(Row {
        nodes: n,
        formed_ms,
        job_ms,
        seq_jobs_per_s,
    })
}

fn main() {
    let backend = support::backend();
    let sizes = support::sizes("DVMLAB_BENCH_JOB_SIZES", "8,32,128");
    let reps = support::reps(5);
    println!("Jobs on a formed DVM ({backend:?} backend, radix 64; job latency = prun start to exit, median of {reps})");
    println!(
        "{:>6} {:>10} {:>22} {:>22}",
        "nodes", "formed ms", "job of /bin/true ms", "200 seq jobs, jobs/s"
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
        println!(
            "{:>6} {:>10} {:>22.1} {:>22}",
            r.nodes,
            r.formed_ms,
            r.job_ms,
            r.seq_jobs_per_s
                .map_or("-".to_string(), |v| format!("{v:.0}"))
        );
        let limit = match n {
            32 => Some(15.0),
            128 => Some(50.0),
            _ => None,
        };
        if let Some(l) = limit {
            if r.job_ms > l {
                misses.push(format!(
                    "{n} nodes: job took {:.1} ms (target {l} ms)",
                    r.job_ms
                ));
            }
        }
        if let Some(v) = r.seq_jobs_per_s {
            if v < 100.0 {
                misses.push(format!("{v:.0} sequential jobs per second (target 100)"));
            }
        }
        rows.push(json!({
            "nodes": r.nodes, "formed_ms": r.formed_ms, "job_ms": r.job_ms,
            "sequential_jobs_per_s": r.seq_jobs_per_s,
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
                series: vec![("median", samples.iter().map(|r| r.job_ms).collect())],
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
        "32 nodes <= 15 ms, 128 nodes <= 50 ms from submit to prun exit; >= 100 sequential one-process jobs/s",
        &misses,
        "jobs",
        Some(svg),
        &doc,
    );
}
