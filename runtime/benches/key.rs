//! `make bench`, the DVM key's cost: the same DVM formed and running jobs with a key and
//! without one, alternated in one run on the same hosts (`DVMLAB_BENCH_REPS` DVMs of each,
//! default 5; sizes `DVMLAB_BENCH_KEY_SIZES`, default 8,32). Formation: from the last daemon
//! started to formed; job: a `/bin/true` per node, `prun` start to exit, median of 9 per DVM.
//! Prints both, and the ratio, against the goal (the key costs at most 10 % at 32 nodes).
//! Writes `target/bench/key.{json,svg}`.

mod support;

use dvmlab_bench::plot::{Panel, Series};
use dvmlab_bench::stats::median;
use serde_json::json;
use support::dvm;

/// Medians over the DVMs of one kind: formation ms, job ms.
fn measure(
    backend: dvmlab_harness::BackendKind,
    n: usize,
    reps: usize,
) -> Result<[(f64, f64); 2], String> {
    let mut samples: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for _ in 0..reps {
        for (i, keyed) in [false, true].into_iter().enumerate() {
            let (cluster, formed_ms) = dvm::formed("keybench", backend, n, keyed)?;
            let job = dvm::job_ms(&cluster, &["/bin/true"], 9)?;
            dvm::stop(cluster)?;
            samples[i].0.push(formed_ms as f64);
            samples[i].1.push(job);
        }
    }
    Ok(samples.map(|(f, j)| (median(&f), median(&j))))
}

fn main() {
    let backend = support::backend();
    let sizes = support::sizes("DVMLAB_BENCH_KEY_SIZES", "8,32");
    let reps = support::reps(5);
    println!(
        "The DVM key's cost ({backend:?} backend, radix 64; medians of {reps} DVMs each, alternated)"
    );
    println!(
        "{:>6} {:>13} {:>13} {:>7} {:>13} {:>13} {:>7}",
        "nodes", "formed no key", "formed key", "ratio", "job no key", "job key", "ratio"
    );
    let mut rows = Vec::new();
    let mut table = support::Table {
        caption: format!(
            "The DVM key's cost ({backend:?} backend, radix 64): the same DVM formed and running a job of `/bin/true` per node, with the key and without it, alternated in one run (medians of {reps} DVMs of each)"
        ),
        header: vec![
            "nodes",
            "formed after the last start, no key",
            "with the key",
            "ratio",
            "job, no key",
            "with the key",
            "ratio",
        ],
        rows: Vec::new(),
    };
    let mut misses = Vec::new();
    let (mut xs, mut form, mut job) = (
        Vec::new(),
        [Vec::new(), Vec::new()],
        [Vec::new(), Vec::new()],
    );
    for &n in &sizes {
        let [(f0, j0), (f1, j1)] = match measure(backend, n, reps) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("n={n}: {e}");
                std::process::exit(1);
            }
        };
        let (fr, jr) = (f1 / f0.max(1.0), j1 / j0);
        println!(
            "{n:>6} {f0:>10.0} ms {f1:>10.0} ms {fr:>7.2} {j0:>10.1} ms {j1:>10.1} ms {jr:>7.2}"
        );
        if n == 32 {
            for (what, r) in [("formation", fr), ("job", jr)] {
                if r > 1.10 {
                    misses.push(format!(
                        "32 nodes: the key costs {what} {:.0} %",
                        (r - 1.0) * 100.0
                    ));
                }
            }
        }
        table.rows.push(vec![
            n.to_string(),
            format!("{f0:.0} ms"),
            format!("{f1:.0} ms"),
            format!("{fr:.2}"),
            format!("{j0:.1} ms"),
            format!("{j1:.1} ms"),
            format!("{jr:.2}"),
        ]);
        rows.push(json!({
            "nodes": n,
            "formed_ms": {"no_key": f0, "key": f1, "ratio": fr},
            "job_ms": {"no_key": j0, "key": j1, "ratio": jr},
        }));
        xs.push(n as f64);
        form[0].push(f0);
        form[1].push(f1);
        job[0].push(j0);
        job[1].push(j1);
    }
    let [f_plain, f_key] = form;
    let [j_plain, j_key] = job;
    let line = |name: &str, ys: Vec<f64>| Series {
        name: name.into(),
        points: xs.iter().copied().zip(ys).collect(),
        reference: false,
    };
    let panels = vec![
        Panel {
            title: "DVM formed after last start".into(),
            unit: "ms".into(),
            series: vec![line("no key", f_plain), line("key", f_key)],
        },
        Panel {
            title: "prun /bin/true per node, start to exit".into(),
            unit: "ms".into(),
            series: vec![line("no key", j_plain), line("key", j_key)],
        },
    ];
    let title = format!("The DVM key's cost ({backend:?} backend, radix 64)");
    let doc = json!({"backend": format!("{backend:?}"), "reps": reps, "rows": rows});
    support::report(
        "with the key, formation and a job at 32 nodes take at most 10 % longer than without",
        &misses,
        "key",
        &[table],
        Some((&title, panels)),
        &doc,
    );
}
